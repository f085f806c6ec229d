"""The tiles the executor walks: one destination interval x the sources it reads.

A :class:`WalkGrid` lists, per column and per row, the tiles to walk: partition
tiles (:class:`ngra.partition.Tile`, from :func:`grid_from_tiles`) or, for the
1 x 1 grid of whole-graph execution, one :class:`TileView` over the whole graph
(:func:`whole_graph_grid`). A grid the executor makes under a memory budget holds
:class:`TileRef` s (:func:`lazy_grid`): a tile's index arrays are built when the tile is
staged, a column at a time, and dropped after it, so they count against the budget
instead of sitting beside it for the whole run. Before its edge stage each tile is *staged*
(:mod:`ngra.runtime.staging`): the vertex rows it touches are sliced or gathered
and its indices become local to those rows. A :class:`TileView` is what a
plan's edge stage sees of a staged tile.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ngra.compiler.tile import TileView
from ngra.graph import Graph
from ngra.partition import Tile
from ngra.partition.tiling import build_columns

__all__ = ["TileView", "TileRef", "WalkGrid", "whole_graph_grid", "grid_from_tiles", "lazy_grid",
           "empty_tile", "tile_counts"]

@dataclass(frozen=True)
class WalkGrid:
    """A P x Q grid of tiles, walked by columns (forward) and by rows (backward).

    ``columns[p]`` and ``rows[q]`` hold the tiles of that column or row, each a
    partition :class:`~ngra.partition.Tile` (staged before its edge stage) or,
    in the 1 x 1 grid, the whole-graph :class:`TileView` (staged as the identity).
    Every column has at least one tile (an empty one if it has no edges) so its
    accumulator gets a shape.
    """

    columns: tuple[tuple[Any, ...], ...]
    rows: tuple[tuple[Any, ...], ...]
    shape: tuple[int, int]
    source: Any = None  # the partition TileGrid, when there is one

    @property
    def num_tiles(self) -> int:
        return sum(len(c) for c in self.columns)


def whole_graph_grid(graph: Graph) -> WalkGrid:
    """The 1 x 1 grid: one tile holding every edge, with global ids (cached on the graph)."""

    def make() -> WalkGrid:
        # the graph's CSR itself, made when a kernel first needs it (under a memory budget
        # a sum g-SpMM's backward walks the CSC instead); its perm only for edge data
        tile = TileView(0, graph.num_nodes, graph.indptr, graph.indices, None,
                        graph.deferred_csr(), whole=True)
        return WalkGrid(((tile,),), ((tile,),), (1, 1))

    return graph.cached("ngra.whole-grid", make)


def empty_tile(col: int, dst_lo: int, dst_hi: int) -> Tile:
    """A partition tile over ``[dst_lo, dst_hi)`` with no edges (row ``-1``)."""
    z = torch.zeros(0, dtype=torch.int64)
    return Tile(col=col, row=-1, dst_lo=dst_lo, dst_hi=dst_hi, src_lo=0, src_hi=0,
                indptr=torch.zeros(dst_hi - dst_lo + 1, dtype=torch.int64), indices=z,
                src_rows=z, edge_ids=z, csr_indptr=torch.zeros(1, dtype=torch.int64),
                csr_indices=z, csr_perm=z)


def grid_from_tiles(graph: Graph, tiles: Any) -> WalkGrid:
    """The executor's view of an :class:`ngra.partition.TileGrid` built on ``graph``."""
    p, q = tiles.shape
    columns = []
    for c in range(p):
        col = tiles.column(c)
        if not col:
            col = (empty_tile(c, *tiles.dst_interval(c)),)
        columns.append(tuple(col))
    rows = tuple(tuple(tiles.row(r)) for r in range(q))
    return WalkGrid(tuple(columns), rows, (p, q), tiles)


class TileRef:
    """A tile of a :func:`lazy_grid`, built (with the rest of its column) when staged.

    Attributes:
        col, row: the tile's cell; num_edges / num_src_rows: its sizes (from one counting
            pass, so walks can skip empty tiles without building them).
    """

    __slots__ = ("col", "row", "num_edges", "num_src_rows", "_columns")

    def __init__(self, col: int, row: int, num_edges: int, num_src_rows: int,
                 columns: _Columns) -> None:
        self.col, self.row = col, row
        self.num_edges, self.num_src_rows = num_edges, num_src_rows
        self._columns = columns

    def build(self) -> Tile:
        return self._columns.tile(self.col, self.row)

    def __repr__(self) -> str:
        return f"TileRef(col={self.col}, row={self.row}, edges={self.num_edges})"


class _Columns:
    """Builds a grid's tiles a column at a time and keeps only the last column built."""

    def __init__(self, graph: Graph, dst_bounds: torch.Tensor, src_bounds: torch.Tensor,
                 index_dtype: torch.dtype) -> None:
        self.graph, self.d_b, self.s_b, self.dtype = graph, dst_bounds, src_bounds, index_dtype
        self._last: tuple[int, dict[int, Tile]] | None = None
        self._lock = threading.Lock()

    def tile(self, col: int, row: int) -> Tile:
        with self._lock:
            if self._last is None or self._last[0] != col:
                self._last = None  # drop the previous column's arrays before building
                tiles = build_columns(self.graph, self.d_b, self.s_b, (col,), self.dtype)
                self._last = (col, {t.row: t for t in tiles})
            return self._last[1][row]


def tile_counts(graph: Graph, dst_bounds: Any, src_bounds: Any) -> tuple[np.ndarray, np.ndarray]:
    """``([P, Q] edges, [P, Q] distinct source rows)`` of every tile of these bounds, from one
    ``O(E)`` pass over the CSC without building a tile."""
    from ngra.partition.counts import grid_counts  # lazy: numba loads with the first count

    s_b = np.asarray(src_bounds, dtype=np.int64)
    q = s_b.size - 1
    # np.repeat: torch.repeat_interleave wakes the thread pool even for tiny inputs
    src_part = np.repeat(np.arange(q, dtype=np.int32), np.diff(s_b))
    return grid_counts(graph.indptr.numpy(), graph.indices.numpy(),
                       np.asarray(dst_bounds, dtype=np.int64), src_part, q)


def lazy_grid(graph: Graph, dst_bounds: torch.Tensor, src_bounds: torch.Tensor,
              index_dtype: torch.dtype) -> WalkGrid:
    """The grid of these bounds with tiles built on the fly (see :class:`TileRef`).

    One ``O(E)`` counting pass finds the non-empty tiles and their sizes; nothing else
    is kept per tile.
    """
    p, q = dst_bounds.numel() - 1, src_bounds.numel() - 1
    edges, rows = tile_counts(graph, dst_bounds, src_bounds)
    cols = _Columns(graph, dst_bounds, src_bounds, index_dtype)
    refs = [[TileRef(c, r, int(edges[c, r]), int(rows[c, r]), cols) for r in range(q)
             if edges[c, r] > 0] for c in range(p)]
    columns = tuple(tuple(col) if col else
                    (empty_tile(c, int(dst_bounds[c]), int(dst_bounds[c + 1])),)
                    for c, col in enumerate(refs))
    by_row = tuple(tuple(t for col in refs for t in col if t.row == r) for r in range(q))
    return WalkGrid(columns, by_row, (p, q))
