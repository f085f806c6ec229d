"""2-D tiling of a graph's adjacency into a P x Q grid of edge tiles (NeuGraph chunks).

Vertices are cut twice into contiguous intervals: ``P`` destination intervals
(*columns*, ``dst_bounds``) and ``Q`` source intervals (*rows*, ``src_bounds``). Tile
``(p, q)`` holds the edges whose destination lies in column ``p`` and whose source
lies in row ``q``. Forward walks columns (the destination accumulator of column ``p``
stays resident while its tiles stream by); backward walks rows and recomputes each tile.
Whole-graph execution is the 1 x 1 grid. Only non-empty tiles are stored.

Index conventions of a :class:`Tile` (what the runtime relies on):

* ``D = dst_hi - dst_lo`` destination rows; destination ids inside a tile are LOCAL:
  ``d_local = d_global - dst_lo`` (row of the column's accumulator).
* ``src_rows`` ``[S]``: the sorted, unique GLOBAL ids of the sources the tile touches
  (all inside ``[src_lo, src_hi)``). Source ids inside a tile are LOCAL to this
  compacted list: ``s_local`` means global id ``src_rows[s_local]``. The runtime
  gathers ``src_feat[src_rows]`` (or slices ``src_feat[src_lo:src_hi]`` and maps with
  ``src_rows - src_lo`` when the tile touches most of its interval: see
  :attr:`Tile.touched_fraction`).
* CSC (forward): ``indptr`` ``[D + 1]``, ``indices`` ``[E_t]`` local source ids. Edge
  ``i`` of the tile (its *tile-CSC position*) goes ``src_rows[indices[i]] ->
  dst_lo + d`` for ``indptr[d] <= i < indptr[d + 1]``.
* ``edge_ids`` ``[E_t]``: the parent graph's CSC position of tile edge ``i``, strictly
  increasing (a tile's edges are a subsequence of the parent CSC). Edge data in CSC
  order is sliced with ``edge_feat_csc[edge_ids]``; data in the caller's original
  order with ``edge_feat[graph.perm[edge_ids]]``.
* CSR (backward): ``csr_indptr`` ``[S + 1]`` over local source ids, ``csr_indices``
  ``[E_t]`` local destination ids, ``csr_perm`` ``[E_t]`` tile-CSC position of each CSR
  edge (so CSR edge ``j`` has parent CSC position ``edge_ids[csr_perm[j]]``). Within a
  source, edges keep tile-CSC order.

Index dtype: every index tensor of a tile has the grid's ``index_dtype``, int64 by
default. ``index_dtype=torch.int32`` halves the tiles' memory and is accepted when
``N`` and ``E`` are below ``2**31`` (otherwise ``tile_graph`` raises). Bounds are
always int64.

Tile tensors are views into per-column buffers (one allocation per column, not per
tile); clone a tile's tensors before mutating them.

Multi-device: ranks own contiguous destination ranges, i.e. runs of columns. Make the
global column bounds with :func:`ngra.partition.refine_ranges` (each rank's range split
into its own columns) and let every rank build only its columns with
``tile_graph(graph, dst_bounds=..., columns=[...])``; tiles, ``edge_ids`` and
``src_rows`` are global, so nothing is renumbered per rank.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from ngra.graph import Graph
from ngra.idtype import idtype_for
from ngra.partition.kway import degree_indptr, edge_balanced_ranges

__all__ = [
    "Summary",
    "Tile",
    "TileGrid",
    "TileStats",
    "build_columns",
    "default_bounds",
    "tile_graph",
]

_INDEX_DTYPES = (torch.int64, torch.int32)


@dataclass(frozen=True, eq=False)
class Tile:
    """One non-empty edge tile ``(col, row)`` = (destination part, source part).

    See the module docstring for the index conventions. Shapes: ``D = dst_hi - dst_lo``,
    ``S = len(src_rows)``, ``E_t = len(edge_ids)``.

    Attributes:
        col: destination part ``p`` (column).
        row: source part ``q`` (row).
        dst_lo, dst_hi: destination interval ``[dst_lo, dst_hi)``.
        src_lo, src_hi: source interval ``[src_lo, src_hi)``.
        indptr: ``[D + 1]`` local CSC offsets over destinations.
        indices: ``[E_t]`` source of each tile-CSC edge, local to ``src_rows``.
        src_rows: ``[S]`` sorted unique global source ids touched.
        edge_ids: ``[E_t]`` parent CSC position of each tile-CSC edge (increasing).
        csr_indptr: ``[S + 1]`` local CSR offsets over touched source rows.
        csr_indices: ``[E_t]`` destination of each CSR edge, local to ``dst_lo``.
        csr_perm: ``[E_t]`` tile-CSC position of each CSR edge.
    """

    col: int
    row: int
    dst_lo: int
    dst_hi: int
    src_lo: int
    src_hi: int
    indptr: torch.Tensor
    indices: torch.Tensor
    src_rows: torch.Tensor
    edge_ids: torch.Tensor
    csr_indptr: torch.Tensor
    csr_indices: torch.Tensor
    csr_perm: torch.Tensor

    @property
    def num_edges(self) -> int:
        return int(self.edge_ids.numel())

    @property
    def num_dst(self) -> int:
        """Destination rows ``D`` (the column's interval size)."""
        return self.dst_hi - self.dst_lo

    @property
    def num_src_rows(self) -> int:
        """Source rows touched ``S``."""
        return int(self.src_rows.numel())

    @property
    def src_interval_size(self) -> int:
        return self.src_hi - self.src_lo

    @property
    def touched_fraction(self) -> float:
        """``S / (src_hi - src_lo)``: below some threshold, copy only the touched rows."""
        return self.num_src_rows / max(self.src_interval_size, 1)

    def dst_local(self) -> torch.Tensor:
        """``[E_t]`` local destination of each tile-CSC edge (int64)."""
        counts = np.diff(self.indptr.numpy())
        # np.repeat: torch.repeat_interleave wakes the thread pool even for tiny inputs.
        return torch.from_numpy(np.repeat(np.arange(self.num_dst, dtype=np.int64), counts))

    def edge_index(self) -> torch.Tensor:
        """``[2, E_t]`` global ``(src, dst)`` of each tile-CSC edge (int64; for checks)."""
        src = self.src_rows.to(torch.int64)[self.indices.to(torch.int64)]
        return torch.stack([src, self.dst_local() + self.dst_lo])

    def __repr__(self) -> str:
        return (
            f"Tile(col={self.col}, row={self.row}, dst=[{self.dst_lo}, {self.dst_hi}), "
            f"src=[{self.src_lo}, {self.src_hi}), edges={self.num_edges}, src_rows={self.num_src_rows})"
        )


class Summary(NamedTuple):
    """Min / median / max of a per-tile quantity (all 0 when there are no tiles)."""

    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: torch.Tensor) -> Summary:
        if values.numel() == 0:
            return cls(0, 0, 0)
        v = values.numpy()
        return cls(v.min().item(), float(np.median(v)), v.max().item())

    def __str__(self) -> str:
        def f(x: float) -> str:
            return f"{x:.3g}" if isinstance(x, float) and not float(x).is_integer() else f"{int(x)}"

        return f"min {f(self.min)} / median {f(self.median)} / max {f(self.max)}"


@dataclass(frozen=True, eq=False)
class TileStats:
    """Per-tile sizes of a grid (over non-empty tiles, in column-major tile order).

    Attributes:
        num_tiles: grid cells ``P * Q`` (empty ones included).
        num_nonempty: tiles with at least one edge.
        edges_per_tile: ``[num_nonempty]`` int64.
        src_rows_per_tile: ``[num_nonempty]`` int64 source rows touched.
        dst_rows_per_tile: ``[num_nonempty]`` int64 destination interval size.
        touched_fraction: ``[num_nonempty]`` float64 ``src_rows / src interval size``.
    """

    num_tiles: int
    num_nonempty: int
    edges_per_tile: torch.Tensor
    src_rows_per_tile: torch.Tensor
    dst_rows_per_tile: torch.Tensor
    touched_fraction: torch.Tensor

    @property
    def edges(self) -> Summary:
        return Summary.of(self.edges_per_tile)

    @property
    def src_rows(self) -> Summary:
        return Summary.of(self.src_rows_per_tile)

    @property
    def touched(self) -> Summary:
        return Summary.of(self.touched_fraction)

    def num_selective(self, threshold: float = 0.5) -> int:
        """Tiles touching less than ``threshold`` of their source interval (copy only those rows)."""
        return int((self.touched_fraction < threshold).sum())

    @classmethod
    def from_counts(
        cls,
        edges: torch.Tensor,
        src_rows: torch.Tensor,
        dst_bounds: torch.Tensor,
        src_bounds: torch.Tensor,
    ) -> TileStats:
        """Stats from ``[P, Q]`` matrices of tile edges and touched source rows."""
        p_count, q_count = edges.shape
        nz = edges > 0
        d_size = (dst_bounds[1:] - dst_bounds[:-1]).view(-1, 1).expand(p_count, q_count)
        s_size = (src_bounds[1:] - src_bounds[:-1]).view(1, -1).expand(p_count, q_count)
        rows = src_rows[nz].to(torch.int64)
        return cls(
            num_tiles=p_count * q_count,
            num_nonempty=int(nz.sum()),
            edges_per_tile=edges[nz].to(torch.int64),
            src_rows_per_tile=rows,
            dst_rows_per_tile=d_size[nz].contiguous(),
            touched_fraction=rows.to(torch.float64) / s_size[nz].clamp(min=1).to(torch.float64),
        )

    def as_dict(self) -> dict[str, Any]:
        """Flat summary for logs and result files."""
        return {
            "num_tiles": self.num_tiles,
            "num_nonempty": self.num_nonempty,
            "edges": tuple(self.edges),
            "src_rows": tuple(self.src_rows),
            "touched_fraction": tuple(self.touched),
        }


@dataclass(frozen=True, eq=False)
class TileGrid:
    """The non-empty tiles of a P x Q grid, indexed by column and by row.

    Attributes:
        num_nodes: ``N``; num_edges: ``E`` of the tiled graph (all columns).
        dst_bounds: ``[P + 1]`` int64 destination interval bounds (columns).
        src_bounds: ``[Q + 1]`` int64 source interval bounds (rows).
        tiles: non-empty tiles, column-major (by ``col``, then ``row``).
        columns: the columns that were built (all ``P`` unless ``tile_graph(columns=...)``).
        index_dtype: dtype of every tile index tensor.
    """

    num_nodes: int
    num_edges: int
    dst_bounds: torch.Tensor
    src_bounds: torch.Tensor
    tiles: tuple[Tile, ...]
    columns: tuple[int, ...]
    index_dtype: torch.dtype = torch.int64
    _by_col: dict[int, tuple[Tile, ...]] = field(init=False, repr=False)
    _by_row: dict[int, tuple[Tile, ...]] = field(init=False, repr=False)
    _by_cell: dict[tuple[int, int], Tile] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        by_col: dict[int, list[Tile]] = {}
        by_row: dict[int, list[Tile]] = {}
        for t in self.tiles:  # column-major, so each list comes out sorted
            by_col.setdefault(t.col, []).append(t)
            by_row.setdefault(t.row, []).append(t)
        object.__setattr__(self, "_by_col", {k: tuple(v) for k, v in by_col.items()})
        object.__setattr__(self, "_by_row", {k: tuple(v) for k, v in by_row.items()})
        object.__setattr__(self, "_by_cell", {(t.col, t.row): t for t in self.tiles})

    @property
    def num_dst_parts(self) -> int:
        """``P``: destination intervals (columns)."""
        return int(self.dst_bounds.numel()) - 1

    @property
    def num_src_parts(self) -> int:
        """``Q``: source intervals (rows)."""
        return int(self.src_bounds.numel()) - 1

    @property
    def shape(self) -> tuple[int, int]:
        return self.num_dst_parts, self.num_src_parts

    def __len__(self) -> int:
        return len(self.tiles)

    def __iter__(self) -> Iterator[Tile]:
        return iter(self.tiles)

    def column(self, p: int) -> tuple[Tile, ...]:
        """Non-empty tiles of destination part ``p`` in row order (the forward walk)."""
        self._check_part(p, self.num_dst_parts, "column")
        return self._by_col.get(p, ())

    def row(self, q: int) -> tuple[Tile, ...]:
        """Non-empty tiles of source part ``q`` in column order (the backward walk)."""
        self._check_part(q, self.num_src_parts, "row")
        return self._by_row.get(q, ())

    def tile(self, p: int, q: int) -> Tile | None:
        """Tile ``(p, q)``, or ``None`` when it holds no edge."""
        self._check_part(p, self.num_dst_parts, "column")
        self._check_part(q, self.num_src_parts, "row")
        return self._by_cell.get((p, q))

    def dst_interval(self, p: int) -> tuple[int, int]:
        self._check_part(p, self.num_dst_parts, "column")
        return int(self.dst_bounds[p]), int(self.dst_bounds[p + 1])

    def src_interval(self, q: int) -> tuple[int, int]:
        self._check_part(q, self.num_src_parts, "row")
        return int(self.src_bounds[q]), int(self.src_bounds[q + 1])

    @staticmethod
    def _check_part(i: int, n: int, what: str) -> None:
        if not 0 <= i < n:
            raise IndexError(f"{what} index {i} out of range for {n} parts.")

    def counts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(edges [P, Q], src_rows [P, Q])`` int64 per grid cell (0 for empty tiles)."""
        p_count, q_count = self.shape
        edges = torch.zeros(p_count, q_count, dtype=torch.int64)
        rows = torch.zeros(p_count, q_count, dtype=torch.int64)
        for t in self.tiles:
            edges[t.col, t.row] = t.num_edges
            rows[t.col, t.row] = t.num_src_rows
        return edges, rows

    def stats(self) -> TileStats:
        """Per-tile edges, touched source rows and touched fractions (non-empty tiles)."""
        edges, rows = self.counts()
        return TileStats.from_counts(edges, rows, self.dst_bounds, self.src_bounds)

    def describe(self) -> str:
        """Readable multi-line summary."""
        s = self.stats()
        d_sizes = self.dst_bounds[1:] - self.dst_bounds[:-1]
        s_sizes = self.src_bounds[1:] - self.src_bounds[:-1]
        built = (
            ""
            if len(self.columns) == self.num_dst_parts
            else f" (built columns: {list(self.columns)})"
        )
        tiled_edges = int(s.edges_per_tile.sum())
        dtype = str(self.index_dtype).replace("torch.", "")
        lines = [
            (
                f"TileGrid {self.num_dst_parts} x {self.num_src_parts} (dst columns x src rows) "
                f"over {self.num_nodes} vertices, {tiled_edges} of {self.num_edges} edges{built}"
            ),
            f"  tiles: {s.num_nonempty} non-empty of {s.num_tiles}; index dtype {dtype}",
            f"  dst interval sizes: {Summary.of(d_sizes)}",
            f"  src interval sizes: {Summary.of(s_sizes)}",
            f"  edges per tile: {s.edges}",
            f"  src rows per tile: {s.src_rows}",
            (
                f"  touched fraction of src interval: {s.touched}; "
                f"{s.num_selective(0.5)} tiles touch < 50%"
            ),
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"TileGrid(P={self.num_dst_parts}, Q={self.num_src_parts}, tiles={len(self.tiles)}, "
            f"num_nodes={self.num_nodes}, num_edges={self.num_edges})"
        )


def _check_parts(k: Any, name: str) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= 1; got {type(k).__name__}.")
    if k < 1:
        raise ValueError(f"{name} must be >= 1; got {k}.")
    return int(k)


def _check_bounds(bounds: Any, k: int | None, n: int, name: str) -> torch.Tensor:
    b = torch.as_tensor(bounds)
    if b.dim() != 1 or b.numel() < 2 or b.is_floating_point() or b.dtype == torch.bool:
        raise ValueError(
            f"{name} must be a 1-D integer tensor of k + 1 >= 2 bounds; got {b.dtype} {list(b.shape)}."
        )
    b = b.to(torch.int64)
    if int(b[0]) != 0 or int(b[-1]) != n or bool((b[1:] < b[:-1]).any()):
        raise ValueError(
            f"{name} must be non-decreasing from 0 to num_nodes={n}; got {b.tolist()[:8]}"
            f"{'...' if b.numel() > 8 else ''}."
        )
    if k is not None and b.numel() != k + 1:
        raise ValueError(f"{name} has {b.numel() - 1} intervals but {k} parts were requested.")
    return b.contiguous()


def _default_dst_bounds(graph: Graph, num_parts: int) -> torch.Tensor:
    return edge_balanced_ranges(graph.indptr, num_parts)


def _default_src_bounds(graph: Graph, num_parts: int) -> torch.Tensor:
    if num_parts == 1:  # skip the out-degree pass
        return torch.tensor([0, graph.num_nodes], dtype=torch.int64)
    return edge_balanced_ranges(degree_indptr(graph.out_degrees()), num_parts)


def default_bounds(
    graph: Graph, num_dst_parts: int, num_src_parts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The intervals :func:`tile_graph` uses when none are given.

    Destinations are balanced on in-degree + 1 (:func:`edge_balanced_ranges` over the
    CSC ``indptr``), sources on out-degree + 1.

    Returns:
        ``(dst_bounds [P + 1], src_bounds [Q + 1])`` int64.
    """
    p = _check_parts(num_dst_parts, "num_dst_parts")
    q = _check_parts(num_src_parts, "num_src_parts")
    return _default_dst_bounds(graph, p), _default_src_bounds(graph, q)


def tile_graph(
    graph: Graph,
    num_dst_parts: int | None = None,
    num_src_parts: int | None = None,
    *,
    dst_bounds: torch.Tensor | Sequence[int] | None = None,
    src_bounds: torch.Tensor | Sequence[int] | None = None,
    index_dtype: torch.dtype = torch.int64,
    columns: Sequence[int] | None = None,
) -> TileGrid:
    """Cut ``graph`` into a ``P x Q`` grid of edge tiles.

    Three linear passes per column (numba): count edges per tile and collect the
    column's distinct sources; scatter the edges into tile order with a stable counting
    sort on the source part (so every tile keeps CSC order, and ``edge_ids`` increase);
    build each tile's CSR with a second stable counting sort on the compacted source id.
    Cost ``O(E + sum over columns of min(N, R log R))`` for ``R`` touched sources.

    Args:
        graph: the graph to tile.
        num_dst_parts: ``P`` (default: from ``dst_bounds``, else ``1``).
        num_src_parts: ``Q`` (default: from ``src_bounds``, else ``1``).
        dst_bounds: ``[P + 1]`` destination bounds (default: :func:`default_bounds`).
        src_bounds: ``[Q + 1]`` source bounds (default: :func:`default_bounds`).
        index_dtype: ``torch.int64`` (default) or ``torch.int32`` for all tile indices.
        columns: build only these columns (default: all); a rank's own columns.

    Returns:
        A :class:`TileGrid`.
    """
    n, num_edges = graph.num_nodes, graph.num_edges
    if index_dtype not in _INDEX_DTYPES:
        raise ValueError(f"index_dtype must be torch.int64 or torch.int32; got {index_dtype}.")
    if index_dtype == torch.int32 and idtype_for(max(n, num_edges)) != torch.int32:
        raise ValueError(
            f"index_dtype=torch.int32 cannot address {n} vertices / {num_edges} edges; use torch.int64."
        )
    p_req = None if num_dst_parts is None else _check_parts(num_dst_parts, "num_dst_parts")
    q_req = None if num_src_parts is None else _check_parts(num_src_parts, "num_src_parts")
    if dst_bounds is not None:
        d_b = _check_bounds(dst_bounds, p_req, n, "dst_bounds")
    else:
        d_b = _default_dst_bounds(graph, p_req or 1)
    if src_bounds is not None:
        s_b = _check_bounds(src_bounds, q_req, n, "src_bounds")
    else:
        s_b = _default_src_bounds(graph, q_req or 1)
    num_p = d_b.numel() - 1
    if columns is None:
        cols = tuple(range(num_p))
    else:
        cols = tuple(sorted({int(c) for c in columns}))
        if cols and not (0 <= cols[0] and cols[-1] < num_p):
            raise ValueError(f"columns must be in [0, {num_p}); got {list(columns)}.")

    tiles = build_columns(graph, d_b, s_b, cols, index_dtype)
    return TileGrid(n, num_edges, d_b, s_b, tuple(tiles), cols, index_dtype)


def build_columns(
    graph: Graph,
    d_b: torch.Tensor,
    s_b: torch.Tensor,
    cols: tuple[int, ...],
    index_dtype: torch.dtype,
) -> list[Tile]:
    """The non-empty tiles of columns ``cols`` of the grid with bounds ``d_b`` / ``s_b``
    (what :func:`tile_graph` builds, for some columns only: the executor builds a
    column's tiles when it walks it)."""
    return _build_tiles(graph, d_b, s_b, cols, index_dtype) if graph.num_edges else []


def _build_tiles(
    graph: Graph,
    d_b: torch.Tensor,
    s_b: torch.Tensor,
    cols: tuple[int, ...],
    index_dtype: torch.dtype,
) -> list[Tile]:
    from ngra.partition.counts import tile_column

    n = graph.num_nodes
    num_q = s_b.numel() - 1
    if num_q >= 1 << 16:
        raise ValueError(f"at most {(1 << 16) - 1} source parts are supported; got {num_q}.")
    indptr, indices = graph.indptr.numpy(), graph.indices.numpy()
    proto = np.empty(0, dtype=np.int32 if index_dtype == torch.int32 else np.int64)
    d_list, s_list = d_b.tolist(), s_b.tolist()
    s_np = s_b.numpy()
    work = [p for p in cols if indptr[d_list[p]] != indptr[d_list[p + 1]]]

    def run(chunk: list[int]) -> list[tuple]:
        # Per-thread scratch: stamp marks sources seen in the current column.
        stamp = np.full(n, -1, dtype=np.int32)
        slot = np.empty(n, dtype=np.int64)
        return [
            tile_column(indptr, indices, d_list[p], d_list[p + 1], s_np, stamp, slot, p, proto)
            for p in chunk
        ]

    # Columns are independent and the kernel releases the GIL: one thread per core.
    threads = max(1, min(torch.get_num_threads(), len(work)))
    if threads == 1:
        outs = run(work)
    else:
        from concurrent.futures import ThreadPoolExecutor

        chunks = [work[i::threads] for i in range(threads)]
        with ThreadPoolExecutor(threads) as pool:
            parts = list(pool.map(run, chunks))
        by_col = {p: o for chunk, res in zip(chunks, parts) for p, o in zip(chunk, res)}
        outs = [by_col[p] for p in work]

    tiles: list[Tile] = []
    for p, out in zip(work, outs):
        dlo, dhi = d_list[p], d_list[p + 1]
        rows, starts, row_starts, csc_ptr, local_src, edge_ids, csr_ptr, csr_perm, csr_dst = (
            torch.from_numpy(x) for x in out
        )
        st, rs = starts.tolist(), row_starts.tolist()
        for q in range(num_q):
            s, e = st[q], st[q + 1]
            if s == e:
                continue
            r0, r1 = rs[q], rs[q + 1]
            tiles.append(
                Tile(
                    col=p,
                    row=q,
                    dst_lo=dlo,
                    dst_hi=dhi,
                    src_lo=s_list[q],
                    src_hi=s_list[q + 1],
                    indptr=csc_ptr[q],
                    indices=local_src[s:e],
                    src_rows=rows[r0:r1],
                    edge_ids=edge_ids[s:e],
                    csr_indptr=csr_ptr[r0 : r1 + 1] - csr_ptr[r0],
                    csr_indices=csr_dst[s:e],
                    csr_perm=csr_perm[s:e],
                )
            )
    return tiles
