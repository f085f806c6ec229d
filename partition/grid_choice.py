"""Choosing the tile grid ``P x Q`` from a memory budget.

Cost model
----------
The compiler describes one layer's per-tile working set as linear coefficients
(:class:`TileBytes`). For a tile with ``S`` touched source rows, ``D`` destination rows
(its column's interval) and ``E_t`` edges, the predicted bytes are::

    tile_bytes = fixed
               + prefetch_factor * bytes_per_src_row * S     # src rows, double-buffered
               + bytes_per_dst_row * D                       # resident accumulator + dst data
               + bytes_per_edge * E_t                        # edge indices, edge data, temporaries

and a grid's predicted peak is the maximum over its non-empty tiles. A column with no
edge still holds its accumulator, so it counts as a tile with ``S = E_t = 0``. Worked
example: ``fixed=1000, prefetch_factor=2, bytes_per_src_row=512, bytes_per_dst_row=1024,
bytes_per_edge=16`` and a tile with ``S=10, D=4, E_t=30`` gives
``1000 + 2*512*10 + 1024*4 + 16*30 = 15816`` bytes.

Search
------
:func:`choose_grid` returns the grid with the fewest tiles ``P * Q`` whose peak fits the
budget; among grids with the same tile count it prefers the larger ``P`` (more columns,
fewer rows). Why columns first: the destination accumulator is the one buffer that stays
resident for a whole column walk, it is sized by the column's ``D``, and only more
columns shrink it (along with the edges per tile); more rows shrink only the streamed
source rows and edges, while adding a partial accumulation per extra tile. Columns are
also the unit multi-device training hands to ranks. The price: each column re-streams
the source rows it shares with other columns; when that traffic matters more than the
accumulator, cap columns with ``max_dst_parts``. So ``3 x 1`` is tried before ``2 x 2``, and ``4 x 1``
before ``2 x 2`` before ``1 x 4``.

Intervals are cut by :func:`cost_bounds`: destinations balanced on
``bytes_per_dst_row + bytes_per_edge * in_degree``, sources on
``prefetch_factor * bytes_per_src_row * [out_degree > 0] + bytes_per_edge * out_degree``
(bytes each vertex brings into a tile). Pass the chosen bounds to
:func:`ngra.partition.tile_graph` (or use ``GridChoice.grid``).

Each candidate, in that order, is first screened by a sound lower bound computed from
degree prefix sums alone (some tile of column ``p`` holds at least ``E_col(p) / Q``
edges and all ``D_p`` destination rows; some tile of row ``q`` touches at least
``active_sources(q) / P`` source rows). Survivors are checked exactly: one ``O(E)``
numba pass counts every tile's edges and distinct source rows without building tiles.
The first exact fit is built with :func:`tile_graph` and its real tiles are checked
against the prediction (``verify=True``).

On large graphs exact passes are rationed by an estimate: the independent-edges
(configuration-model) prediction, where a tile gets ``E_col(p) * E_row(q) / E`` edges
and a source of out-degree ``d`` is touched by column ``p`` with probability
``1 - (1 - E_col(p) / E) ** d``. Candidates estimated within a margin of the budget are
always checked exactly (10% at first, then 2% beyond the largest overshoot of the
estimate seen on this graph); the others only while the exact work spent on them stays
under about ``5e7`` edge visits. A skipped candidate makes ``GridChoice.proven_minimal``
false (the choice itself is always checked exactly, so it fits). Small graphs get a
fully exact search.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import numpy as np
import torch

from ngra.graph import Graph
from ngra.partition.kway import cut_prefix
from ngra.partition.tiling import TileGrid, TileStats, tile_graph

__all__ = [
    "GridChoice",
    "TileBytes",
    "choose_grid",
    "cost_bounds",
    "format_bytes",
    "grid_peak_bytes",
    "parse_bytes",
]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------ bytes
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "m": 1024**2,
    "g": 1024**3,
    "t": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(size: float | str) -> int:
    """A memory size in bytes.

    Accepts an int (bytes), a finite float, or a string: a number with an optional unit.
    Decimal units ``kB, MB, GB, TB`` are powers of 1000, binary ``KiB, MiB, GiB, TiB``
    and the bare letters ``K, M, G, T`` powers of 1024; ``B`` or no unit is bytes.
    Units are case-insensitive. Fractions round down to whole bytes.

    Examples: ``parse_bytes("2GB") == 2_000_000_000``, ``parse_bytes("512MiB") ==
    536_870_912``, ``parse_bytes("1.5GiB") == 1_610_612_736``, ``parse_bytes(4096) == 4096``.

    Raises:
        TypeError: not an int, float or str.
        ValueError: negative, non-finite, unparsable, or unknown unit.
    """
    if isinstance(size, bool) or not isinstance(size, (int, float, str, np.integer, np.floating)):
        raise TypeError(
            f"memory size must be an int (bytes) or a string like '2GB'; got {type(size).__name__}."
        )
    if isinstance(size, (int, np.integer)):
        if size < 0:
            raise ValueError(f"memory size must be >= 0 bytes; got {size}.")
        return int(size)
    if isinstance(size, (float, np.floating)):
        if not math.isfinite(size) or size < 0:
            raise ValueError(f"memory size must be a finite number >= 0; got {size}.")
        return int(size)
    m = _BYTES_RE.match(size)
    if m is None:
        raise ValueError(
            f"cannot parse memory size {size!r}; expected a number with an optional unit, "
            "e.g. '512MB', '1.5GiB', '2G' or '4096'."
        )
    number, unit = m.group(1), m.group(2).lower()
    if unit not in _UNITS:
        raise ValueError(
            f"unknown unit {m.group(2)!r} in memory size {size!r}; use one of "
            "B, kB, MB, GB, TB (x1000), KiB, MiB, GiB, TiB or K, M, G, T (x1024)."
        )
    try:
        value = Decimal(number) * _UNITS[unit]
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only numbers
        raise ValueError(f"cannot parse memory size {size!r}.") from exc
    return int(value)  # exact: Decimal avoids 1.1 * 1000**3 float error


def format_bytes(num_bytes: float) -> str:
    """Human-readable binary size: ``format_bytes(1536) == '1.50 KiB'``, ``'512 B'``."""
    n = float(num_bytes)
    if abs(n) < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.2f} {unit}"
    raise AssertionError("unreachable")


# ------------------------------------------------------------------ cost
@dataclass(frozen=True)
class TileBytes:
    """Per-tile working-set bytes of one layer, as linear coefficients (see module docs).

    Args:
        bytes_per_src_row: bytes of one touched source row copied to the device
            (source features read by ApplyEdge, e.g. ``F * 4`` for float32).
        bytes_per_dst_row: bytes per destination row held for the whole column
            (accumulator, destination features, softmax max/sum...).
        bytes_per_edge: bytes per tile edge: index arrays, edge data, and per-edge
            temporaries of the generic path (e.g. ``hidden * 4`` for an edge MLP).
        fixed: bytes independent of the tile (parameters, workspace) (default: ``0``).
        prefetch_factor: source-row buffers alive at once (default: ``2``, double
            buffering: the next tile's rows arrive while this tile computes).
    """

    bytes_per_src_row: float
    bytes_per_dst_row: float
    bytes_per_edge: float
    fixed: float = 0
    prefetch_factor: float = 2

    def __post_init__(self) -> None:
        for name in (
            "bytes_per_src_row",
            "bytes_per_dst_row",
            "bytes_per_edge",
            "fixed",
            "prefetch_factor",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise TypeError(f"TileBytes.{name} must be a number; got {type(v).__name__}.")
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"TileBytes.{name} must be finite and >= 0; got {v}.")
        if self.prefetch_factor < 1:
            raise ValueError(
                f"TileBytes.prefetch_factor must be >= 1 (1 = no prefetch, 2 = double buffering); "
                f"got {self.prefetch_factor}."
            )

    def tile_bytes(self, src_rows: Any, dst_rows: Any, edges: Any) -> Any:
        """Predicted bytes of tiles (numbers or same-shaped tensors/arrays)."""
        return (
            self.fixed
            + self.prefetch_factor * self.bytes_per_src_row * src_rows
            + self.bytes_per_dst_row * dst_rows
            + self.bytes_per_edge * edges
        )

    def with_index_arrays(self, index_dtype: torch.dtype = torch.int64) -> TileBytes:
        """This cost plus the tile's own index arrays (see :class:`ngra.partition.Tile`).

        Adds per edge ``indices, edge_ids, csr_indices, csr_perm`` (times
        ``prefetch_factor``: the next tile's arrays are prefetched too), per source row
        ``src_rows, csr_indptr``, per destination row ``indptr`` (times ``prefetch_factor``).
        """
        isz = torch.empty((), dtype=index_dtype).element_size()
        pf = self.prefetch_factor
        return TileBytes(
            bytes_per_src_row=self.bytes_per_src_row + 2 * isz,
            bytes_per_dst_row=self.bytes_per_dst_row + pf * isz,
            bytes_per_edge=self.bytes_per_edge + pf * 4 * isz,
            fixed=self.fixed,
            prefetch_factor=pf,
        )


@dataclass(frozen=True, eq=False)
class GridChoice:
    """The grid :func:`choose_grid` picked.

    Attributes:
        num_dst_parts: ``P`` (columns); num_src_parts: ``Q`` (rows).
        predicted_peak_bytes: largest predicted tile working set (``<= budget_bytes``).
        budget_bytes: the budget it was chosen for.
        dst_bounds: ``[P + 1]``; src_bounds: ``[Q + 1]`` int64 interval bounds.
        stats: per-tile statistics of the chosen grid.
        worst_tile: ``(col, row)`` of the tile reaching the peak (``None`` without edges).
        grid: the built tiles (``None`` when ``verify=False``).
        evaluated: candidate grids checked exactly during the search.
        proven_minimal: ``True`` when every smaller candidate was ruled out exactly;
            ``False`` when some were skipped on the estimate (large graphs only).
    """

    num_dst_parts: int
    num_src_parts: int
    predicted_peak_bytes: int
    budget_bytes: int
    dst_bounds: torch.Tensor
    src_bounds: torch.Tensor
    stats: TileStats
    worst_tile: tuple[int, int] | None
    grid: TileGrid | None
    evaluated: int
    proven_minimal: bool = True

    @property
    def shape(self) -> tuple[int, int]:
        return self.num_dst_parts, self.num_src_parts

    def describe(self) -> str:
        s = self.stats
        skipped = "" if self.proven_minimal else ", some skipped by estimate"
        return "\n".join(
            [
                (
                    f"grid {self.num_dst_parts} x {self.num_src_parts}: predicted peak "
                    f"{format_bytes(self.predicted_peak_bytes)} of budget "
                    f"{format_bytes(self.budget_bytes)} (worst tile {self.worst_tile}; "
                    f"{self.evaluated} grids checked exactly{skipped})"
                ),
                f"  tiles: {s.num_nonempty} non-empty of {s.num_tiles}",
                f"  edges per tile: {s.edges}",
                f"  src rows per tile: {s.src_rows}",
                f"  touched fraction of src interval: {s.touched}",
            ]
        )

    def __repr__(self) -> str:
        return (
            f"GridChoice(P={self.num_dst_parts}, Q={self.num_src_parts}, "
            f"predicted_peak_bytes={self.predicted_peak_bytes}, budget_bytes={self.budget_bytes})"
        )


# ------------------------------------------------------------------ model
# Candidates estimated within _EST_MARGIN of the budget are always checked exactly; those
# estimated above it are checked exactly only while the edge visits spent on them stay under
# _EXACT_WORK (a few seconds), so small graphs get an exact search and large ones a fast one.
_EXACT_WORK = 50_000_000
_EST_MARGIN = 1.1


def _prefix(costs: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(costs.numel() + 1, dtype=torch.float64)
    torch.cumsum(costs, 0, out=out[1:])
    return out


class _GridModel:
    """Bounds, lower bounds, estimates and exact peaks of candidate grids of one search."""

    def __init__(self, graph: Graph, cost: TileBytes) -> None:
        self.graph, self.cost = graph, cost
        self.num_edges = graph.num_edges
        in_deg = graph.in_degrees()
        out_deg = graph.out_degrees()
        be, bdr = cost.bytes_per_edge, cost.bytes_per_dst_row
        self.bsr = bsr = cost.prefetch_factor * cost.bytes_per_src_row
        active = out_deg > 0
        # Bytes each vertex brings into a tile; edge + vertex counts when a side costs nothing.
        dst_cost = bdr + be * in_deg.double() if (bdr or be) else in_deg.double() + 1
        src_cost = (
            bsr * active.double() + be * out_deg.double() if (bsr or be) else out_deg.double() + 1
        )
        self.dst_prefix = _prefix(dst_cost)
        self.src_prefix = _prefix(src_cost)
        self.out_indptr = _prefix(out_deg.double())
        self.active_prefix = _prefix(active.double())
        self.out_deg = out_deg
        self._dst: dict[int, torch.Tensor] = {}
        self._src: dict[int, torch.Tensor] = {}
        self._hist: dict[int, np.ndarray] = {}
        self._deg_vals: np.ndarray | None = None
        self._src_part_q = -1
        self._src_part = np.zeros(0, dtype=np.int32)
        self.exact: dict[tuple[int, int], tuple[int, tuple[int, int] | None]] = {}
        self.exact_work = 0
        self.overshoot = 0.0  # largest estimate / exact seen

    # ---- intervals
    def dst(self, p: int) -> torch.Tensor:
        if p not in self._dst:
            self._dst[p] = cut_prefix(self.dst_prefix, p)
        return self._dst[p]

    def src(self, q: int) -> torch.Tensor:
        if q not in self._src:
            self._src[q] = cut_prefix(self.src_prefix, q)
        return self._src[q]

    def src_part(self, q: int) -> np.ndarray:
        """``[N]`` int32 source part of every vertex (the last one asked for is cached)."""
        if self._src_part_q != q:
            s_b = self.src(q).numpy()
            # np.repeat: torch.repeat_interleave wakes the thread pool even for tiny inputs.
            self._src_part = np.repeat(np.arange(q, dtype=np.int32), np.diff(s_b))
            self._src_part_q = q
        return self._src_part

    # ---- lower bounds
    def lower_bounds(self, p_max: int, q_max: int) -> np.ndarray:
        """``[p_max, q_max]`` lower bounds on each grid's peak from degree prefix sums."""
        cost, bsr = self.cost, self.bsr
        be, bdr = cost.bytes_per_edge, cost.bytes_per_dst_row
        qs = np.arange(1, q_max + 1, dtype=np.float64)
        max_active = np.empty(q_max)
        for q in range(1, q_max + 1):
            s_b = self.src(q)
            max_active[q - 1] = float(
                (self.active_prefix[s_b[1:]] - self.active_prefix[s_b[:-1]]).max()
            )
        indptr = self.graph.indptr
        lb = np.empty((p_max, q_max))
        for p in range(1, p_max + 1):
            d_b = self.dst(p)
            d = (d_b[1:] - d_b[:-1]).numpy().astype(np.float64)
            e_col = (indptr[d_b[1:]] - indptr[d_b[:-1]]).numpy().astype(np.float64)
            has = e_col > 0
            best = np.zeros(q_max)
            if has.any():
                # Some tile of column p holds >= ceil(E_col / Q) edges, all D_p rows, >= 1 source.
                col = bdr * d[has, None] + be * np.ceil(e_col[has, None] / qs[None, :]) + bsr
                best = np.maximum(best, col.max(0))
                # Some tile of row q touches >= ceil(active(q) / P) sources, each bringing an edge.
                n_rows = np.ceil(max_active / p)
                best = np.maximum(
                    best, np.where(max_active > 0, (bsr + be) * n_rows + bdr * d[has].min(), 0)
                )
            if (~has & (d > 0)).any():
                best = np.maximum(best, bdr * d[~has].max())
            lb[p - 1] = cost.fixed + best
        return np.ceil(lb)

    # ---- estimates
    def _degree_hist(self, q: int) -> np.ndarray:
        """``[Q, K]``: vertices of each source interval per distinct out-degree value."""
        if self._deg_vals is None:
            vals, inv = torch.unique(self.out_deg, return_inverse=True)
            self._deg_vals, self._deg_inv = vals.numpy().astype(np.float64), inv
        if q not in self._hist:
            if len(self._hist) >= 16:  # [Q, K] each: keep memory bounded, rebuilding is O(N)
                self._hist.clear()
            k = self._deg_vals.size
            part = torch.from_numpy(self.src_part(q)).long()
            self._hist[q] = (
                torch.bincount(part * k + self._deg_inv, minlength=q * k)
                .view(q, k)
                .numpy()
                .astype(np.float64)
            )
        return self._hist[q]

    def estimate(self, p: int, q: int) -> int:
        """Predicted peak if edges fell independently (configuration model).

        A source of out-degree ``d`` is touched by column ``p`` with probability
        ``1 - (1 - E_col(p) / E)^d``; tile edges are ``E_col(p) * E_row(q) / E``.
        """
        cost, e = self.cost, max(self.num_edges, 1)
        d_b, s_b = self.dst(p), self.src(q)
        d = (d_b[1:] - d_b[:-1]).numpy().astype(np.float64)
        e_col = (
            (self.graph.indptr[d_b[1:]] - self.graph.indptr[d_b[:-1]]).numpy().astype(np.float64)
        )
        e_row = (self.out_indptr[s_b[1:]] - self.out_indptr[s_b[:-1]]).numpy()
        f = np.clip(e_col / e, 0.0, 1.0)
        hist = self._degree_hist(q)
        vals = self._deg_vals
        with np.errstate(divide="ignore", invalid="ignore"):
            touch = -np.expm1(vals[None, :] * np.log1p(-f[:, None]))
        touch = np.where(vals[None, :] > 0, np.nan_to_num(touch, nan=1.0), 0.0)
        rows = touch @ hist.T  # [P, Q] expected distinct sources
        edges = np.outer(e_col, e_row) / e
        b = cost.tile_bytes(rows, d[:, None], edges)
        b = np.where(edges > 0, b, -np.inf)
        floor = cost.fixed + cost.bytes_per_dst_row * d[(e_col == 0) & (d > 0)]
        peak = max(b.max(initial=-np.inf), floor.max(initial=cost.fixed))
        return math.ceil(peak)

    # ---- exact
    def counts(self, p: int, q: int) -> tuple[np.ndarray, np.ndarray]:
        from ngra.partition.counts import grid_counts

        src_part = self.src_part(q)
        self.exact_work += self.num_edges + self.graph.num_nodes
        g = self.graph
        return grid_counts(g.indptr.numpy(), g.indices.numpy(), self.dst(p).numpy(), src_part, q)

    def peak(self, p: int, q: int, estimate: int | None = None) -> int:
        """Exact predicted peak of grid ``p x q`` (one O(E) pass; cached).

        With the candidate's ``estimate``, also records how far the estimate overshot.
        """
        if (p, q) not in self.exact:
            edges, rows = self.counts(p, q)
            self.exact[(p, q)] = _peak(self.cost, edges, rows, self.dst(p))
            if estimate is not None and self.exact[(p, q)][0] > 0:
                self.overshoot = max(self.overshoot, estimate / self.exact[(p, q)][0])
        return self.exact[(p, q)][0]

    def margin(self) -> float:
        """How far over budget an estimate may be and still earn an exact check.

        ``_EST_MARGIN`` until some exact checks are in; then 2% beyond the largest
        overshoot seen, so the estimate's error on this graph sets the margin.
        """
        if self.overshoot == 0.0:
            return _EST_MARGIN
        return 1.02 * max(1.0, self.overshoot)


def cost_bounds(
    graph: Graph, num_dst_parts: int, num_src_parts: int, cost: TileBytes
) -> tuple[torch.Tensor, torch.Tensor]:
    """The intervals :func:`choose_grid` evaluates for a ``P x Q`` grid (see module docs).

    Returns:
        ``(dst_bounds [P + 1], src_bounds [Q + 1])`` int64.
    """
    model = _GridModel(graph, cost)
    return model.dst(int(num_dst_parts)), model.src(int(num_src_parts))


# ------------------------------------------------------------------ exact peak
def _tile_bytes_matrix(
    cost: TileBytes,
    edges: np.ndarray,
    rows: np.ndarray,
    dst_bounds: torch.Tensor,
) -> np.ndarray:
    """``[P, Q]`` predicted bytes; -inf for empty tiles, except one cell per edgeless column."""
    d = (dst_bounds[1:] - dst_bounds[:-1]).numpy().astype(np.float64)[:, None]
    b = cost.tile_bytes(rows.astype(np.float64), d, edges.astype(np.float64))
    b = np.where(edges > 0, b, -np.inf)
    # A column without edges still holds its accumulator: count it once, as (S, E) = (0, 0).
    empty_col = (edges.sum(1) == 0) & (d[:, 0] > 0)
    if empty_col.any():
        b[empty_col, 0] = cost.fixed + cost.bytes_per_dst_row * d[empty_col, 0]
    return b


def _peak(
    cost: TileBytes, edges: np.ndarray, rows: np.ndarray, dst_bounds: torch.Tensor
) -> tuple[int, tuple[int, int] | None]:
    b = _tile_bytes_matrix(cost, edges, rows, dst_bounds)
    if b.size == 0 or not np.isfinite(b).any():
        return math.ceil(cost.fixed), None
    flat = int(np.argmax(b))
    p, q = divmod(flat, b.shape[1])
    worst = (p, q) if edges[p, q] > 0 else None
    return math.ceil(b[p, q]), worst


def grid_peak_bytes(grid: TileGrid, cost: TileBytes) -> int:
    """Predicted peak bytes of a built grid (max tile working set, see module docs).

    Only built columns count when the grid was made with ``tile_graph(columns=...)``.
    """
    edges, rows = grid.counts()
    if len(grid.columns) != grid.num_dst_parts:
        keep = torch.zeros(grid.num_dst_parts, dtype=torch.bool)
        keep[list(grid.columns)] = True
        edges[~keep] = -1  # neither a tile nor an empty column
    return _peak(cost, edges.numpy(), rows.numpy(), grid.dst_bounds)[0]


# ------------------------------------------------------------------ search
def choose_grid(
    graph: Graph,
    cost: TileBytes,
    budget_bytes: int | str,
    *,
    max_parts: int = 256,
    max_dst_parts: int | None = None,
    max_src_parts: int | None = None,
    verify: bool = True,
    index_dtype: torch.dtype = torch.int64,
) -> GridChoice:
    """The smallest ``P x Q`` grid whose largest tile fits ``budget_bytes``.

    Smallest means fewest tiles ``P * Q``, ties broken toward larger ``P`` (see the
    module docstring for the search order, the cost model and why). Candidates are
    screened by a sound lower bound, then checked exactly. On large graphs, candidates
    the independent-edges estimate puts far over budget are skipped once a few seconds
    of exact checks are spent; ``GridChoice.proven_minimal`` says whether that happened.

    Args:
        graph: the graph (after any reordering).
        cost: the layer's :class:`TileBytes`.
        budget_bytes: device memory available to one tile, bytes or a string ("2GB").
        max_parts: cap on both ``P`` and ``Q`` (default: ``256``; never above ``N``).
        max_dst_parts, max_src_parts: separate caps (default: ``max_parts``).
        verify: build the chosen grid with :func:`tile_graph`, check its real tiles
            against the prediction and return it in ``GridChoice.grid`` (default: ``True``).
        index_dtype: index dtype of the built grid (default: ``torch.int64``).

    Returns:
        A :class:`GridChoice`.

    Raises:
        ValueError: no allowed grid fits; the message names the smallest budget that
            works and why (fixed cost, or a heavy vertex's in-edges).
    """
    budget = parse_bytes(budget_bytes)
    if not isinstance(cost, TileBytes):
        raise TypeError(f"cost must be a TileBytes; got {type(cost).__name__}.")
    for name, v in (
        ("max_parts", max_parts),
        ("max_dst_parts", max_dst_parts),
        ("max_src_parts", max_src_parts),
    ):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
            raise ValueError(f"{name} must be an int >= 1; got {v!r}.")
    n = graph.num_nodes
    p_max = max(1, min(max_dst_parts or max_parts, n))
    q_max = max(1, min(max_src_parts or max_parts, n))
    if p_max == q_max == 1 and not verify:
        whole = _one_tile(graph, cost, budget)
        if whole is not None:
            return whole
    model = _GridModel(graph, cost)
    lb = model.lower_bounds(p_max, q_max)

    # Candidates (P, Q) by (P * Q, -P): fewest tiles, then more columns.
    pp, qq = np.meshgrid(np.arange(1, p_max + 1), np.arange(1, q_max + 1), indexing="ij")
    pp, qq, lbf = pp.ravel(), qq.ravel(), lb.ravel()
    order = np.lexsort((-pp, pp * qq))
    proven = True
    unlikely_work = 0  # exact passes spent on candidates the estimate says cannot fit
    for i in order:
        if lbf[i] > budget:
            continue
        p, q = int(pp[i]), int(qq[i])
        est = model.estimate(p, q)
        if est > model.margin() * budget:
            if unlikely_work + model.num_edges > _EXACT_WORK:
                proven = False  # almost surely too big; not worth an O(E) pass on a large graph
                continue
            unlikely_work += model.num_edges + n
        if model.peak(p, q, est) <= budget:
            return _finish(model, budget, p, q, verify, index_dtype, proven)

    raise ValueError(_too_small_message(model, budget, pp, qq, lbf, p_max, q_max))


def _one_tile(graph: Graph, cost: TileBytes, budget: int) -> GridChoice | None:
    """The ``1 x 1`` grid when it fits ``budget``, else ``None``: the one candidate, priced
    without the search's per-vertex prefix arrays (a byte a vertex here, where the search
    holds about 80: 670 MB of temporaries at R-MAT 2^23, beside a layer's activations)."""
    n, e = graph.num_nodes, graph.num_edges
    seen = torch.zeros(n, dtype=torch.bool)
    for ids in graph.indices.split(1 << 22):  # indexing widens ids to int64: 32 MiB at a time
        seen[ids] = True
    edges, rows = np.array([[e]], dtype=np.int64), np.array([[int(seen.sum())]], dtype=np.int64)
    del seen
    bounds = torch.tensor([0, n], dtype=torch.int64)
    peak, worst = _peak(cost, edges, rows, bounds)
    if peak > budget:
        return None
    stats = TileStats.from_counts(torch.from_numpy(edges), torch.from_numpy(rows), bounds, bounds)
    log.info("choose_grid: 1 x 1, predicted peak %s of %s", format_bytes(peak),
             format_bytes(budget))
    return GridChoice(1, 1, peak, budget, bounds, bounds.clone(), stats, worst, None, 1, True)


def _finish(
    model: _GridModel,
    budget: int,
    p: int,
    q: int,
    verify: bool,
    index_dtype: torch.dtype,
    proven: bool,
) -> GridChoice:
    graph, cost = model.graph, model.cost
    d_b, s_b = model.dst(p), model.src(q)
    peak, worst = model.exact[(p, q)]
    grid = None
    if verify:
        grid = tile_graph(graph, dst_bounds=d_b, src_bounds=s_b, index_dtype=index_dtype)
        real = grid_peak_bytes(grid, cost)
        if real != peak:
            raise RuntimeError(
                f"internal error: grid {p} x {q} predicted {peak} bytes but its tiles need {real}; "
                "please report this with the graph."
            )
        stats = grid.stats()
    else:
        edges, rows = model.counts(p, q)
        stats = TileStats.from_counts(torch.from_numpy(edges), torch.from_numpy(rows), d_b, s_b)
    choice = GridChoice(p, q, peak, budget, d_b, s_b, stats, worst, grid, len(model.exact), proven)
    log.info(
        "choose_grid: %d x %d, predicted peak %s of %s (%d grids checked exactly%s)",
        p,
        q,
        format_bytes(peak),
        format_bytes(budget),
        len(model.exact),
        "" if proven else "; some skipped by estimate",
    )
    return choice


def _too_small_message(
    model: _GridModel,
    budget: int,
    pp: np.ndarray,
    qq: np.ndarray,
    lbf: np.ndarray,
    p_max: int,
    q_max: int,
) -> str:
    # Branch and bound over all allowed grids, by lower bound, for the smallest exact peak.
    graph, cost = model.graph, model.cost
    best = min((v[0] for v in model.exact.values()), default=math.inf)
    exact = True
    start_work = model.exact_work
    for i in np.argsort(lbf, kind="stable"):
        if lbf[i] >= best:
            break
        if model.exact_work - start_work > _EXACT_WORK and best < math.inf:
            exact = False
            break
        best = min(best, model.peak(int(pp[i]), int(qq[i])))
    (bp, bq), (peak, worst) = min(
        model.exact.items(), key=lambda kv: (kv[1][0], kv[0][0] * kv[0][1], -kv[0][0])
    )
    msg = [
        (
            f"memory budget {format_bytes(budget)} ({budget} bytes) is too small for this graph "
            f"and layer: no grid up to {p_max} x {q_max} fits."
        )
    ]
    if exact:
        msg.append(
            f"The smallest budget that works is {format_bytes(peak)} ({peak} bytes), with the {bp} x {bq} grid."
        )
    else:
        floor = int(lbf.min())
        msg.append(
            f"A budget of {format_bytes(peak)} ({peak} bytes) works with the {bp} x {bq} grid "
            f"(the smallest workable budget is at least {format_bytes(floor)})."
        )
    if cost.fixed > budget:
        msg.append(
            f"The fixed cost alone ({format_bytes(cost.fixed)}: parameters, workspace) exceeds the budget."
        )
    elif worst is not None:
        d_b = model.dst(bp)
        p, q = worst
        d_lo, d_hi = int(d_b[p]), int(d_b[p + 1])
        edges, rows = model.counts(bp, bq)
        in_deg = graph.in_degrees()
        heavy = int(torch.argmax(in_deg[d_lo:d_hi])) + d_lo
        msg.append(
            f"Its largest tile (column {p}, row {q}) has {d_hi - d_lo} destination row(s), "
            f"{int(rows[p, q])} source row(s) and {int(edges[p, q])} edge(s); its heaviest "
            f"destination, vertex {heavy}, has in-degree {int(in_deg[heavy])}."
        )
    msg.append(
        "Raise the budget, allow more parts (max_parts), reorder the graph for locality, "
        "or reduce the per-row/per-edge bytes (narrower features, fused kernels)."
    )
    return " ".join(msg)
