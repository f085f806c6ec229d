"""The one executor: runs a layer's plan over a grid of tiles.

``execute`` validates the inputs, puts edge data in CSC order, asks the
compiler for the layer's plan (cached per input signature), and walks the grid
column by column: the vertex-side ``pre`` stage, each tile's ``edge`` stage
merged into the column's accumulator, then ``post`` (``apply_vertex``).
Whole-graph execution is the 1 x 1 grid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ngra.graph import Graph
from ngra.runtime.tiles import Grid, whole_graph_grid

__all__ = ["execute", "run_plan", "edge_data_csc"]


def execute(layer: Any, graph: Graph, x: Any, edge_data: Any = None) -> Any:
    """Run SAGA ``layer`` on ``graph`` with vertex data ``x`` (see :class:`ngra.SagaLayer`)."""
    from ngra.compiler import compile_layer

    _check_vertex_data(layer, graph, x)
    edata = edge_data_csc(graph, edge_data, type(layer).__name__)
    plan = compile_layer(layer, graph, x, edata)
    return run_plan(plan, graph, whole_graph_grid(graph), x, edata)


def run_plan(plan: Any, graph: Graph, grid: Grid, x: Any, edata: Any) -> Any:
    """Walk ``grid`` column by column; each column's accumulator stays resident."""
    terms = plan.pre(x)
    acc = plan.accumulator
    in_deg = graph.in_degrees()
    cols = []
    for column in grid.columns:
        state = None
        for tile in column:
            state = acc.combine(state, plan.edge(tile, terms, edata))
        lo, hi = column[0].dst_lo, column[0].dst_hi
        cols.append(acc.finalize(state, in_deg[lo:hi]))
    return plan.post(x, cols[0] if len(cols) == 1 else _cat(cols))


def edge_data_csc(graph: Graph, edge_data: Any, who: str = "layer") -> Any:
    """Edge data in CSC order; defaults to the graph's edge weights (already CSC)."""
    if edge_data is None:
        return graph.edge_weight
    if isinstance(edge_data, Mapping):
        return {k: _permute_edges(graph, v, f"{who} edge_data[{k!r}]") for k, v in edge_data.items()}
    return _permute_edges(graph, edge_data, f"{who} edge_data")


def _permute_edges(graph: Graph, t: Any, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [num_edges, ...]; got {type(t).__name__}.")
    if t.dim() == 0 or t.shape[0] != graph.num_edges:
        raise ValueError(
            f"{name} must have one row per edge ([{graph.num_edges}, ...], in the graph's "
            f"original edge order); got shape {list(t.shape)}."
        )
    return t.index_select(0, graph.perm.to(t.device))


def _check_vertex_data(layer: Any, graph: Any, x: Any) -> None:
    who = type(layer).__name__
    if not isinstance(graph, Graph):
        raise TypeError(f"{who}: graph must be an ngra.Graph; got {type(graph).__name__}. "
                        "Build one with ngra.Graph.from_edge_index(edge_index).")
    items = x.items() if isinstance(x, Mapping) else [("x", x)]
    for k, v in items:
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{who}: vertex data {k!r} must be a torch.Tensor; got {type(v).__name__}.")
        if v.dim() == 0 or v.shape[0] != graph.num_nodes:
            raise ValueError(
                f"{who}: vertex data {k!r} must have one row per vertex "
                f"([{graph.num_nodes}, ...]); got shape {list(v.shape)}."
            )


def _cat(cols: list[Any]) -> Any:
    if isinstance(cols[0], Mapping):
        return {k: torch.cat([c[k] for c in cols]) for k in cols[0]}
    return torch.cat(cols)
