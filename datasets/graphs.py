"""Graph-classification datasets: many small graphs, one label per graph (or T binary ones).

A :class:`GraphDataset` holds every graph in **one** CSC structure over global node ids
(``indptr`` ``[N + 1]``, ``indices`` ``[E]``) plus per-graph node offsets ``node_ptr``
``[G + 1]``: graph ``g`` owns nodes ``node_ptr[g]:node_ptr[g+1]`` and, since no edge
joins two graphs, the edges ``edge_ptr[g]:edge_ptr[g+1]`` with ``edge_ptr =
indptr[node_ptr]``. No per-graph objects exist; a batch or a subset is one vectorized
gather (:mod:`~ngra.datasets.batching`).

Built by :func:`~ngra.datasets.tu.load_tu` (TU text files),
:func:`~ngra.datasets.ogbgraph.load_ogb_graph` (an OGB graph-property folder),
:func:`from_pyg_list` (a list of PyG ``Data``) or :meth:`GraphDataset.from_edges` (edge
arrays with a node-to-graph offset vector). Labels are remapped to ``[0, C)``;
``label_values[c]`` is the original label of class ``c``.

Task types (``task_type``): ``"multiclass"`` (one class label per graph, ``y`` ``[G]``
int64) or ``"binary"`` (OGB's ``ogbg-molhiv``, ``-molpcba``: ``T`` binary tasks per
graph, ``y`` ``[G, T]`` float32 holding 0, 1 or NaN for a missing label; ``num_classes``
is 2 and the model's head has ``T`` outputs, :attr:`GraphDataset.num_outputs`). The
metric a run reports (:attr:`GraphDataset.metric`) is ``info["eval_metric"]`` when the
loader knows it (an OGB folder's ``roc_auc`` or ``ap``), else accuracy or ROC-AUC.

A dataset may carry its own split (``split``: train/val/test graph ids, an OGB folder's
``split/<type>/``); graph classification trains on it instead of a random one. A subset
has none (its ids would name other graphs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ngra.errors import DatasetError
from ngra.graph import Graph

from .batching import GraphBatch, Selection, collate, gather_graphs
from .direction import reciprocity

__all__ = ["SPLIT_PARTS", "TASK_TYPES", "GraphDataset", "from_pyg_list"]

#: The parts of a graph dataset's own split.
SPLIT_PARTS = ("train", "val", "test")

#: What a graph's labels are (:attr:`GraphDataset.task_type`).
TASK_TYPES = ("multiclass", "binary")


def _offsets(counts: np.ndarray) -> np.ndarray:
    ptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr


@dataclass(eq=False)
class GraphDataset:
    """Graphs with one class label each, stored as one concatenated CSC structure.

    ``len(ds)`` is the number of graphs; ``ds[i]`` is graph ``i`` as a one-graph
    :class:`~ngra.datasets.batching.GraphBatch`; ``ds[2:10]``, ``ds[[0, 5]]`` or
    ``ds[mask]`` is a new :class:`GraphDataset` (splits).

    Attributes:
        name: short name (``"MUTAG"``).
        indptr: ``[N + 1]`` int64 CSC offsets over all nodes of all graphs.
        indices: ``[E]`` int64 global source id of each edge (CSC order).
        node_ptr: ``[G + 1]`` int64 node offsets of the graphs.
        x: ``[N, F]`` float32 node features (``info["x"]`` says what they are).
        y: ``[G]`` int64 graph labels in ``[0, num_classes)``; for ``task_type="binary"``
            ``[G, T]`` float32 of 0, 1 and NaN (a missing label).
        num_classes: ``C`` (2 for a binary dataset).
        label_values: ``[C]`` the original label of each class (MUTAG: ``[-1, 1]``).
        edge_attr: ``[E, D]`` float32 edge features in CSC order, or ``None``
            (``info["edge_attr"]`` says what they are).
        edge_label: ``[E]`` (or ``[E, K]``) int64 raw edge labels, or ``None``.
        node_label: ``[N]`` (or ``[N, K]``) int64 raw node labels, or ``None``.
        info: provenance: ``x`` (``"node_attributes"``, ``"one_hot_node_labels"``,
            ``"constant"``, ``"node_feat"`` or ``"given"``), ``edge_attr``
            (``"edge_attributes"``, ``"one_hot_edge_labels"``, ``"edge_feat"``, ``"given"``
            or ``None``), loader notes.
        split: the dataset's own split, ``{"train", "val", "test"}`` -> ``[G_part]`` int64
            graph ids, or ``None`` (a random split is drawn where one is needed).
        task_type: ``"multiclass"`` (default) or ``"binary"`` (module docstring).

    Raises:
        DatasetError: inconsistent shapes or offsets, an edge joining two graphs, a split
            without all three parts or with ids out of range.
    """

    name: str
    indptr: torch.Tensor
    indices: torch.Tensor
    node_ptr: torch.Tensor
    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    label_values: torch.Tensor
    edge_attr: torch.Tensor | None = None
    edge_label: torch.Tensor | None = None
    node_label: torch.Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict, repr=False)
    split: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    task_type: str = "multiclass"

    def __post_init__(self) -> None:
        n, e, g = self.indptr.numel() - 1, self.indices.numel(), self.node_ptr.numel() - 1
        ptr = self.node_ptr.numpy()
        if g < 0 or ptr[0] != 0 or ptr[-1] != n or (np.diff(ptr) < 0).any():
            raise DatasetError(f"{self.name}: node_ptr must rise from 0 to num_nodes={n}; got "
                               f"{g + 1} offsets from {ptr[:1].tolist()} to {ptr[-1:].tolist()}.")
        ip = self.indptr.numpy()
        if ip[0] != 0 or ip[-1] != e or (np.diff(ip) < 0).any():
            raise DatasetError(f"{self.name}: indptr must rise from 0 to num_edges={e}.")
        checks = [("x", self.x, n), ("y", self.y, g), ("label_values", self.label_values,
                                                          self.num_classes),
                  ("edge_attr", self.edge_attr, e), ("edge_label", self.edge_label, e),
                  ("node_label", self.node_label, n)]
        for what, t, rows in checks:
            if t is not None and t.shape[0] != rows:
                raise DatasetError(f"{self.name}: {what} must have {rows} rows; got shape "
                                   f"{list(t.shape)}.")
        if self.x.dim() != 2 or self.x.dtype != torch.float32:
            raise DatasetError(f"{self.name}: x must be [N, F] float32; got {list(self.x.shape)} "
                               f"{self.x.dtype}.")
        if self.task_type not in TASK_TYPES:
            raise DatasetError(f"{self.name}: task_type must be one of {TASK_TYPES}; got "
                               f"{self.task_type!r}.")
        if self.task_type == "binary":
            self._check_binary()
        elif self.y.dim() != 1 or self.y.dtype != torch.int64:
            raise DatasetError(f"{self.name}: y of a multiclass dataset must be [G] int64 class "
                               f"labels; got {list(self.y.shape)} {self.y.dtype}.")
        elif g and (int(self.y.min()) < 0 or int(self.y.max()) >= self.num_classes):
            raise DatasetError(f"{self.name}: y must be in [0, {self.num_classes}); got range "
                               f"[{int(self.y.min())}, {int(self.y.max())}].")
        src = self.indices.numpy()
        if e and (int(src.min()) < 0 or int(src.max()) >= n):
            raise DatasetError(f"{self.name}: edge sources must be in [0, {n}).")
        node_graph = np.repeat(np.arange(g, dtype=np.int64), np.diff(ptr))
        dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(ip))
        cross = np.flatnonzero(node_graph[src] != node_graph[dst])
        if cross.size:
            k = int(cross[0])
            raise DatasetError(
                f"{self.name}: edge {k} (node {int(src[k])} -> {int(dst[k])}) joins graph "
                f"{int(node_graph[src[k]])} and graph {int(node_graph[dst[k]])}; every edge "
                f"must stay inside one graph ({cross.size} edges do not).")
        if self.split is not None:
            self._check_split(g)

    def _check_binary(self) -> None:
        y = self.y
        if y.dim() != 2 or not y.is_floating_point() or self.num_classes != 2:
            raise DatasetError(f"{self.name}: y of a binary dataset must be [G, T] floats (0, 1, "
                               f"NaN for missing) with num_classes=2; got {list(y.shape)} "
                               f"{y.dtype}, num_classes={self.num_classes}.")
        bad = ~(torch.isnan(y) | (y == 0) | (y == 1))
        if bad.any():
            g, t = (int(v) for v in bad.nonzero()[0])
            raise DatasetError(f"{self.name}: y[{g}, {t}] is {float(y[g, t])}; a binary label "
                               "is 0, 1 or NaN (missing).")

    def _check_split(self, g: int) -> None:
        if sorted(self.split) != sorted(SPLIT_PARTS):
            raise DatasetError(f"{self.name}: split must have the parts {list(SPLIT_PARTS)}; "
                               f"got {sorted(self.split)}.")
        for part, ids in self.split.items():
            if ids.dim() != 1 or ids.dtype != torch.int64:
                raise DatasetError(f"{self.name}: split[{part!r}] must be [G_part] int64 graph "
                                   f"ids; got {list(ids.shape)} {ids.dtype}.")
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= g):
                raise DatasetError(f"{self.name}: split[{part!r}] holds graph ids in "
                                   f"[{int(ids.min())}, {int(ids.max())}]; there are {g} "
                                   f"graphs, ids in [0, {g}).")

    # ------------------------------------------------------------------ build
    @classmethod
    def from_edges(
        cls,
        name: str,
        src: np.ndarray,
        dst: np.ndarray,
        node_ptr: np.ndarray,
        labels: np.ndarray,
        x: np.ndarray | torch.Tensor,
        *,
        edge_attr: np.ndarray | torch.Tensor | None = None,
        edge_label: np.ndarray | None = None,
        node_label: np.ndarray | None = None,
        info: dict[str, Any] | None = None,
        split: dict[str, np.ndarray] | None = None,
        task_type: str = "multiclass",
    ) -> GraphDataset:
        """Build from ``[E]`` global ``src -> dst`` ids in any order (sorted here to CSC by
        ``(dst, src)``, stably: multi-edges kept in input order, edge data permuted alike),
        ``[G + 1]`` node offsets and ``[G]`` raw graph labels (remapped to ``[0, C)``), or
        for ``task_type="binary"`` ``[G, T]`` labels 0, 1 or NaN (kept as they are);
        ``split`` (optional): train/val/test graph ids."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        node_ptr = np.asarray(node_ptr, dtype=np.int64)
        n = int(node_ptr[-1])
        perm = np.argsort(dst * max(n, 1) + src, kind="stable")
        indptr = _offsets(np.bincount(dst, minlength=n)[:n] if dst.size else np.zeros(n, np.int64))
        if task_type == "binary":
            y = np.asarray(labels, dtype=np.float32)
            y, values = y.reshape(y.shape[0], -1), np.array([0, 1])
        else:
            values, y = np.unique(np.asarray(labels), return_inverse=True)
            y = y.reshape(-1).astype(np.int64)

        def edges(a: Any, dtype: torch.dtype) -> torch.Tensor | None:
            return None if a is None else torch.as_tensor(np.asarray(a)[perm]).to(dtype)

        return cls(
            name=name,
            indptr=torch.from_numpy(indptr),
            indices=torch.from_numpy(np.ascontiguousarray(src[perm])),
            node_ptr=torch.from_numpy(node_ptr),
            x=torch.as_tensor(np.asarray(x)).to(torch.float32),
            y=torch.from_numpy(y),
            num_classes=int(values.size),
            label_values=torch.as_tensor(values),
            edge_attr=edges(edge_attr, torch.float32),
            edge_label=edges(edge_label, torch.int64),
            node_label=None if node_label is None else torch.as_tensor(node_label).long(),
            info=dict(info or {}),
            split=None if split is None else {
                k: torch.as_tensor(np.asarray(v, dtype=np.int64).reshape(-1))
                for k, v in split.items()},
            task_type=task_type,
        )

    # ------------------------------------------------------------ properties
    def __len__(self) -> int:
        return int(self.node_ptr.numel() - 1)

    @property
    def num_graphs(self) -> int:
        return len(self)

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.numel() - 1)

    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def num_tasks(self) -> int:
        """``T``: the binary tasks of each graph (1 for a multiclass dataset)."""
        return int(self.y.shape[1]) if self.task_type == "binary" else 1

    @property
    def num_outputs(self) -> int:
        """The width of a model's head: ``num_classes`` scores, or one logit per task."""
        return self.num_tasks if self.task_type == "binary" else self.num_classes

    @property
    def metric(self) -> str:
        """What a run reports: ``info["eval_metric"]`` (an OGB folder's), else
        ``"accuracy"`` (multiclass) or ``"roc_auc"`` (binary)."""
        default = "roc_auc" if self.task_type == "binary" else "accuracy"
        return self.info.get("eval_metric") or default

    @property
    def edge_ptr(self) -> torch.Tensor:
        """``[G + 1]`` int64 edge offsets of the graphs (CSC positions)."""
        return self.indptr.index_select(0, self.node_ptr)

    @property
    def graph(self) -> Graph:
        """Every graph as one block-diagonal :class:`~ngra.graph.Graph`."""
        return Graph.from_csc(self.indptr, self.indices, validate=False)

    @property
    def reciprocity(self) -> float | None:
        """Share of edges whose reverse is an edge too (measured once, kept in ``info``)."""
        if "reciprocity" not in self.info:
            self.info["reciprocity"] = reciprocity(self.graph)
        return self.info["reciprocity"]

    # ------------------------------------------------------------ selection
    def selection(self, idx: np.ndarray) -> Selection:
        """Where graphs ``idx`` live (see :func:`~ngra.datasets.batching.gather_graphs`)."""
        return gather_graphs(self.node_ptr.numpy(), self.indptr.numpy(), self.indices.numpy(),
                             idx)

    def __getitem__(self, key: int | slice | Sequence[int] | np.ndarray | torch.Tensor
                    ) -> GraphBatch | GraphDataset:
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return collate(self, [int(key)])
        if isinstance(key, slice):
            return self.subset(np.arange(len(self))[key])
        t = torch.as_tensor(key)
        if t.dtype == torch.bool:
            if t.shape != (len(self),):
                raise IndexError(f"a boolean mask must have shape [{len(self)}]; got "
                                 f"{list(t.shape)}.")
            t = t.nonzero().view(-1)
        return self.subset(t.numpy())

    def subset(self, idx: Sequence[int] | np.ndarray) -> GraphDataset:
        """Graphs ``idx`` (in that order) as a new dataset with the same classes (and no
        ``split``: its ids name graphs of this dataset)."""
        sel = self.selection(np.asarray(idx, dtype=np.int64).reshape(-1))
        node_sel, edge_sel = torch.from_numpy(sel.node_sel), torch.from_numpy(sel.edge_sel)

        def rows(t: torch.Tensor | None, at: torch.Tensor) -> torch.Tensor | None:
            return None if t is None else t.index_select(0, at)

        info = {k: v for k, v in self.info.items() if k != "reciprocity"}
        return GraphDataset(
            name=self.name, indptr=torch.from_numpy(sel.indptr),
            indices=torch.from_numpy(sel.indices), node_ptr=torch.from_numpy(sel.node_ptr),
            x=rows(self.x, node_sel), y=rows(self.y, torch.from_numpy(sel.graphs)),
            num_classes=self.num_classes, label_values=self.label_values,
            edge_attr=rows(self.edge_attr, edge_sel), edge_label=rows(self.edge_label, edge_sel),
            node_label=rows(self.node_label, node_sel), info=info, task_type=self.task_type)

    # ------------------------------------------------------------ report
    def summary(self) -> dict[str, Any]:
        """Sizes, classes and where the features came from, as a flat dict."""
        g = max(len(self), 1)
        if self.task_type == "binary":
            counts = [int((self.y == 0).sum()), int((self.y == 1).sum())]  # labeled entries
            missing = int(torch.isnan(self.y).sum())
        else:
            counts, missing = torch.bincount(self.y, minlength=self.num_classes).tolist(), 0
        return {
            "name": self.name,
            "num_graphs": len(self),
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "avg_nodes": round(self.num_nodes / g, 2),
            "avg_edges": round(self.num_edges / g, 2),
            "num_features": self.num_features,
            "x": self.info.get("x"),
            "edge_attr": None if self.edge_attr is None else int(self.edge_attr.shape[1]),
            "edge_attr_source": self.info.get("edge_attr"),
            "num_classes": self.num_classes,
            "class_counts": counts,
            "label_values": self.label_values.tolist(),
            "task_type": self.task_type,
            "num_tasks": self.num_tasks,
            "missing_labels": missing,
            "metric": self.metric,
            "split": None if self.split is None else {
                k: int(self.split[k].numel()) for k in SPLIT_PARTS},
        }

    def __repr__(self) -> str:
        s = self.summary()
        return (f"GraphDataset({s['name']!r}, num_graphs={s['num_graphs']}, "
                f"num_nodes={s['num_nodes']}, num_edges={s['num_edges']}, "
                f"num_features={s['num_features']}, num_classes={s['num_classes']})")


def from_pyg_list(data_list: Sequence[Any], name: str = "pyg") -> GraphDataset:
    """A list of PyG ``Data`` (one graph each: ``edge_index``, ``num_nodes``, a one-element
    ``y``, optional ``x`` and ``edge_attr``) as a :class:`GraphDataset`.

    Every graph must have ``x`` or none (none: constant 1 features), and likewise for
    ``edge_attr``.

    Raises:
        DatasetError: an empty list, a ``y`` that is not one label, ``x`` or ``edge_attr``
            on some graphs only, or rows that do not match the graph.
    """
    if len(data_list) == 0:
        raise DatasetError("from_pyg_list needs at least one graph; got an empty list.")
    counts = np.array([int(d.num_nodes) for d in data_list], dtype=np.int64)
    node_ptr = _offsets(counts)
    eis = [torch.as_tensor(d.edge_index).long() for d in data_list]
    shift = np.repeat(node_ptr[:-1], [ei.shape[1] for ei in eis])
    ei = torch.cat(eis, 1).numpy() + shift
    labels = []
    for i, d in enumerate(data_list):
        y = torch.as_tensor(d.y).reshape(-1)
        if y.numel() != 1:
            shape = list(torch.as_tensor(d.y).shape)
            raise DatasetError(f"{name}: graph {i} has y of shape {shape}; a graph-level "
                               "dataset needs one label per graph.")
        labels.append(y.item())

    def stacked(key: str, parts: list[Any], rows: np.ndarray) -> torch.Tensor | None:
        have = [p is not None for p in parts]
        if not any(have):
            return None
        if not all(have):
            raise DatasetError(f"{name}: graph {have.index(False)} has no {key} but graph "
                               f"{have.index(True)} does; give {key} for every graph or none.")
        ts = []
        for i, (p, r) in enumerate(zip(parts, rows)):
            t = torch.as_tensor(p)
            t = t.reshape(-1, 1) if t.dim() <= 1 else t.flatten(1)  # [rows] or [rows, *D]
            if t.shape[0] != r:
                per = "node" if key == "x" else "edge"
                raise DatasetError(f"{name}: graph {i} has {key} with {t.shape[0]} rows; "
                                   f"expected {int(r)} (one per {per}).")
            ts.append(t.float())
        # graphs with rows set the width; one without (no edges) may be [0] or [0, any]
        wide = [(i, t.shape[1]) for i, t in enumerate(ts) if t.shape[0]]
        odd = [(i, w) for i, w in wide if w != wide[0][1]]
        if odd:
            raise DatasetError(f"{name}: graph {odd[0][0]} has {key} {odd[0][1]} wide but graph "
                               f"{wide[0][0]} has {wide[0][1]}; every graph's {key} must be as "
                               "wide.")
        width = wide[0][1] if wide else ts[0].shape[1]
        return torch.cat([t if t.shape[0] else t.new_zeros(0, width) for t in ts])

    x = stacked("x", [d.x for d in data_list], counts)
    edge_attr = stacked("edge_attr", [d.edge_attr for d in data_list],
                        np.array([e.shape[1] for e in eis]))
    info = {"x": "given" if x is not None else "constant",
            "edge_attr": "given" if edge_attr is not None else None}
    return GraphDataset.from_edges(
        name, ei[0], ei[1], node_ptr, np.array(labels),
        x if x is not None else torch.ones(int(node_ptr[-1]), 1), edge_attr=edge_attr, info=info)
