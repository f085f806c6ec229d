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
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ngra.graph import Graph

from .base import DatasetError, NodeDataset
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
    symmetric: bool | None = None,
) -> NodeDataset:
    """A :class:`NodeDataset` from a PyG ``Data`` with ``x``, ``y`` and ``edge_index``.

    Args:
        data: the PyG graph. Masks it lacks are all-False.
        name: dataset name.
        num_classes: default ``max(y) + 1``.
        split: column of 2-D masks (datasets with several splits, e.g. WikiCS).
        symmetric: ``True`` appends the reverse of each edge whose reverse is absent (PyG's
            ``to_undirected``; its edge type and weight copied), ``False`` keeps the edges;
            ``None`` (default) keeps them and reports a graph with (almost) no reciprocal
            edges (:mod:`~ngra.datasets.direction`).
    """
    if getattr(data, "x", None) is None or getattr(data, "y", None) is None:
        raise DatasetError("from_pyg needs a Data with node features x and labels y.")
    y = data.y
    if y.dim() != 1:
        raise DatasetError(
            f"from_pyg needs one class label per node (y of shape [N]); got {list(y.shape)}."
        )
    graph = Graph.from_pyg(data)
    masks = [_mask(getattr(data, m, None), graph.num_nodes, split, m) for m in _MASKS]
    edge_type = getattr(data, "edge_type", None)
    return _build(name, graph, data.x, y, masks, num_classes, edge_type, symmetric,
                  f"from_pyg(data, name={name!r}, symmetric=True)")


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
             symmetric: bool | None = None) -> NodeDataset:
    """A :class:`NodeDataset` from a homogeneous DGL graph with ``ndata["feat"]`` and ``ndata["label"]``.

    Masks it lacks are all-False; ``edata["etype"]`` becomes ``edge_type`` and
    ``edata["w"]`` the graph's edge weights. ``symmetric`` as for :func:`from_pyg`
    (``True``: DGL's ``to_bidirected``, keeping multi-edges and edge data).
    """
    for key in ("feat", "label"):
        if key not in g.ndata:
            raise DatasetError(f"from_dgl needs g.ndata[{key!r}]; found {sorted(g.ndata.keys())}.")
    graph = Graph.from_dgl(g, weight_field="w" if "w" in g.edata else None)
    masks = [_mask(g.ndata.get(m, None), graph.num_nodes, 0, m) for m in _MASKS]
    edge_type = g.edata.get("etype", None)
    return _build(name, graph, g.ndata["feat"], g.ndata["label"], masks, num_classes, edge_type,
                  symmetric, f"from_dgl(g, name={name!r}, symmetric=True)")


def _mask(m: torch.Tensor | None, n: int, split: int, name: str) -> torch.Tensor:
    if m is None:
        return torch.zeros(n, dtype=torch.bool)
    if m.dim() == 2:
        m = m[:, split]
    return m.to(torch.bool)


def _build(
    name: str,
    graph: Graph,
    x: torch.Tensor,
    y: torch.Tensor,
    masks: list[torch.Tensor],
    num_classes: int | None,
    edge_type: torch.Tensor | None,
    symmetric: bool | None,
    option: str,
) -> NodeDataset:
    y = y.detach().cpu().long()
    if num_classes is None:
        num_classes = int(y.max()) + 1 if y.numel() else 1
    et = None if edge_type is None else edge_type.detach().cpu().long()
    if symmetric:
        graph, et = _symmetrized(graph, et)
    ds = NodeDataset(
        name=name,
        graph=graph,
        x=x.detach().cpu().float(),
        y=y,
        train_mask=masks[0].cpu(),
        val_mask=masks[1].cpu(),
        test_mask=masks[2].cpu(),
        num_classes=num_classes,
        edge_type=et,
        num_edge_types=int(et.max()) + 1 if et is not None and et.numel() else 1,
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
