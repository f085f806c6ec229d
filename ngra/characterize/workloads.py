"""Datasets and models for characterization runs, the same math in every framework.

A :class:`Workload` is one dataset prepared for one zoo model: the graph after
:func:`ngra.models.prepare` (GCN's normalized weights with self-loops, GAT's
self-loops, edge types and relation norms for GG-NN / R-GCN). Every framework
runs on exactly these edges, in destination-sorted (CSC) order, with these
edge weights and types, so the only difference between frameworks is how they
compute. Normalizations and self-loops are prepared once, outside the timed
region, for every framework (PyG's ``GCNConv(normalize=False)`` and
``GATConv(add_self_loops=False)``, DGL's ``GraphConv(norm="none")`` with the
same edge weights).

Datasets without edge types get three deterministic types for GG-NN and
R-GCN: ``hash(min(u, v), max(u, v)) mod 3`` over each edge's endpoints
(:func:`synthetic_edge_types`), so both directions of an undirected edge share
a type and every framework sees the same types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ngra.characterize.metrics import LayerDims, layer_dims
from ngra.graph import Graph
from ngra.models import prepare
from ngra.models import build_model

__all__ = ["Workload", "prepare_workload", "build_ngra", "synthetic_edge_types",
           "SYNTHETIC_TYPES", "MODEL_NAMES", "BASELINE_MODELS", "GAT_HEADS"]

#: the characterization grid's models (those with analytic FLOP / byte counts)
MODEL_NAMES = ("gcn", "gat", "sage", "gin", "ggnn", "rgcn")
#: every zoo model: each has a PyG and a DGL baseline of the same math
#: (:mod:`ngra.characterize.pyg_models`, :mod:`ngra.characterize.dgl_models`)
BASELINE_MODELS = MODEL_NAMES + ("ggcn", "commnet", "mpnn")
SYNTHETIC_TYPES = 3
GAT_HEADS = 8


def synthetic_edge_types(graph: Graph, num_types: int = SYNTHETIC_TYPES) -> torch.Tensor:
    """``[E]`` int64 types in the graph's original edge order, from hashing endpoints."""
    ei = graph.edge_index().numpy().astype(np.uint64)
    lo, hi = np.minimum(ei[0], ei[1]), np.maximum(ei[0], ei[1])
    with np.errstate(over="ignore"):
        h = lo * np.uint64(0x9E3779B97F4A7C15) ^ (hi + np.uint64(0x632BE59BD9B4E019))
        h ^= h >> np.uint64(29)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(32)
    return torch.from_numpy((h % np.uint64(num_types)).astype(np.int64))


@dataclass
class Workload:
    """One dataset prepared for one model.

    Attributes:
        model: zoo name. dataset: spec string.
        graph: the prepared ngra graph; ``edge_data`` what the ngra model reads.
        x: ``[N, F]`` features. y: labels. train_mask: the training mask.
        num_classes, num_types: outputs and edge types.
        src, dst: ``[E]`` endpoints in CSC order (what the baselines get).
        weight: ``[E]`` GCN weights (CSC order; MPNN's edge feature) or ``None``.
        etype: ``[E]`` edge types (CSC order) or ``None``.
        norm: ``[E]`` R-GCN ``1/c_{v,r}`` (CSC order) or ``None``.
        layers: the layer widths (for analytic counts; empty outside :data:`MODEL_NAMES`).
        hidden: hidden width (GAT: over all its heads). heads: GAT's heads.
        notes: what was synthesized.
    """

    model: str
    dataset: str
    graph: Graph
    edge_data: Any
    x: torch.Tensor
    y: torch.Tensor
    train_mask: torch.Tensor
    num_classes: int
    num_types: int
    src: torch.Tensor
    dst: torch.Tensor
    weight: torch.Tensor | None
    etype: torch.Tensor | None
    norm: torch.Tensor | None
    layers: list[LayerDims]
    hidden: int
    notes: list[str]
    heads: int = GAT_HEADS

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def num_edges(self) -> int:
        return self.graph.num_edges


def prepare_workload(ds: Any, model: str, hidden: int = 64, dataset: str | None = None,
                     heads: int = GAT_HEADS) -> Workload:
    """Prepare dataset ``ds`` (a :class:`ngra.datasets.NodeDataset`) for zoo model ``model``."""

    if model not in BASELINE_MODELS:
        raise ValueError(f"workloads cover {BASELINE_MODELS}; got {model!r}.")
    notes: list[str] = []
    etype, num_types = ds.edge_type, ds.num_edge_types
    if model in ("ggnn", "rgcn") and (etype is None or num_types < 2):
        etype, num_types = synthetic_edge_types(ds.graph), SYNTHETIC_TYPES
        notes.append(f"{SYNTHETIC_TYPES} synthetic edge types (endpoint hash)")
    graph, edge_data = prepare(model, ds.graph, etype, num_types)
    # int64 ids and per-edge weights in CSC order: what the PyG / DGL baselines take
    src, dst = graph.indices.long(), graph.dst_index().long()
    weight = graph.edge_weight if model in ("gcn", "mpnn") else None
    et = norm = None
    if model == "ggnn":
        et = graph.to_csc_order(edge_data)
    elif model == "rgcn":
        et = graph.to_csc_order(edge_data["type"])
        norm = graph.to_csc_order(edge_data["norm"])
    layers = (layer_dims(model, ds.x.shape[1], hidden, ds.num_classes, heads=heads,
                         num_types=num_types) if model in MODEL_NAMES else [])
    return Workload(model=model, dataset=dataset or ds.name, graph=graph, edge_data=edge_data,
                    x=ds.x, y=ds.y, train_mask=ds.train_mask, num_classes=ds.num_classes,
                    num_types=num_types, src=src, dst=dst, weight=weight, etype=et, norm=norm,
                    layers=layers, hidden=hidden, notes=notes, heads=heads)


def build_ngra(w: Workload, dropout: float = 0.0, attention_dropout: float = 0.0) -> torch.nn.Module:
    """The zoo model for ``w``; ``dropout`` and GAT's ``attention_dropout`` as the
    baselines' (both off by default: the characterization measures the layers alone)."""

    gat = w.model == "gat"
    return build_model(w.model, w.x.shape[1], w.num_classes,
                       hidden=max(w.hidden // w.heads, 1) if gat else w.hidden,
                       heads=w.heads if gat else None, num_edge_types=w.num_types,
                       dropout=dropout, attention_dropout=attention_dropout if gat else None)
