"""The tiles the executor walks: one destination interval x the sources it reads.

A :class:`TileView` is what a plan's edge stage needs from a tile. The whole
graph is the single tile of the 1 x 1 grid (:func:`whole_graph_grid`); chunked
grids come from :func:`ngra.partition.tile_graph` and present the same view
(:func:`grid_from_tiles`). Views of partition tiles are built on demand (by the
prefetch thread while the previous tile computes), so only the tiles in flight
hold their global-id arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ngra.graph import Graph, segment_ids

__all__ = ["TileView", "Grid", "whole_graph_grid", "grid_from_tiles", "empty_tile"]

Rev = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class TileView:
    """One tile's edges, with global ids.

    Attributes:
        dst_lo, dst_hi: the destination interval ``[dst_lo, dst_hi)``.
        indptr: ``[dst_hi - dst_lo + 1]`` local CSC offsets over the interval.
        src_idx: ``[E_t]`` global source id of each tile edge (CSC order).
        dst_idx: ``[E_t]`` global destination id of each tile edge.
        edge_ids: ``[E_t]`` positions in the graph's CSC edge order, or ``None``
            when the tile holds all edges in CSC order.
        rev: the reverse (source-sorted) structure for backward kernels,
            ``(rev_indptr [num_nodes + 1] over global sources, rev_indices [E_t]
            dst ids local to the interval, rev_perm [E_t] tile-CSC position of
            each CSR edge)``; computed on first access for partition tiles.
        key: ``(column, row)`` of the tile in its grid.
    """

    __slots__ = ("dst_lo", "dst_hi", "indptr", "src_idx", "dst_idx", "edge_ids", "_rev", "_rev_fn",
                 "key")

    def __init__(self, dst_lo: int, dst_hi: int, indptr: torch.Tensor, src_idx: torch.Tensor,
                 dst_idx: torch.Tensor, edge_ids: torch.Tensor | None,
                 rev: Rev | Callable[[], Rev] | None = None, key: tuple[int, int] = (0, 0)) -> None:
        self.dst_lo, self.dst_hi = int(dst_lo), int(dst_hi)
        self.indptr, self.src_idx, self.dst_idx, self.edge_ids = indptr, src_idx, dst_idx, edge_ids
        self._rev = None if callable(rev) else rev
        self._rev_fn = rev if callable(rev) else None
        self.key = key  # (column, row) in the grid

    @property
    def rev(self) -> Rev | None:
        if self._rev is None and self._rev_fn is not None:
            self._rev = self._rev_fn()
        return self._rev

    @property
    def num_edges(self) -> int:
        return int(self.src_idx.numel())

    @property
    def num_dst(self) -> int:
        return self.dst_hi - self.dst_lo

    def __repr__(self) -> str:
        return f"TileView(dst=[{self.dst_lo}, {self.dst_hi}), edges={self.num_edges})"


@dataclass(frozen=True)
class Grid:
    """A P x Q grid of tiles, walked by columns (forward) and by rows (backward).

    ``columns[p]`` and ``rows[q]`` hold zero-argument callables that build the
    :class:`TileView` of each tile in that column or row; every column has at
    least one tile (an empty one if it has no edges) so its accumulator gets a shape.
    """

    columns: tuple[tuple[Callable[[], TileView], ...], ...]
    rows: tuple[tuple[Callable[[], TileView], ...], ...]
    shape: tuple[int, int]
    source: Any = None  # the partition TileGrid, when there is one

    @property
    def num_tiles(self) -> int:
        return sum(len(c) for c in self.columns)


def whole_graph_grid(graph: Graph) -> Grid:
    """The 1 x 1 grid: one tile holding every edge (cached on the graph)."""
    csr = graph.csr()
    tile = TileView(0, graph.num_nodes, graph.indptr, graph.indices, graph.dst_index(), None,
                    (csr.indptr, csr.indices, csr.perm))
    make = (lambda: tile,)
    return Grid((make,), (make,), (1, 1))


def empty_tile(graph: Graph, dst_lo: int, dst_hi: int) -> TileView:
    """A tile over ``[dst_lo, dst_hi)`` with no edges."""
    z = torch.zeros(0, dtype=torch.int64)
    rev = (torch.zeros(graph.num_nodes + 1, dtype=torch.int64), z, z)
    return TileView(dst_lo, dst_hi, torch.zeros(dst_hi - dst_lo + 1, dtype=torch.int64), z, z, z, rev,
                    key=(dst_lo, -1))


def _view_of(tile: Any, num_nodes: int) -> TileView:
    """The global-id view of an :class:`ngra.partition.Tile`."""
    src_rows = tile.src_rows.long()
    src_idx = src_rows.index_select(0, tile.indices.long())
    dst_idx = segment_ids(tile.indptr, start=tile.dst_lo)

    def rev() -> Rev:
        per_src = torch.zeros(num_nodes, dtype=torch.int64)
        per_src[src_rows] = (tile.csr_indptr[1:] - tile.csr_indptr[:-1]).long()
        rev_indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
        torch.cumsum(per_src, 0, out=rev_indptr[1:])
        return rev_indptr, tile.csr_indices.long(), tile.csr_perm.long()

    return TileView(tile.dst_lo, tile.dst_hi, tile.indptr.long(), src_idx, dst_idx,
                    tile.edge_ids.long(), rev, key=(tile.col, tile.row))


def grid_from_tiles(graph: Graph, tiles: Any) -> Grid:
    """The executor's view of an :class:`ngra.partition.TileGrid` built on ``graph``."""
    p, q = tiles.shape
    n = graph.num_nodes

    def maker(t: Any) -> Callable[[], TileView]:
        return lambda: _view_of(t, n)

    columns: list[Sequence[Callable[[], TileView]]] = []
    for c in range(p):
        lo, hi = tiles.dst_interval(c)
        col = tuple(maker(t) for t in tiles.column(c))
        if not col:
            col = ((lambda lo=lo, hi=hi: empty_tile(graph, lo, hi)),)
        columns.append(col)
    rows = tuple(tuple(maker(t) for t in tiles.row(r)) for r in range(q))
    return Grid(tuple(columns), rows, (p, q), tiles)
