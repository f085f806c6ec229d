"""Graph classification as a session of the one training loop.

**Graph classification** (``task="graph"``): a :class:`~ngra.datasets.GraphDataset`
(``tu:PATH``, ``ogbg:PATH``, ``from_pyg_list``) split into train/val/test graphs
(:func:`graph_parts`: the dataset's own split when it carries one, an OGB folder's, else
at random by seed);
batches of ``batch_size`` graphs are one block-diagonal graph each
(:class:`~ngra.datasets.GraphLoader`, reshuffled every epoch from ``(seed, epoch)``); the
encoder's node embeddings are read out per graph (``readout``: sum, mean, max,
attention) and a Linear gives class scores. Loss cross-entropy, metric accuracy.
On several processes each rank takes a slice of every batch
(:mod:`ngra.training.graph_ranks`).

**Binary tasks** (``ds.task_type == "binary"``: OGB's ogbg-molhiv, -molpcba, ``y``
``[G, T]`` with NaN for a missing label): the head gives ``T`` logits; the loss is
binary cross-entropy with logits averaged over the batch's **labeled** entries only
(:func:`loss_sum`; a batch without one contributes 0, not NaN), as OGB's examples
train; the metric is the dataset's (``ds.metric``: ``roc_auc`` or ``ap``), computed as
OGB's evaluator does from every graph's scores of a part
(:func:`ngra.metrics.mean_over_tasks`). A part in which no task has both a positive and
a negative label has no value: it is NaN (never selected) and a warning says so, once
per part. The summary's ``metrics`` holds both ``roc_auc`` and ``ap`` of every part.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ngra.datasets import GraphDataset, GraphLoader, from_pyg_list, load
from ngra.errors import DatasetError
from ngra.metrics import TASK_METRICS, mean_over_tasks
from ngra.models import AttentionPool, readout
from ngra.runtime.explain import explain
from ngra.training.config import READOUTS, TrainConfig
from ngra.training.model_source import call_model
from ngra.training.task_base import TaskSession

__all__ = ["GraphModel", "GraphSession", "accuracies", "graph_dataset", "graph_model",
           "graph_parts", "loss_sum", "split_graphs"]

log = logging.getLogger(__name__)


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


def loss_sum(out: torch.Tensor, y: torch.Tensor, task_type: str) -> tuple[torch.Tensor, int]:
    """The loss summed over a batch and what it was summed over: ``(cross-entropy sum,
    graphs)`` for a multiclass dataset, ``(BCE-with-logits sum over the labeled entries,
    labeled entries)`` for a binary one (``y`` ``[B, T]``, NaN missing). The batch's loss
    is the sum divided by the count (by 1 when it is 0: a sum over nothing is 0)."""
    if task_type != "binary":
        return F.cross_entropy(out, y, reduction="sum"), int(y.numel())
    labeled = ~torch.isnan(y)
    return (F.binary_cross_entropy_with_logits(out[labeled], y[labeled], reduction="sum"),
            int(labeled.sum()))


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


def graph_parts(ds: GraphDataset, val: float, test: float,
                seed: int) -> dict[str, np.ndarray]:
    """``{"train", "val", "test"}`` -> graph ids: the dataset's own split when it carries
    one (``ds.split``; ``val`` and ``test`` are then not used), else
    :func:`split_graphs` ``(len(ds), val, test, seed)``."""
    if ds.split is None:
        return dict(zip(("train", "val", "test"), split_graphs(len(ds), val, test, seed)))
    parts = {k: ds.split[k].numpy() for k in ("train", "val", "test")}
    if parts["train"].size == 0:
        raise DatasetError(f"{ds.name}: its split ({ds.info.get('split')}) has no training "
                           "graphs; a graph classifier needs some.")
    log.info("%s: the dataset's own split (%s): %s graphs", ds.name, ds.info.get("split"),
             {k: int(v.size) for k, v in parts.items()})
    return parts


class GraphSession(TaskSession):
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
        self.name, self.task_type, self.metric = ds.name, ds.task_type, ds.metric
        self.undefined: set[str] = set()  # parts already warned of a metric without value

    def batches(self, epoch: int) -> Iterable[Any]:
        self.train_loader.set_epoch(epoch)
        return iter(self.train_loader)

    def forward(self, batch: Any) -> torch.Tensor:
        return self.model(batch.graph, batch.x, batch.ptr)

    def loss(self, out: torch.Tensor, batch: Any) -> tuple[torch.Tensor, float]:
        total, count = loss_sum(out, batch.y, self.task_type)
        loss = total / max(count, 1)
        return loss, float(loss.detach())

    @torch.no_grad()
    def evaluate(self) -> tuple[dict[str, float], float]:
        if self.task_type == "binary":
            return self.scored(self.outputs())
        return accuracies(self.counts())

    @torch.no_grad()
    def outputs(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per part, ``(scores [G_part, T], labels [G_part, T])`` over :attr:`eval_loaders`."""
        self.model.eval()
        out = {}
        for part, loader in self.eval_loaders.items():
            scores, labels = [], []
            with self.context():
                for batch in loader:
                    scores.append(self.model(batch.graph, batch.x, batch.ptr).float())
                    labels.append(batch.y)
            width = self.net.head.out_features
            out[part] = (torch.cat(scores) if scores else torch.empty(0, width),
                         torch.cat(labels) if labels else torch.empty(0, width))
        return out

    def scored(self, outputs: dict[str, tuple[torch.Tensor, torch.Tensor]]
               ) -> tuple[dict[str, float], float]:
        """The metric of each part from its scores and labels (:meth:`outputs`, all of a
        part's graphs), both OGB metrics into :attr:`last_metrics`, and the validation
        loss (mean BCE over its labeled entries)."""
        values = {}
        for part, (scores, labels) in outputs.items():
            for name in TASK_METRICS:
                try:
                    value = mean_over_tasks(labels, scores, name)[0]
                except ValueError:
                    value = math.nan
                self.last_metrics[f"{part}_{name}"] = value
            values[part] = self.last_metrics[f"{part}_{self.metric}"]
            if math.isnan(values[part]) and part not in self.undefined and self.is_main:
                self.undefined.add(part)
                log.warning("%s: no task has both a positive and a negative label among the "
                            "%d %s graphs, so their %s is NaN (OGB's evaluator raises); give "
                            "that part more graphs", self.name, labels.shape[0], part,
                            self.metric)
        scores, labels = outputs.get("val", (torch.empty(0, 1), torch.empty(0, 1)))
        total, count = loss_sum(scores, labels, "binary")
        return values, float(total) / count if count else math.nan

    @torch.no_grad()
    def counts(self) -> dict[str, list[float]]:
        """Per part, ``[correct, graphs, cross-entropy sum]`` over :attr:`eval_loaders`."""
        self.model.eval()
        counts = {}
        for part, loader in self.eval_loaders.items():
            c = [0.0, 0.0, 0.0]
            with self.context():
                for batch in loader:
                    out = self.model(batch.graph, batch.x, batch.ptr)
                    c[0] += int((out.argmax(-1) == batch.y).sum())
                    c[1] += batch.num_graphs
                    c[2] += float(F.cross_entropy(out, batch.y, reduction="sum"))
            counts[part] = c
        return counts

    def explain(self) -> str:
        with self.context():
            return explain(self.model.encoder, self.graph, self.x)


def accuracies(counts: dict[str, list[float]]) -> tuple[dict[str, float], float]:
    """The accuracy of each part and the validation loss from :meth:`GraphSession.counts`
    (``nan`` for a part without graphs)."""
    acc = {part: c[0] / c[1] if c[1] else math.nan for part, c in counts.items()}
    val = counts.get("val", [0.0, 0.0, 0.0])
    return acc, val[2] / val[1] if val[1] else math.nan


def graph_model(cfg: TrainConfig, num_features: int, num_classes: int) -> GraphModel:
    """A fresh :class:`GraphModel` of ``cfg``: its encoder ``cfg.embedding_dim`` wide,
    ``cfg.readout``, a head to ``num_classes`` outputs (a dataset's ``num_outputs``: its
    classes, or one logit per binary task)."""
    r = cfg.resolved()
    encoder = cfg.source.build(num_features, cfg.embedding_dim, hyper=r,
                               num_layers=r["num_layers"])
    return GraphModel(encoder, cfg.embedding_dim, num_classes, cfg.readout)


def graph_dataset(data: Any, root: str | None = None) -> GraphDataset:
    """The graphs of a graph-classification run: a spec (``tu:PATH``, ``ogbg:PATH``), a
    :class:`~ngra.datasets.GraphDataset`, or a list of PyG ``Data``."""
    if isinstance(data, str):
        ds = load(data, root=root)
    elif isinstance(data, (list, tuple)):
        ds = from_pyg_list(list(data))
    else:
        ds = data
    if not isinstance(ds, GraphDataset):
        raise DatasetError(f"task graph classifies a collection of graphs (tu:PATH, "
                           f"ogbg:PATH, a GraphDataset, a list of PyG Data); {data!r} is one graph "
                           f"({type(ds).__name__}). Use task node or link for it.")
    if len(ds) < 3:
        raise DatasetError(f"task graph needs at least 3 graphs (train, val, test); "
                           f"{data!r} has {len(ds)}.")
    return ds
