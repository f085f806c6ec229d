"""Link prediction and graph classification as sessions of the one training loop.

A task supplies what :func:`ngra.training.loop.fit` asks of a session: the batches of an
epoch, a forward and a loss for each, and an evaluation that returns the task's metric
on the training, validation and test parts (the loop selects the epoch with the best
validation value, as it does for node accuracy). Node classification is
:class:`ngra.training.loop.Session` itself.

**Link prediction** (``task="link"``): the dataset's edges are split
(:func:`ngra.datasets.split_edges`: message-passing edges, training supervision pairs,
validation and test positives with fixed negatives; both directions of a held-out
undirected edge leave the message-passing graph). The model is a node **encoder** (a zoo
model or your factory, built with ``embedding_dim`` outputs) run full-graph on the
message-passing graph, and a **decoder** (``dot`` or ``mlp`` on the Hadamard product,
:mod:`ngra.models.decoders`) scores pairs in chunks. Each epoch draws its own uniform
negatives, one per supervision pair, seeded by ``(seed, epoch)``
(:func:`ngra.datasets.sample_negatives`). The loss is binary cross-entropy; the metric
ROC-AUC, with Hits@20/50/100 (OGB's definition, :mod:`ngra.metrics`) reported beside it.

**Graph classification** (``task="graph"``): a :class:`~ngra.datasets.GraphDataset`
(``tu:PATH``, ``from_pyg_list``) split at random into train/val/test graphs by seed;
batches of ``batch_size`` graphs are one block-diagonal graph each
(:class:`~ngra.datasets.GraphLoader`, reshuffled every epoch from ``(seed, epoch)``); the
encoder's node embeddings are read out per graph (``readout``: sum, mean, max,
attention) and a Linear gives class scores. Loss cross-entropy, metric accuracy.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ngra.datasets import (GraphDataset, GraphLoader, NodeDataset, from_pyg_list, load,
                           split_edges)
from ngra.datasets.linksplit import LinkSplit
from ngra.errors import DatasetError
from ngra.memstat import io_read_bytes
from ngra.metrics import hits_at_k, roc_auc
from ngra.models import AttentionPool, DotDecoder, HadamardMLPDecoder, readout
from ngra.runtime.budget import memory_budget
from ngra.runtime.explain import explain
from ngra.training.config import DECODERS, READOUTS, TrainConfig
from ngra.training.model_source import call_model

__all__ = ["GraphModel", "GraphSession", "LinkModel", "LinkSession", "graph_dataset",
           "link_split", "make_decoder", "split_graphs"]

#: Hits@K reported for link prediction (OGB's ogbl-collab/ppa/ddi Ks).
HITS_KS = (20, 50, 100)


class LinkModel(nn.Module):
    """A node encoder and a pair decoder; ``forward(graph, x[, edge_data])`` embeds."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module) -> None:
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, graph: Any, x: torch.Tensor, edge_data: Any = None) -> torch.Tensor:
        return call_model(self.encoder, graph, x, edge_data)


def make_decoder(name: str, dim: int) -> nn.Module:
    if name == "dot":
        return DotDecoder()
    if name == "mlp":
        return HadamardMLPDecoder(dim, dim)
    raise ValueError(f"decoder must be one of {DECODERS}; got {name!r}.")


class GraphModel(nn.Module):
    """A node encoder, a per-graph readout and a Linear head:
    ``forward(graph, x, ptr) -> [B, C]`` class scores."""

    def __init__(self, encoder: nn.Module, dim: int, num_classes: int,
                 kind: str = "sum") -> None:
        super().__init__()
        if kind not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS}; got {kind!r}.")
        self.encoder, self.kind = encoder, kind
        self.pool = AttentionPool(dim) if kind == "attention" else None
        self.head = nn.Linear(dim, num_classes)

    def forward(self, graph: Any, x: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
        h = call_model(self.encoder, graph, x)
        pooled = self.pool(h, ptr) if self.pool is not None else readout(h, ptr, self.kind)
        return self.head(pooled)


class _TaskSession:
    """What link and graph sessions share with the node session's interface."""

    is_main = True
    placement = None

    def __init__(self, model: nn.Module, budget: str | None, info: dict[str, Any]) -> None:
        self.model = model
        self.budget = budget
        self.device = torch.device("cpu")
        self.info = dict(info)
        self.read_start = io_read_bytes()

    def context(self) -> Any:
        return memory_budget(self.budget) if self.budget else contextlib.nullcontext()

    def capture_refusal(self) -> str | None:
        return f"a {self.task} task trains in eager steps (no CUDA graph)"

    def after_backward(self) -> None:
        """Nothing to sum over ranks: one process."""

    def step_begin(self) -> None:
        """Nothing to count."""

    def step_done(self) -> None:
        """Nothing to count."""

    def extra(self, times: list[float]) -> dict[str, Any]:
        return {"device": str(self.device), **self.info,
                "disk_read_mb": (io_read_bytes() - self.read_start) / 2**20,
                "placement": "cpu: host memory"}


class LinkSession(_TaskSession):
    """Link prediction over a :class:`~ngra.datasets.linksplit.LinkSplit` (module docstring)."""

    task = "link"
    metric = "roc_auc"

    def __init__(self, model: LinkModel, split: LinkSplit, graph: Any, x: torch.Tensor,
                 edge_data: Any, *, seed: int, budget: str | None,
                 info: dict[str, Any]) -> None:
        super().__init__(model, budget, info)
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
        neg = self.split.train_negatives(int(epoch or 0), seed=self.seed)
        loss = _pair_loss(self.model.decoder, z, self.split.train_pos, neg)
        return loss, float(loss.detach())

    @torch.no_grad()
    def evaluate(self) -> tuple[dict[str, float], float]:
        self.model.eval()
        with self.context():
            z = call_model(self.net, self.graph, self.x, self.edge_data)
        dec = self.model.decoder
        s = self.split
        out: dict[str, float] = {"train": float("nan")}
        for part, pos, neg in (("val", s.val_pos, s.val_neg), ("test", s.test_pos, s.test_neg)):
            if pos.shape[1] == 0 or neg is None or neg.shape[1] == 0:
                out[part] = float("nan")
                continue
            p, n = dec(z, pos), dec(z, neg)
            out[part] = roc_auc(p, n)
            for k in HITS_KS:
                self.last_metrics[f"{part}_hits@{k}"] = hits_at_k(p, n, k)
            self.last_metrics[f"{part}_roc_auc"] = out[part]
        val_loss = (float(_pair_loss(dec, z, s.val_pos, s.val_neg))
                    if s.val_pos.shape[1] and s.val_neg is not None else float("nan"))
        return out, val_loss

    def explain(self) -> str:
        with self.context():
            return explain(self.net, self.graph, self.x, self.edge_data)


def _pair_loss(decoder: nn.Module, z: torch.Tensor, pos: torch.Tensor,
               neg: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of positive pairs (label 1) and negative pairs (label 0)."""
    scores = torch.cat([decoder(z, pos), decoder(z, neg)])
    labels = torch.cat([scores.new_ones(pos.shape[1]), scores.new_zeros(neg.shape[1])])
    return F.binary_cross_entropy_with_logits(scores, labels)


def split_graphs(num_graphs: int, val: float, test: float,
                 seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random ``(train, val, test)`` split of graph ids, from ``seed``."""
    if not (0 <= val < 1 and 0 <= test < 1 and val + test < 1):
        raise ValueError(f"val and test must be fractions in [0, 1) summing below 1; got "
                         f"val={val}, test={test}.")
    order = np.random.default_rng(seed).permutation(num_graphs)
    n_val, n_test = round(val * num_graphs), round(test * num_graphs)
    if num_graphs - n_val - n_test < 1:
        raise ValueError(f"{num_graphs} graphs leave none to train on with val={val}, "
                         f"test={test}.")
    return (np.sort(order[n_val + n_test:]), np.sort(order[:n_val]),
            np.sort(order[n_val:n_val + n_test]))


class GraphSession(_TaskSession):
    """Graph classification over a :class:`~ngra.datasets.GraphDataset` (module docstring)."""

    task = "graph"
    metric = "accuracy"

    def __init__(self, model: GraphModel, ds: GraphDataset, parts: dict[str, np.ndarray], *,
                 batch_size: int, seed: int, budget: str | None,
                 info: dict[str, Any]) -> None:
        super().__init__(model, budget, info)
        self.net, self.encoder = model, model.encoder
        self.parts = {k: ds.subset(v) for k, v in parts.items()}
        self.train_loader = GraphLoader(self.parts["train"], batch_size, shuffle=True,
                                        seed=seed)
        self.eval_loaders = {k: GraphLoader(d, batch_size) for k, d in self.parts.items()}
        self.num_nodes, self.num_edges = int(ds.node_ptr[-1]), int(ds.indices.numel())
        first = next(iter(GraphLoader(ds, min(batch_size, len(ds)))))
        self.graph, self.x, self.edge_data = first.graph, first.x, None  # for explain
        self.last_metrics: dict[str, float] = {}

    def batches(self, epoch: int) -> Iterable[Any]:
        self.train_loader.set_epoch(epoch)
        return iter(self.train_loader)

    def forward(self, batch: Any) -> torch.Tensor:
        return self.model(batch.graph, batch.x, batch.ptr)

    def loss(self, out: torch.Tensor, batch: Any) -> tuple[torch.Tensor, float]:
        loss = F.cross_entropy(out, batch.y)
        return loss, float(loss.detach())

    @torch.no_grad()
    def evaluate(self) -> tuple[dict[str, float], float]:
        self.model.eval()
        acc, val_loss = {}, float("nan")
        for part, loader in self.eval_loaders.items():
            correct = total = 0
            loss_sum = 0.0
            with self.context():
                for batch in loader:
                    out = self.model(batch.graph, batch.x, batch.ptr)
                    correct += int((out.argmax(-1) == batch.y).sum())
                    total += batch.num_graphs
                    loss_sum += float(F.cross_entropy(out, batch.y, reduction="sum"))
            acc[part] = correct / total if total else float("nan")
            if part == "val":
                val_loss = loss_sum / total if total else math.nan
        return acc, val_loss

    def explain(self) -> str:
        with self.context():
            return explain(self.model.encoder, self.graph, self.x)


def graph_dataset(data: Any, root: str | None = None) -> GraphDataset:
    """The graphs of a graph-classification run: a spec (``tu:PATH``), a
    :class:`~ngra.datasets.GraphDataset`, or a list of PyG ``Data``."""
    if isinstance(data, str):
        ds = load(data, root=root)
    elif isinstance(data, (list, tuple)):
        ds = from_pyg_list(list(data))
    else:
        ds = data
    if not isinstance(ds, GraphDataset):
        raise DatasetError(f"task graph classifies a collection of graphs (tu:PATH, a "
                           f"GraphDataset, a list of PyG Data); {data!r} is one graph "
                           f"({type(ds).__name__}). Use task node or link for it.")
    if len(ds) < 3:
        raise DatasetError(f"task graph needs at least 3 graphs (train, val, test); "
                           f"{data!r} has {len(ds)}.")
    return ds


def link_split(cfg: TrainConfig, ds: NodeDataset) -> LinkSplit:
    """The edge split of a link-prediction run (``val``/``test`` fractions, ``seed``)."""
    return split_edges(ds, val=cfg.val, test=cfg.test, seed=cfg.seed)
