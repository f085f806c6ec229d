"""Binary searches over a CSC whose columns are sorted, and the negative sampler's draws.

The numba kernels behind :mod:`ngra.datasets.direction` (reciprocity: an edge's reverse
among its source's column) and :mod:`ngra.datasets.negatives` (a drawn negative rejected
when it is an edge; ``is_edge`` queries); those modules import this one when they first
run a kernel, so loading a dataset does not load numba.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["count_reverses", "draw_sources", "in_columns_rows", "in_sorted"]

#: splitmix64's increment (the draws' stream hash).
_GOLDEN = 0x9E3779B97F4A7C15


@njit(cache=True, nogil=True, inline="always")
def in_sorted(vals, a, b, v):
    """Whether ``v`` is among ``vals[a:b]`` (sorted): a binary search for its lower bound.
    The one search behind every "is ``u -> v`` an edge" test on a CSC with sorted columns
    (reciprocity, negatives' rejection and :func:`~ngra.datasets.negatives.in_columns`)."""
    end = b
    while a < b:
        mid = (a + b) >> 1
        if vals[mid] < v:
            a = mid + 1
        else:
            b = mid
    return a < end and vals[a] == v


@njit(cache=True, nogil=True)
def count_reverses(indptr, idx, counts, v0, v1):
    """Adds to ``counts`` the edges into columns ``[v0, v1)`` whose reverse is an edge
    (``[0]``, self-loops included) and the self-loops among them (``[1]``)."""
    found = 0
    loops = 0
    for d in range(v0, v1):
        for j in range(indptr[d], indptr[d + 1]):
            s = idx[j]
            if s == d:
                loops += 1
            if in_sorted(idx, indptr[s], indptr[s + 1], d):  # d among column s's sources
                found += 1
    counts[0] += found
    counts[1] += loops


@njit(cache=True, nogil=True)
def hash_uniform(key, i):
    """A float64 in ``[0, 1)``: splitmix64 at counter ``i`` of stream ``key`` (uint64
    throughout: it wraps as splitmix64 wants), its top 53 bits."""
    z = np.uint64(i) + np.uint64(1)
    z = z * np.uint64(_GOLDEN) + key
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.float64(z >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True, nogil=True)
def draw_vertex(u, n, cdf, use_cdf):
    """:meth:`ngra.datasets.negatives.NegativeSampler.ids` of one uniform."""
    if not use_cdf:
        return min(np.int64(u * n), n - 1)
    a, b = 0, cdf.size
    while a < b:  # first position whose cdf exceeds u (searchsorted, side="right")
        mid = (a + b) >> 1
        if cdf[mid] <= u:
            a = mid + 1
        else:
            b = mid
    return min(a, n - 1)


@njit(cache=True, nogil=True)
def draw_sources(verts, starts, offset, bounds, keys, n, cdf, use_cdf, indptr, idx,
                 has_exclude, self_loops, pairs, index, ok, t0, t1):
    """The pairs of destinations ``verts[bounds[t0]:bounds[t1]]``: each one's negatives
    ``starts[d] <= i < starts[d + 1]``, written from ``offset`` of its position in
    ``verts``; each source is round ``r``'s draw (stream ``keys[r]``) until one is
    neither a self-loop (unless allowed) nor an excluded edge (binary search among the
    sorted sources of the destination's column)."""
    with_index = index.size > 0
    for k in range(bounds[t0], bounds[t1]):
        d = verts[k]
        o = offset[k]
        a0, b0 = (indptr[d], indptr[d + 1]) if has_exclude else (0, 0)
        for i in range(starts[d], starts[d + 1]):
            good = False
            s = 0
            for r in range(keys.size):
                s = draw_vertex(hash_uniform(keys[r], i), n, cdf, use_cdf)
                if not self_loops and s == d:
                    continue
                if has_exclude and in_sorted(idx, a0, b0, s):
                    continue
                good = True
                break
            pairs[0, o] = s
            pairs[1, o] = d
            if with_index:
                index[o] = i
            ok[o] = good
            o += 1


@njit(cache=True, nogil=True)
def in_columns_rows(indptr, vals, col, val, out, lo, hi):
    """``out[i]``: whether ``val[i]`` is among ``vals[indptr[c]:indptr[c + 1]]`` (sorted),
    ``c = col[i]``: a binary search within one column (queries grouped by column walk the
    columns in order, the fast case)."""
    for i in range(lo, hi):
        c = col[i]
        out[i] = in_sorted(vals, indptr[c], indptr[c + 1], val[i])
