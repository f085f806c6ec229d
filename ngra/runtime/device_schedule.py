"""The schedule of a layer streamed through a device whose memory does not hold the data.

NGra's chunk streaming with the device doing all the work (:mod:`ngra.runtime.device_stream`
runs it): the vertices are cut into ``k`` contiguous intervals, and one set of bounds
serves three roles, so that every chunk that crosses the bus is one contiguous block of
host rows:

* **row chunks** of the vertex-side stages (``pre`` and its backward),
* **columns** (destination intervals: forward keeps a column's accumulator on the
  device while its tiles stream by, then runs ``apply_vertex`` on it),
* **source chunks** (the rows a tile's edges read): tile ``(c, q)`` holds the edges from
  interval ``q`` into column ``c``, with source ids local to the interval.

Bounds balance the vertices' rows and edges together (``in + out degree + mean degree``
per vertex), so that no interval's rows or tiles dwarf the others'.

:class:`Schedule` is what :func:`choose_schedule` prices from a device budget: the
smallest ``k`` whose peak device bytes (:func:`price`) fit, and as many source chunks kept
on the device at once (``cache``) as the rest of the budget holds; when all ``k`` fit, a
layer's terms stay on the device for its whole forward and never cross the bus. The
bytes a schedule moves per layer are counted analytically by :func:`moved_bytes` (the
tests check the copies' own count against it), and :meth:`Schedule.describe` is what
``ngra explain --device cuda`` prints.

:class:`HostTiles` holds the grid's index arrays in page-locked host memory, int32, built
once per graph and bounds: what each tile's copy to the device reads.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from ngra.graph import Graph
from ngra.kernels.registry import thread_setting
from ngra.partition import degree_indptr, edge_balanced_ranges
from ngra.runtime.tiles import tile_counts
from ngra.runtime.transfer import pinned_empty
from ngra.partition import tile_graph

__all__ = ["HostTiles", "RowBytes", "Schedule", "choose_schedule", "device_streaming",
           "host_tiles", "interval_bounds", "moved_bytes", "price", "streaming_settings"]

_state = threading.local()

#: Device bytes the schedule leaves for what it does not price (the CUDA context's
#: workspaces, the caching allocator's rounding and fragmentation).
RESERVE_FRACTION = 0.1


@dataclass(frozen=True)
class StreamingSettings:
    """An active :func:`device_streaming` block."""

    device: torch.device
    budget: int | None
    parts: int | None
    cache: int | None


@contextlib.contextmanager
def device_streaming(device: str | torch.device, budget: int | None = None,
                     parts: int | None = None, cache: int | None = None) -> Iterator[None]:
    """Run every SAGA layer called in the block with host-resident vertex data streamed
    through ``device`` (:mod:`ngra.runtime.device_stream`).

    Args:
        device: the compute device, ``"cuda[:N]"``; ``"cpu"`` runs the same schedule
            with the CPU standing in for the device (tests).
        budget: device bytes a layer may use (default: the device's free memory less
            :data:`RESERVE_FRACTION`; required for the CPU stand-in unless ``parts``).
        parts: force ``k`` intervals (default: the smallest that fits ``budget``).
        cache: force the number of source chunks kept on the device (default: what
            ``budget`` holds).
    """
    device = torch.device(device)
    if parts is not None and (isinstance(parts, bool) or not isinstance(parts, int)
                              or parts < 1):
        raise ValueError(f"parts must be an int >= 1; got {parts!r}.")
    if cache is not None and (isinstance(cache, bool) or not isinstance(cache, int)
                              or cache < 1):
        raise ValueError(f"cache must be an int >= 1 (source chunks on the device); "
                         f"got {cache!r}.")
    if budget is None and parts is None and device.type != "cuda":
        raise ValueError("device_streaming on the CPU stand-in needs budget= or parts=.")
    with thread_setting(_state, "settings", StreamingSettings(device, budget, parts, cache)):
        yield


def streaming_settings() -> StreamingSettings | None:
    """The innermost active :func:`device_streaming` block's settings, or ``None``."""
    return getattr(_state, "settings", None)


@dataclass(frozen=True)
class RowBytes:
    """What a layer call moves: bytes per vertex row, per edge, and how its backward runs.

    Attributes:
        x: the layer input. terms: the terms the edge stage reads (both sides).
        dst_terms: the destination-side terms (kept on the host for backward).
        acc: the gathered value. stats: the accumulator's extra row state for backward
            (a softmax's log-sum-exp).
        out: the layer output.
        deg: an in-degree. factors: per-vertex edge factors (GCN's two, else 0).
        edge: edge data bytes per edge (0 for per-vertex factors or none).
        counter: attention-dropout counter bytes per edge (0 without one).
        edge_temp: device bytes per edge of the edge stage's own temporaries (0 for a
            fused kernel, the message rows for a generic one).
        params: the parameters with gradients and optimizer state (4 copies).
        gather: the accumulator (``sum``, ``mean``, ``max``, ``min``, ``softmax``).
        post_reads_x: ``apply_vertex`` reads the layer input (it is sent again per column).
        x_grad: the input needs a gradient.
        propagate: some term (or edge-stage parameter) needs a gradient: backward walks
            the tiles (GCN's first layer does not).
        src_grad: bytes per row of the source-side terms that need gradients.
        dst_grad: bytes per row of the destination-side terms that need gradients (when
            nonzero, ``pre``'s backward waits for a third pass).
    """

    x: int
    terms: int
    dst_terms: int
    acc: int
    stats: int
    out: int
    deg: int = 8
    factors: int = 0
    edge: int = 0
    counter: int = 0
    edge_temp: int = 0
    params: int = 0
    gather: str = "sum"
    post_reads_x: bool = True
    x_grad: bool = False
    propagate: bool = True
    src_grad: int = 0
    dst_grad: int = 0


INDEX_BYTES = 4  # tiles' index arrays are int32


def interval_bounds(graph: Graph, k: int) -> tuple[int, ...]:
    """``k + 1`` bounds cutting the vertices into ``k`` intervals of about equal rows +
    edges (:func:`~ngra.partition.edge_balanced_ranges` over in + out degree, each vertex
    weighing the mean degree besides); an interval that would be empty is dropped."""
    n = graph.num_nodes
    if k <= 1 or n <= 1:
        return (0, n)
    degrees = graph.cached(  # in + out degree offsets: one O(E) count per graph
        "ngra.device-schedule-degrees",
        lambda: degree_indptr(graph.in_degrees().long() + graph.out_degrees()))
    mean = max(graph.num_edges / n, 1.0)
    b = edge_balanced_ranges(degrees, min(k, n), vertex_cost=mean)
    return tuple(int(v) for v in torch.unique(b))


def _tile_edges(graph: Graph, bounds: tuple[int, ...]) -> np.ndarray:
    """``[k, k]`` edges of tile ``(column, source chunk)``."""
    edges, _ = tile_counts(graph, bounds, bounds)
    return np.asarray(edges, dtype=np.int64)


@dataclass(frozen=True)
class Schedule:
    """How one layer streams through the device (see the module docstring).

    Attributes:
        device: the compute device.
        bounds: ``k + 1`` interval bounds (row chunks = columns = source chunks).
        cache: source chunks kept on the device at once (``k``: the terms stay resident).
        budget: the device budget priced against (``None``: forced).
        peak: the predicted device peak bytes of the layer.
        rows: the :class:`RowBytes` it was priced from.
        tile_edges: ``[k][k]`` edges of each tile.
    """

    device: torch.device
    bounds: tuple[int, ...]
    cache: int
    budget: int | None
    peak: int
    rows: RowBytes
    tile_edges: tuple[tuple[int, ...], ...] = field(repr=False)

    @property
    def k(self) -> int:
        return len(self.bounds) - 1

    @property
    def resident_terms(self) -> bool:
        """All source chunks fit on the device: the terms never leave it in forward."""
        return self.cache >= self.k

    def order(self, c: int) -> list[int]:
        """The source chunks column ``c`` walks, in the order that reuses the chunks the
        previous column left on the device (a zigzag: even columns up, odd ones down)."""
        qs = [q for q in range(self.k) if self.tile_edges[c][q]]
        return qs if c % 2 == 0 else qs[::-1]

    def describe(self) -> str:
        mib = 2**20
        k = self.k
        moved = moved_bytes(self)
        lines = [
            f"device streaming on {self.device}: {k} x {k} tiles over {k} vertex intervals "
            f"(columns = source chunks = row chunks), "
            + ("terms resident on the device during forward"
               if self.resident_terms else f"{self.cache} source chunk(s) kept on the device"),
            f"  predicted device peak {self.peak / mib:,.0f} MiB"
            + (f" of a {self.budget / mib:,.0f} MiB budget" if self.budget else ""),
            f"  per layer call: forward host->device {moved['fwd_h2d'] / mib:,.1f} MiB, "
            f"device->host {moved['fwd_d2h'] / mib:,.1f} MiB; backward host->device "
            f"{moved['bwd_h2d'] / mib:,.1f} MiB, device->host {moved['bwd_d2h'] / mib:,.1f} MiB"
            f"; source chunks copied in {moved['fetches']}, found on the device "
            f"{moved['reuses']}",
        ]
        return "\n".join(lines)


def _rows(bounds: tuple[int, ...]) -> np.ndarray:
    return np.diff(np.asarray(bounds, dtype=np.int64))


def price(rows: RowBytes, bounds: tuple[int, ...], tile_edges: np.ndarray, cache: int) -> int:
    """Predicted device peak bytes of a layer's forward and backward under a schedule.

    Forward (a column): the column's destination terms, accumulator state and partial,
    ``apply_vertex``'s input rows and temporaries, ``cache`` source chunks plus one
    arriving, and two tiles' index arrays and edge data (one computing, one arriving).
    Backward (a source chunk): the chunk's input and terms with their gradient and its
    recomputed ``pre``, a column's gradient, statistics and destination terms twice (one
    computing, one arriving), two tiles with their reverse structure, and the whole
    graph's destination-term gradients when the edge stage makes them. Pre (a row
    chunk): two input chunks and the terms they make (every chunk's, when the terms stay
    on the device). Plus in-degrees and edge factors of every vertex, and the parameters
    with their gradients and optimizer state.
    """
    r = _rows(bounds)
    m = int(r.max()) if r.size else 0
    n = int(r.sum())
    e = int(tile_edges.max()) if tile_edges.size else 0
    fixed = rows.params + n * (rows.deg + rows.factors)
    per_edge = rows.edge + rows.counter + rows.edge_temp
    tile_f = e * (INDEX_BYTES + per_edge) + (m + 1) * INDEX_BYTES
    tile_b = e * (3 * INDEX_BYTES + per_edge) + 2 * (m + 1) * INDEX_BYTES
    col = m * (rows.dst_terms + 2 * (rows.acc + rows.stats) + 3 * rows.out
               + (rows.x if rows.post_reads_x else 0))
    chunks = len(r) if cache >= len(r) else cache + 1
    fwd = col + chunks * m * rows.terms + 2 * tile_f
    bwd = m * (2 * rows.x + 3 * rows.terms) + 2 * m * (2 * rows.acc + rows.stats
                                                       + rows.dst_terms) + 2 * tile_b
    bwd += n * rows.dst_grad
    pre = m * (2 * rows.x + 2 * rows.terms)
    if cache >= len(r):
        pre += n * rows.terms  # every chunk's terms stay on the device
    return int(fixed + max(fwd, bwd, pre))


def moved_bytes(s: Schedule) -> dict[str, int]:
    """Bytes one layer call moves each way under ``s``, as its copies count them, and how
    many source chunks forward copies in and how many it finds on the device already."""
    rows, k = s.rows, s.k
    r = _rows(s.bounds)
    n = int(r.sum())
    e = np.asarray(s.tile_edges, dtype=np.int64).reshape(k, k)
    edges = int(e.sum())
    tiles = [(c, q) for c in range(k) for q in range(k) if e[c, q]]
    per_edge = rows.edge + rows.counter
    fetched, reuses = _fetches(s)
    # forward: degrees and factors; every input chunk; the terms back (unless they stay)
    # and the destination terms for backward; source chunks; each tile's structure, edge
    # data and counters; x again per column when apply_vertex reads it; the output, the
    # gathered value and its statistics back
    f_h2d = n * (rows.deg + rows.factors) + n * rows.x
    f_h2d += sum(int(r[q]) for q in fetched) * rows.terms
    f_h2d += sum(int(r[c]) + 1 for c, _ in tiles) * INDEX_BYTES + edges * (INDEX_BYTES
                                                                          + per_edge)
    f_h2d += n * rows.x if rows.post_reads_x else 0
    f_d2h = n * (rows.out + rows.acc + rows.stats + rows.dst_terms)
    f_d2h += 0 if s.resident_terms else n * rows.terms
    # backward, per column: the output gradient and the saved value (and x); the value's
    # gradient back
    b_h2d = n * (rows.out + rows.acc) + (n * rows.x if rows.post_reads_x else 0)
    b_d2h = n * rows.acc
    if rows.propagate or rows.x_grad:
        b_h2d += n * rows.x  # per source chunk: its input, pre recomputed
    if rows.propagate:
        saved = rows.acc if rows.gather not in ("sum", "mean") else 0
        b_h2d += sum(int(r[c]) for c, _ in tiles) * (rows.acc + saved + rows.stats
                                                     + rows.dst_terms)
        b_h2d += sum(int(r[c]) + int(r[q]) + 2 for c, q in tiles) * INDEX_BYTES \
            + edges * (3 * INDEX_BYTES + per_edge)
    if rows.dst_grad and rows.propagate:
        b_d2h += n * rows.src_grad  # source-term gradients wait on the host for pass 3
        b_h2d += n * (rows.x + rows.src_grad)
    if rows.x_grad:
        b_d2h += n * rows.x
    return {"fwd_h2d": f_h2d, "fwd_d2h": f_d2h, "bwd_h2d": b_h2d, "bwd_d2h": b_d2h,
            "fetches": len(fetched), "reuses": reuses}


def _fetches(s: Schedule) -> tuple[list[int], int]:
    """The source chunks forward copies to the device, in order, and how many chunk
    uses found theirs there already (an LRU of ``s.cache`` chunks; each column takes its
    own chunk for its destination terms, then the source chunks of its tiles)."""
    if s.resident_terms:
        return [], sum(1 + len(s.order(c)) for c in range(s.k))
    lru: list[int] = []
    fetched, reused = [], 0
    for c in range(s.k):
        uses = [c] + s.order(c)
        if not s.order(c):
            uses.append(c)  # an empty column's tile reads its own chunk
        for q in uses:
            if q in lru:
                lru.remove(q)
                reused += 1
            else:
                fetched.append(q)
                if len(lru) >= s.cache:
                    lru.pop(0)
            lru.append(q)
    return fetched, reused


def choose_schedule(graph: Graph, rows: RowBytes, device: torch.device, budget: int | None,
                    parts: int | None = None, cache: int | None = None) -> Schedule:
    """The schedule of a layer whose rows cost ``rows``: the smallest ``k`` (of 1, 2, 4,
    ...; ``parts`` forces one) whose :func:`price` with one cached source chunk fits
    ``budget`` less :data:`RESERVE_FRACTION`, then the most source chunks that still fit
    (``cache`` forces a number).

    Raises:
        ValueError: no ``k`` up to the vertex count fits: the message says what the
            smallest schedule needs.
    """
    usable = None if budget is None else int(budget * (1 - RESERVE_FRACTION))
    ks = [parts] if parts is not None else [2**i for i in range(0, 31)
                                            if 2**i <= max(graph.num_nodes, 1)]
    best = None
    for k in ks:
        bounds = interval_bounds(graph, k)
        edges = _tile_edges(graph, bounds)
        kk = len(bounds) - 1
        if cache is not None:
            c = min(cache, kk)
        elif usable is None:
            c = kk
        else:
            c = 1
            if price(rows, bounds, edges, 1) <= usable:
                for c in range(kk, 0, -1):
                    if price(rows, bounds, edges, c) <= usable:
                        break
        peak = price(rows, bounds, edges, c)
        best = Schedule(device, bounds, c, budget, peak, rows,
                        tuple(tuple(int(v) for v in row) for row in edges))
        if usable is None or peak <= usable or parts is not None:
            return best
    assert best is not None
    mib = 2**20
    raise ValueError(
        f"device streaming: no schedule fits a {budget / mib:,.0f} MiB device budget; the "
        f"finest ({best.k} x {best.k} tiles) needs {best.peak / mib:,.0f} MiB (its largest "
        f"tile holds {max(max(r) for r in best.tile_edges):,} edges). Give a larger "
        "--memory-budget, or train on the CPU.")


# ------------------------------------------------------------------ host tiles
class HostTiles:
    """The index arrays of every tile of ``bounds``, int32, in page-locked host memory.

    Per tile ``(c, q)``: ``indptr`` ``[D + 1]`` over the column's destinations,
    ``src`` ``[E_t]`` sources local to interval ``q``, ``rev_ptr`` ``[S_q + 1]`` over
    the interval's rows, ``rev_idx`` ``[E_t]`` local destinations, ``rev_perm`` ``[E_t]``
    tile-CSC positions, and (host only, int64) ``edge_ids`` ``[E_t]``: the edges' CSC
    positions in the graph, for edge data and attention-dropout counters.
    """

    def __init__(self, graph: Graph, bounds: tuple[int, ...], device: torch.device) -> None:
        b = torch.tensor(bounds, dtype=torch.int64)
        grid = tile_graph(graph, dst_bounds=b, src_bounds=b, index_dtype=torch.int32)
        self.bounds = bounds
        self.arrays: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        for t in grid:
            lo, hi = bounds[t.row], bounds[t.row + 1]
            local = (t.src_rows.long() - lo).to(torch.int32)
            per_row = torch.zeros(hi - lo, dtype=torch.int64)
            per_row[local.long()] = (t.csr_indptr[1:] - t.csr_indptr[:-1]).long()
            rev_ptr = torch.zeros(hi - lo + 1, dtype=torch.int64)
            torch.cumsum(per_row, 0, out=rev_ptr[1:])
            arrays = {"indptr": t.indptr, "src": local.index_select(0, t.indices.long()),
                      "rev_ptr": rev_ptr.to(torch.int32), "rev_idx": t.csr_indices,
                      "rev_perm": t.csr_perm}
            self.arrays[(t.col, t.row)] = {k: _pin(v.to(torch.int32), device)
                                           for k, v in arrays.items()}
            self.arrays[(t.col, t.row)]["edge_ids"] = t.edge_ids.long()
        self._gathered: dict[tuple, tuple[weakref.ref, int, dict]] = {}
        self._ids: dict[tuple[int, int], torch.Tensor] | None = None
        self.id_dtype = torch.int32 if graph.num_edges < 2**31 else torch.int64

    def edge_counters(self, device: torch.device) -> dict[tuple[int, int], torch.Tensor]:
        """Every tile's edge CSC positions as attention-dropout counters (the identity
        counter), int32 where the graph's edges fit, page-locked, made once."""
        if self._ids is None:
            self._ids = {key: _pin(a["edge_ids"].to(self.id_dtype), device)
                         for key, a in self.arrays.items()}
        return self._ids

    def gathered(self, name: str, t: torch.Tensor, device: torch.device
                 ) -> dict[tuple[int, int], torch.Tensor]:
        """``t[edge_ids]`` of every tile (``t``: ``[E, ...]`` edge data or counters in CSC
        order), page-locked, made once while ``t`` lives unmodified."""
        hit = self._gathered.get((name, id(t)))
        if hit is not None and hit[0]() is t and hit[1] == t._version:
            return hit[2]
        out = {key: _pin(t.index_select(0, a["edge_ids"]), device)
               for key, a in self.arrays.items()}
        self._gathered = {k: v for k, v in self._gathered.items() if v[0]() is not None}
        self._gathered[(name, id(t))] = (weakref.ref(t), t._version, out)
        return out


def _pin(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    t = t.contiguous()
    if device.type != "cuda":
        return t
    out = pinned_empty(tuple(t.shape), t.dtype, device)
    return out.copy_(t)


def host_tiles(graph: Graph, bounds: tuple[int, ...], device: torch.device) -> HostTiles:
    """:class:`HostTiles` of ``graph`` cut at ``bounds`` (cached on the graph for the last
    bounds used)."""
    key = "ngra.device-host-tiles"
    hit = graph._cache.get(key)
    if hit is None or hit.bounds != bounds:
        graph._cache.pop(key, None)  # drop the old arrays before building new ones
        hit = graph._cache[key] = HostTiles(graph, bounds, device)
    return hit
