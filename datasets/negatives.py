"""Negative pairs for link prediction, drawn per epoch from counter-based streams.

A negative is a vertex pair ``(src, dst)`` that is (probably, or with ``exclude``
certainly) not an edge. :func:`sample_negatives` draws ``num`` of them for one epoch: as a
multiset, ``num`` independent pairs whose endpoints are each drawn uniformly (or in
proportion to ``degrees``), the distribution PyG's ``negative_sampling`` draws from.

**Mechanism.** The set comes **grouped by destination**, the order a CSC over the pairs
wants, without sorting anything:

1. How many negatives each vertex receives as destination is one multinomial draw of
   ``num`` over the ``N`` vertices (uniform, or ``degrees`` normalized), from a generator
   keyed by ``(seed, epoch)``: the destinations of ``num`` independent draws, counted.
   Negative ``i`` of the epoch is the ``i``-th of the pairs laid out destination after
   destination (vertex ``v``'s are ``starts[v] <= i < starts[v + 1]``).
2. Negative ``i``'s source is a splitmix64 hash of ``i`` in a stream keyed by
   ``(seed, epoch, round)``, turned into a vertex id (``uniform``: ``floor(u * N)``;
   ``degree``: the inverse of the cumulative ``degrees``). Nothing here is sequential:
   any destination's negatives can be drawn alone.

* **Ranks.** Every rank draws the same counts (``O(N)``, a few ms a million vertices)
  and then the sources of only the destinations it owns (``dst_range=(lo, hi)``, or any
  set with ``dst_owned``, a ``[N]`` bool mask), by their global indices: the union over
  ranks of their negatives, in index order, is the single-process set; no process count
  changes it.
* **Rejection** (``exclude=graph``): a pair that is an edge of ``exclude`` (or a
  self-loop, unless ``self_loops=True``) redraws its **source** only, in the next round's
  stream, so its destination (and the rank that owns it) never changes. Membership is a
  binary search of the candidate source among the sorted sources of its destination's
  CSC column (sorted once per graph, kept on it); walking destination after destination,
  that column stays in cache. A destination whose every source is excluded cannot be
  fixed by redrawing; after :data:`MAX_ROUNDS` rounds the pairs still rejected are
  dropped (logged), so fewer than ``num`` come back only in that corner.

The sources are drawn by a numba loop over ranges of destinations on the torch threads,
writing the ``[2, M]`` pairs in place.

Shapes: pairs are ``[2, M]`` int64, row 0 the sources, row 1 the destinations.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from ngra.errors import DatasetError
from ngra.graph import Graph

from .direction import _sources_sorted

__all__ = ["DEGREE_POWER", "MAX_ROUNDS", "NegativeSampler", "degree_weights", "in_columns",
           "is_edge", "sample_negatives", "sorted_sources"]

log = logging.getLogger(__name__)

#: ``kind="degree"`` draws a vertex in proportion to its degree to this power (word2vec's
#: unigram**0.75: frequent vertices more often than uniform, less than their degree).
DEGREE_POWER = 0.75
#: Redraw rounds for rejected sources before the remaining ones are dropped.
MAX_ROUNDS = 64
_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_STREAMS = {"dst": 1, "src": 2}


def _mix(z: int) -> int:
    """splitmix64's finalizer on a Python int (stream keys)."""
    z = (z + _GOLDEN) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _stream_key(seed: int, epoch: int, endpoint: str, rnd: int) -> int:
    return _mix(_mix(_mix(_mix(int(seed) & _MASK) ^ (int(epoch) & _MASK)) ^ _STREAMS[endpoint])
                ^ rnd)


class NegativeSampler:
    """The distribution a negative's endpoints are drawn from: uniform, or in proportion
    to ``degrees``.

    Args:
        num_nodes: ``N``.
        kind: ``"uniform"`` or ``"degree"``.
        degrees: ``[N]`` non-negative weights for ``kind="degree"`` (e.g. ``deg ** 0.75``).

    Attributes:
        cdf: ``[N]`` float64 cumulative probabilities (``None`` for uniform).
    """

    def __init__(self, num_nodes: int, kind: str = "uniform",
                 degrees: torch.Tensor | np.ndarray | None = None) -> None:
        if kind not in ("uniform", "degree"):
            raise DatasetError(f"kind must be 'uniform' or 'degree'; got {kind!r}.")
        self.num_nodes = int(num_nodes)
        self.cdf: np.ndarray | None = None
        self._p: np.ndarray | None = None
        if kind == "degree":
            if degrees is None:
                raise DatasetError("kind='degree' needs degrees=[N] weights (e.g. "
                                   "graph.in_degrees() + graph.out_degrees()); got None.")
            w = np.asarray(degrees.cpu() if isinstance(degrees, torch.Tensor) else degrees,
                           dtype=np.float64)
            if w.shape != (self.num_nodes,) or not np.isfinite(w).all() or (w < 0).any():
                raise DatasetError(f"degrees must be [{self.num_nodes}] finite weights >= 0; "
                                   f"got shape {list(w.shape)}, min {w.min() if w.size else None}.")
            if w.sum() <= 0:
                raise DatasetError("degrees sum to 0: no vertex can be drawn with kind='degree'.")
            self._p = w / w.sum()
            self.cdf = np.cumsum(self._p)

    def counts(self, num: int, key: int) -> np.ndarray:
        """``[N]`` int64: how many of ``num`` independent draws land on each vertex (one
        multinomial draw from a generator seeded with ``key``)."""
        p = self._p if self._p is not None else np.full(self.num_nodes, 1.0 / self.num_nodes)
        return np.random.Generator(np.random.PCG64(key)).multinomial(num, p).astype(np.int64)


def degree_weights(graph: Graph, power: float = DEGREE_POWER) -> np.ndarray:
    """``[N]`` float64 weights for ``kind="degree"``: ``(in-degree + out-degree) ** power``."""
    deg = (graph.in_degrees() + graph.out_degrees()).to(torch.float64).numpy()
    return deg ** power


def in_columns(indptr: np.ndarray, vals: np.ndarray, col: np.ndarray,
               val: np.ndarray) -> np.ndarray:
    """``[len(col)]`` bool: whether ``val[i]`` is in column ``col[i]`` of a CSC-like
    ``(indptr, vals)`` whose columns are sorted; parallel over the queries."""
    from ngra.kernels.cpu.csc_search import in_columns_rows  # lazy: numba loads with it
    from ngra.kernels.cpu.util import run_ranges  # lazy: settings read on import

    col = np.ascontiguousarray(col, dtype=np.int64)
    val = np.ascontiguousarray(val, dtype=np.int64)
    out = np.empty(col.size, dtype=np.bool_)
    if col.size:
        run_ranges(in_columns_rows, col.size, torch.get_num_threads(),
                   np.ascontiguousarray(indptr, dtype=np.int64), vals, col, val, out)
    return out


def is_edge(graph: Graph, src: np.ndarray, dst: np.ndarray,
            sorted_indices: np.ndarray | None = None) -> np.ndarray:
    """``[len(src)]`` bool: whether ``src[i] -> dst[i]`` is an edge of ``graph``.

    A binary search of each source among the sorted sources of column ``dst[i]``
    (:func:`in_columns`); ``sorted_indices`` (from a previous call's
    :func:`sorted_sources`) saves re-checking.
    """
    idx = sorted_sources(graph) if sorted_indices is None else sorted_indices
    return in_columns(graph.indptr.numpy(), idx, dst, src)


def sorted_sources(graph: Graph) -> np.ndarray:
    """The graph's CSC ``indices`` as int64 with each column's sources in increasing order
    (built once per graph and kept on it, threads sharing the graph included: a run's
    epochs draw against the same one)."""
    return graph.cached("ngra.sorted-sources", lambda: _sources_sorted(
        graph.indptr.numpy(), graph.indices.numpy(), graph.num_nodes).astype(np.int64,
                                                                              copy=False))


def sample_negatives(
    num_nodes: int,
    num: int,
    seed: int,
    *,
    epoch: int = 0,
    kind: str = "uniform",
    degrees: torch.Tensor | np.ndarray | None = None,
    exclude: Graph | None = None,
    self_loops: bool = False,
    dst_range: tuple[int, int] | None = None,
    dst_owned: np.ndarray | None = None,
    return_index: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Draw epoch ``epoch``'s ``num`` negative pairs (see the module docstring).

    Args:
        num_nodes: ``N``; ids are in ``[0, N)``.
        num: how many negatives the whole (global) set holds.
        seed: the run's seed; with ``epoch`` it fixes the set.
        epoch: which epoch's set (default: 0).
        kind: ``"uniform"`` (default) or ``"degree"`` (both endpoints drawn in proportion
            to ``degrees``).
        degrees: ``[N]`` weights for ``kind="degree"``.
        exclude: redraw pairs that are edges of this graph (default: none rejected).
        self_loops: allow ``v -> v`` pairs (default: ``False``, they are redrawn).
        dst_range: ``(lo, hi)``: return only the negatives whose destination is in
            ``[lo, hi)`` (a rank's share); default: all.
        dst_owned: ``[N]`` bool: return only the negatives whose destination is marked
            (a rank's share when it owns no range); not with ``dst_range``.
        return_index: also return each returned negative's global index ``[M]``.

    Returns:
        ``[2, M]`` int64 pairs grouped by destination (in increasing order), i.e. in
        global index order (``M == num`` without ``dst_range``/``dst_owned``, unless some
        could not avoid ``exclude``); with ``return_index``, ``(pairs, index)``.
    """
    n = int(num_nodes)
    if n <= 0 or num < 0:
        raise DatasetError(f"sample_negatives needs num_nodes > 0 and num >= 0; got "
                           f"num_nodes={num_nodes}, num={num}.")
    if n == 1 and not self_loops and num:
        raise DatasetError("a 1-vertex graph has no pair other than a self-loop; pass "
                           "self_loops=True or use a larger graph.")
    if dst_range is not None and dst_owned is not None:
        raise ValueError("sample_negatives: give dst_range or dst_owned, not both.")
    if dst_owned is not None:
        dst_owned = np.asarray(dst_owned, dtype=bool)
        if dst_owned.shape != (n,):
            raise DatasetError(f"dst_owned must be a [{n}] bool mask; got shape "
                               f"{list(dst_owned.shape)}.")
    if exclude is not None and exclude.num_nodes != n:
        raise DatasetError(f"exclude has {exclude.num_nodes} vertices; expected "
                           f"num_nodes={n}.")
    # the numba backend reads NGRA_* settings when imported: a bad value fails a draw,
    # not `import ngra.datasets`
    from ngra.kernels.cpu.csc_search import draw_sources  # lazy: numba loads with it
    from ngra.kernels.cpu.util import run_ranges  # lazy: settings read on import

    draw = NegativeSampler(n, kind, degrees)
    counts = draw.counts(int(num), _stream_key(seed, epoch, "dst", 0))
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    if dst_owned is not None:
        verts = np.flatnonzero(dst_owned).astype(np.int64)
    else:
        lo, hi = (0, n) if dst_range is None else (max(int(dst_range[0]), 0),
                                                   min(int(dst_range[1]), n))
        verts = np.arange(lo, max(hi, lo), dtype=np.int64)
    offset = np.zeros(verts.size + 1, dtype=np.int64)
    np.cumsum(counts[verts], out=offset[1:])
    total = int(offset[-1])
    threads = max(1, min(torch.get_num_threads(), verts.size))
    bounds = np.searchsorted(offset, np.linspace(0, total, threads + 1)).astype(np.int64)
    bounds[0], bounds[-1] = 0, verts.size
    keys = np.array([_stream_key(seed, epoch, "src", r) for r in range(MAX_ROUNDS + 1)],
                    dtype=np.uint64)
    if exclude is not None:
        indptr = exclude.indptr.numpy().astype(np.int64, copy=False)
        idx = sorted_sources(exclude)
    else:
        indptr, idx = np.zeros(2, dtype=np.int64), np.zeros(1, dtype=np.int64)
    cdf = draw.cdf if draw.cdf is not None else np.zeros(1)
    pairs = np.empty((2, total), dtype=np.int64)
    index = np.empty(total if return_index else 0, dtype=np.int64)
    ok = np.empty(total, dtype=np.bool_)
    run_ranges(draw_sources, threads, threads, verts, starts, offset, bounds, keys, n, cdf,
               draw.cdf is not None, indptr, idx, exclude is not None, bool(self_loops),
               pairs, index, ok)
    if not ok.all():
        log.warning("sample_negatives: %d of %d negatives kept hitting excluded pairs after "
                    "%d rounds (destinations with almost every source an edge) and are "
                    "dropped.", int((~ok).sum()), ok.size, MAX_ROUNDS)
        pairs = pairs[:, ok]
        index = index[ok] if return_index else index
    out = torch.from_numpy(pairs)
    return (out, torch.from_numpy(index)) if return_index else out
