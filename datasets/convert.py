"""Interop: :class:`NodeDataset` to and from PyG ``Data`` and DGL graphs.

Edges keep their order both ways (a dataset's original edge order is the
exported order), so ``edge_type`` and edge weights stay aligned.

Field names follow each library's conventions:

====================  ===================  ========================
NodeDataset           PyG ``Data``         DGL graph
====================  ===================  ========================
``x``                 ``x``                ``ndata["feat"]``
``y``                 ``y``                ``ndata["label"]``
``train_mask`` ...    ``train_mask`` ...   ``ndata["train_mask"]`` ...
``edge_type``         ``edge_type``        ``edata["etype"]``
graph edge weights    ``edge_weight``      ``edata["w"]``
====================  ===================  ========================

Split: the graph's own ``train_mask`` / ``val_mask`` / ``test_mask`` are kept (a
missing one of them is all-False). A graph with none of the three gets a random
split of its labeled vertices (``train`` / ``val`` fractions, ``seed``; test the
rest), recorded in ``info["split"]``, so training works on a bare ``Data``.

Checks (:class:`~ngra.errors.DatasetError`, before any training): features and
labels with one row per vertex, integer labels in ``[0, C)`` or ``-1`` (the first bad
vertex and value named), masks of length ``N``. Everything is read, nothing made
up: ``info["synthesized"] == []``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ngra.graph import Graph

from .base import DatasetError, NodeDataset, random_masks, rng_for
from .direction import add_missing_reverses, check_direction

__all__ = ["from_dgl", "from_pyg", "to_dgl", "to_pyg"]

_MASKS = ("train_mask", "val_mask", "test_mask")


def to_pyg(ds: NodeDataset):
    """A ``torch_geometric.data.Data`` with ``x, y, edge_index``, the masks,
    ``edge_type`` and ``edge_weight`` when present, and ``num_nodes``."""
    from torch_geometric.data import Data

    data = Data(x=ds.x, y=ds.y, edge_index=ds.graph.edge_index(), num_nodes=ds.num_nodes)
    for m in _MASKS:
        data[m] = getattr(ds, m)
    if ds.edge_type is not None:
        data.edge_type = ds.edge_type
    if ds.graph.edge_weight is not None:
        data.edge_weight = ds.graph.edge_weight_original()
    return data


def from_pyg(
    data: Any, name: str = "pyg", num_classes: int | None = None, split: int = 0,
    symmetric: bool | None = None, *, train: float = 0.1, val: float = 0.1, seed: int = 0,
) -> NodeDataset:
    """A :class:`NodeDataset` from a PyG ``Data`` with ``x``, ``y`` and ``edge_index``.

    Args:
        data: the PyG graph. Its masks are kept (one it lacks is all-False); with none
            of ``train_mask``, ``val_mask``, ``test_mask`` the split is random (below).
        name: dataset name.
        num_classes: default ``max(y) + 1``.
        split: column of 2-D masks (datasets with several splits, e.g. WikiCS).
        symmetric: ``True`` appends the reverse of each edge whose reverse is absent (PyG's
            ``to_undirected``; its edge type and weight copied), ``False`` keeps the edges;
            ``None`` (default) keeps them and reports a graph with (almost) no reciprocal
            edges (:mod:`~ngra.datasets.direction`).
        train, val: fractions of the labeled vertices in the random split of a ``Data``
            without masks (test: the rest).
        seed: seed of that random split.

    Raises:
        DatasetError: no ``x`` or ``y``, a row count that is not the vertex count,
            labels outside ``[0, C)`` (and not ``-1``) or not integers, a mask of
            another length.
    """
    if getattr(data, "x", None) is None or getattr(data, "y", None) is None:
        raise DatasetError("from_pyg needs a Data with node features x and labels y.")
    y = data.y
    if y.dim() != 1:
        raise DatasetError(
            f"from_pyg needs one class label per node (y of shape [N]); got {list(y.shape)}."
        )
    graph = Graph.from_pyg(data)
    given = {m: getattr(data, m, None) for m in _MASKS}
    masks = [_mask(given[m], graph.num_nodes, split, m, "from_pyg") for m in _MASKS]
    edge_type = getattr(data, "edge_type", None)
    return _build(name, graph, data.x, y, masks, num_classes, edge_type, symmetric,
                  f"from_pyg(data, name={name!r}, symmetric=True)", "from_pyg", "data.x",
                  "data.y", (train, val, seed))


def to_dgl(ds: NodeDataset):
    """A DGL graph (edges in original order) with ``ndata`` feat/label/masks and
    ``edata["etype"]`` / ``edata["w"]`` when present."""
    g = ds.graph.to_dgl(weight_field="w")
    g.ndata["feat"] = ds.x
    g.ndata["label"] = ds.y
    for m in _MASKS:
        g.ndata[m] = getattr(ds, m)
    if ds.edge_type is not None:
        g.edata["etype"] = ds.edge_type
    return g


def from_dgl(g: Any, name: str = "dgl", num_classes: int | None = None,
             symmetric: bool | None = None, *, train: float = 0.1, val: float = 0.1,
             seed: int = 0) -> NodeDataset:
    """A :class:`NodeDataset` from a homogeneous DGL graph with ``ndata["feat"]`` and ``ndata["label"]``.

    ``ndata["train_mask"]`` / ``"val_mask"`` / ``"test_mask"`` are kept (one it lacks is
    all-False; with none of them the split is random: ``train`` / ``val`` fractions of
    the labeled vertices, ``seed``). ``edata["etype"]`` becomes ``edge_type`` and
    ``edata["w"]`` the graph's edge weights. ``symmetric`` as for :func:`from_pyg`
    (``True``: DGL's ``to_bidirected``, keeping multi-edges and edge data).

    Raises:
        DatasetError: as :func:`from_pyg`.
    """
    for key in ("feat", "label"):
        if key not in g.ndata:
            raise DatasetError(f"from_dgl needs g.ndata[{key!r}]; found {sorted(g.ndata.keys())}.")
    graph = Graph.from_dgl(g, weight_field="w" if "w" in g.edata else None)
    given = {m: g.ndata[m] if m in g.ndata else None for m in _MASKS}
    masks = [_mask(given[m], graph.num_nodes, 0, m, "from_dgl") for m in _MASKS]
    edge_type = g.edata["etype"] if "etype" in g.edata else None
    return _build(name, graph, g.ndata["feat"], g.ndata["label"], masks, num_classes, edge_type,
                  symmetric, f"from_dgl(g, name={name!r}, symmetric=True)", "from_dgl",
                  'g.ndata["feat"]', 'g.ndata["label"]', (train, val, seed))


def _mask(m: torch.Tensor | None, n: int, split: int, name: str,
          caller: str) -> torch.Tensor | None:
    """The mask as ``[N]`` bool (column ``split`` of a 2-D one); ``None`` when absent."""
    if m is None:
        return None
    if m.dim() == 2:
        m = m[:, split]
    if m.dim() != 1 or m.shape[0] != n:
        raise DatasetError(
            f"{caller}: {name} must have one entry per vertex ([{n}]); got {list(m.shape)}.")
    return m.detach().cpu().to(torch.bool)


def _labels(y: torch.Tensor, n: int, num_classes: int | None, caller: str,
            field: str) -> tuple[torch.Tensor, int]:
    """``y`` as int64 ``[N]`` and ``C``; a clear error for a float, a wrong length or a
    label outside ``[0, C)`` other than ``-1`` (the first such vertex named)."""
    y = y.detach().cpu()
    if y.shape[0] != n:
        raise DatasetError(
            f"{caller}: {field} has {y.shape[0]} labels, but the graph has {n} vertices; "
            "give one label per vertex (-1: unlabeled).")
    if y.is_floating_point():
        bad = torch.nonzero(~torch.isfinite(y) | (y != torch.floor(y))).flatten()
        if bad.numel():
            v = int(bad[0])
            raise DatasetError(
                f"{caller}: {field} must hold integer classes (-1: unlabeled); vertex {v} has "
                f"{float(y[v])}.")
    y = y.long()
    if num_classes is None:
        num_classes = int(y.max()) + 1 if y.numel() and int(y.max()) >= 0 else 1
    bad = torch.nonzero((y < -1) | (y >= num_classes)).flatten()
    if bad.numel():
        v = int(bad[0])
        raise DatasetError(
            f"{caller}: {field} must be in [0, num_classes={num_classes}) or -1 (unlabeled); "
            f"vertex {v} has {int(y[v])} ({bad.numel()} out of range).")
    return y, int(num_classes)


def _build(
    name: str,
    graph: Graph,
    x: torch.Tensor,
    y: torch.Tensor,
    masks: list[torch.Tensor | None],
    num_classes: int | None,
    edge_type: torch.Tensor | None,
    symmetric: bool | None,
    option: str,
    caller: str,
    x_field: str,
    y_field: str,
    random_split: tuple[float, float, int],
) -> NodeDataset:
    n = graph.num_nodes
    if x.dim() != 2 or x.shape[0] != n:
        raise DatasetError(
            f"{caller}: {x_field} must be [num_vertices, F] = [{n}, F] (one feature row per "
            f"vertex); got {list(x.shape)}.")
    y, num_classes = _labels(y, n, num_classes, caller, y_field)
    info: dict[str, Any] = {"synthesized": []}
    if all(m is None for m in masks):
        train, val, seed = random_split
        masks = list(random_masks(n, train, val, rng_for(seed, "split"), labeled=(y >= 0).numpy()))
        info["split"] = (f"random (train={train}, val={val}, seed={seed}): the graph has no "
                         "train/val/test masks")
    else:
        info["split"] = "the graph's masks"
        masks = [torch.zeros(n, dtype=torch.bool) if m is None else m for m in masks]
    et = None if edge_type is None else edge_type.detach().cpu().long()
    if symmetric:
        graph, et = _symmetrized(graph, et)
    ds = NodeDataset(
        name=name,
        graph=graph,
        x=x.detach().cpu().float(),
        y=y,
        train_mask=masks[0],
        val_mask=masks[1],
        test_mask=masks[2],
        num_classes=num_classes,
        edge_type=et,
        num_edge_types=int(et.max()) + 1 if et is not None and et.numel() else 1,
        info=info,
    )
    stated = None if symmetric is None else f"symmetric={str(symmetric).lower()} given"
    check_direction(ds, stated=stated, symmetric=bool(symmetric), option=option)
    return ds


def _symmetrized(graph: Graph, edge_type: torch.Tensor | None) -> tuple[Graph, torch.Tensor | None]:
    """The graph plus each missing reverse edge, appended after the original edges in
    original order, with the mirrored edge's weight and type."""
    ei = graph.edge_index()
    src, dst, added = add_missing_reverses(ei[0].numpy(), ei[1].numpy(), graph.num_nodes)
    idx = torch.from_numpy(added)
    w = graph.edge_weight_original()
    out = Graph.from_edge_index(
        torch.from_numpy(np.stack([src, dst])), num_nodes=graph.num_nodes,
        edge_weight=None if w is None else torch.cat([w, w[idx]]))
    return out, None if edge_type is None else torch.cat([edge_type, edge_type[idx]])
