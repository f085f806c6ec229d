"""The tiles the executor walks: one destination interval x the sources it reads.

A :class:`TileView` is what a plan's edge stage needs from a tile. The whole
graph is the single tile of the 1 x 1 grid (:func:`whole_graph_grid`); chunked
grids come from :mod:`ngra.partition` and present the same view.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ngra.graph import Graph

__all__ = ["TileView", "Grid", "whole_graph_grid"]


@dataclass(frozen=True)
class TileView:
    """One tile's edges.

    Attributes:
        dst_lo, dst_hi: the destination interval ``[dst_lo, dst_hi)``.
        indptr: ``[dst_hi - dst_lo + 1]`` local CSC offsets over the interval.
        src_idx: ``[E_t]`` global source id of each tile edge (CSC order).
        dst_idx: ``[E_t]`` global destination id of each tile edge.
        edge_ids: ``[E_t]`` positions in the graph's CSC edge order, or ``None``
            when the tile holds all edges in CSC order.
    """

    dst_lo: int
    dst_hi: int
    indptr: torch.Tensor
    src_idx: torch.Tensor
    dst_idx: torch.Tensor
    edge_ids: torch.Tensor | None

    @property
    def num_edges(self) -> int:
        return int(self.src_idx.numel())


@dataclass(frozen=True)
class Grid:
    """Tiles grouped by destination column; ``columns[p]`` covers one interval."""

    columns: tuple[tuple[TileView, ...], ...]
    shape: tuple[int, int]


def whole_graph_grid(graph: Graph) -> Grid:
    """The 1 x 1 grid: one tile holding every edge."""
    tile = TileView(0, graph.num_nodes, graph.indptr, graph.indices, graph.dst_index(), None)
    return Grid(((tile,),), (1, 1))
