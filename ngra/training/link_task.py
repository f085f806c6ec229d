"""Link prediction as a session of the one training loop.

**Link prediction** (``task="link"``): the dataset's edges are split
(:func:`ngra.datasets.split_edges`: message-passing edges, training supervision pairs,
validation and test positives with fixed negatives; both directions of a held-out
undirected edge leave the message-passing graph). The model is a node **encoder** (a zoo
model or your factory, built with ``embedding_dim`` outputs) run full-graph on the
message-passing graph, and a **decoder** (``dot`` or ``mlp`` on the Hadamard product,
:mod:`ngra.models.decoders`) scores pairs in chunks. Each epoch draws its own negatives,
one per supervision pair, seeded by ``(seed, epoch)``
(:func:`ngra.datasets.sample_negatives`): uniform, or with ``negatives="degree"`` in
proportion to ``degree ** 0.75`` (word2vec's unigram distribution; harder negatives on
power-law graphs). On several processes each rank scores the pairs whose destination
it owns (:mod:`ngra.training.link_ranks`). The loss is binary cross-entropy; the metric
ROC-AUC, with Hits@20/50/100 (OGB's definition, :mod:`ngra.metrics`) reported beside it.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from ngra.datasets import NodeDataset, degree_weights, split_edges
from ngra.datasets.linksplit import LinkSplit
from ngra.errors import DatasetError
from ngra.metrics import hits_at_k, roc_auc
from ngra.models import DistMultDecoder, DotDecoder, HadamardMLPDecoder
from ngra.models.decoders import bce_of_scores
from ngra.runtime.explain import explain
from ngra.training.config import DECODERS, TrainConfig
from ngra.training.model_source import call_model
from ngra.training.task_base import TaskSession

__all__ = ["LinkModel", "LinkSession", "link_metrics", "link_split", "make_decoder"]

#: Hits@K reported for link prediction (OGB's ogbl-collab/ppa/ddi Ks).
HITS_KS = (20, 50, 100)


class LinkModel(nn.Module):
    """A node encoder and a pair decoder; ``forward(graph, x[, edge_data])`` embeds."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, graph: Any, x: torch.Tensor, edge_data: Any = None) -> torch.Tensor:
        return call_model(self.encoder, graph, x, edge_data)


def make_decoder(name: str, dim: int, num_relations: int = 1) -> nn.Module:
    if name == "dot":
        return DotDecoder()
    if name == "mlp":
        return HadamardMLPDecoder(dim, dim)
    if name == "distmult":
        return DistMultDecoder(dim, num_relations)
    raise ValueError(f"decoder must be one of {DECODERS}; got {name!r}.")


class LinkSession(TaskSession):
    """Link prediction over a :class:`~ngra.datasets.linksplit.LinkSplit` (module docstring)."""

    task = "link"
    metric = "roc_auc"

    def __init__(self, model: LinkModel, split: LinkSplit, graph: Any, x: torch.Tensor,
                 edge_data: Any, *, seed: int, budget: str | None, info: dict[str, Any],
                 negatives: str = "uniform") -> None:
        super().__init__(model, budget, info)
        self.kind = negatives
        self.degrees = degree_weights(split.graph) if negatives == "degree" else None
        self.net = self.encoder = model.encoder
        self.split, self.graph, self.x, self.edge_data = split, graph, x, edge_data
        self.seed = seed
        self.num_nodes, self.num_edges = split.num_nodes, split.graph.num_edges
        self.last_metrics: dict[str, float] = {}

    def batches(self, epoch: int) -> Iterable[Any]:
        return (epoch,)  # one full-graph step, its negatives drawn for this epoch

    def forward(self, batch: Any) -> torch.Tensor:
        return call_model(self.net, self.graph, self.x, self.edge_data)

    def loss(self, z: torch.Tensor, epoch: Any = 0) -> tuple[torch.Tensor, float]:
        s = self.split
        typed = s.train_rel is not None  # each negative's index gives its relation
        got = s.train_negatives(int(epoch or 0), seed=self.seed, kind=self.kind,
                                degrees=self.degrees, return_index=typed)
        neg, rel = (got[0], s.negative_relations(got[1])) if typed else (got, None)
        total = self.model.decoder.bce_sum(z, s.train_pos, neg, s.train_rel, rel)
        loss = total / max(s.train_pos.shape[1] + neg.shape[1], 1)
        return loss, float(loss.detach())

    @torch.no_grad()
    def evaluate(self) -> tuple[dict[str, float], float]:
        self.model.eval()
        with self.context():
            z = call_model(self.net, self.graph, self.x, self.edge_data)
        dec = self.model.decoder
        s = self.split
        scores = {}
        for part, pos, neg, prel, nrel in (
                ("val", s.val_pos, s.val_neg, s.val_rel, s.val_neg_rel),
                ("test", s.test_pos, s.test_neg, s.test_rel, s.test_neg_rel)):
            if pos.shape[1] and neg is not None and neg.shape[1]:
                scores[part] = (dec(z, pos, prel), dec(z, neg, nrel))
        return link_metrics(scores, self.last_metrics)

    def explain(self) -> str:
        with self.context():
            return explain(self.net, self.graph, self.x, self.edge_data)


def link_metrics(scores: dict[str, tuple[torch.Tensor, torch.Tensor]],
                 metrics: dict[str, float]) -> tuple[dict[str, float], float]:
    """ROC-AUC of each part's ``(positive, negative)`` scores (``nan`` for a part without
    both), Hits@K and ROC-AUC into ``metrics``, and the validation BCE: what a link
    session's ``evaluate`` returns, on one process and on ranks (all scores gathered)."""
    out: dict[str, float] = {"train": float("nan")}
    val_loss = float("nan")
    for part in ("val", "test"):
        p, n = scores.get(part, (None, None))
        if p is None or p.numel() == 0 or n.numel() == 0:
            out[part] = float("nan")
            continue
        out[part] = roc_auc(p, n)
        for k in HITS_KS:
            metrics[f"{part}_hits@{k}"] = hits_at_k(p, n, k)
        metrics[f"{part}_roc_auc"] = out[part]
        if part == "val":
            val_loss = float(bce_of_scores(p, n)) / (p.numel() + n.numel())
    return out, val_loss


def link_split(cfg: TrainConfig, ds: NodeDataset) -> LinkSplit:
    """The edge split of a link-prediction run (``val``/``test`` fractions, ``seed``); by
    relation for the ``distmult`` decoder, which scores typed pairs."""
    typed = cfg.decoder == "distmult"
    if typed and ds.edge_type is None:
        raise DatasetError(f"--decoder distmult scores typed pairs (u, relation, v); "
                           f"{cfg.dataset_name} has no edge types. Use a dataset with "
                           "edge_type (e.g. sbm:...,edge_types=3), or --decoder dot or mlp.")
    return split_edges(ds, val=cfg.val, test=cfg.test, seed=cfg.seed, by_relation=typed)
