"""numba loops behind the tiler, the grid search and relabeling (imported lazily).

Each is a linear pass that numpy/torch can only express through an ``O(E log E)`` sort
or several random gathers over ``E``. Compiled code is cached on disk
(``cache=True``), so only the first run in a fresh checkout pays the JIT (a few seconds).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def tile_column(
    indptr: np.ndarray,
    indices: np.ndarray,
    dst_lo: int,
    dst_hi: int,
    src_bounds: np.ndarray,
    stamp: np.ndarray,
    slot: np.ndarray,
    col: int,
    proto: np.ndarray,
):
    """All tiles of one column (destinations ``[dst_lo, dst_hi)``) in two passes over its edges.

    Pass 1 finds the column's distinct sources and their edge counts; sorting them gives
    every tile's rows (sources of row ``q`` are a contiguous run) and, by prefix sums, the
    column-wide CSR offsets, whose values at the row boundaries are the tile offsets.
    Pass 2 walks the edges in CSC order and drops each one at its tile-CSC position
    (a stable counting sort on the source part) and at its CSR position (a stable
    counting sort on the compact source id), so both orders keep CSC order.

    ``stamp`` ([N] int32, never equal to ``col`` before this call) marks sources seen in
    this column; ``slot`` ([N] int64) is scratch. Output index arrays take ``proto``'s
    dtype. Tile ``q`` is the slice ``[starts[q], starts[q+1])`` of the per-edge arrays
    and ``[row_starts[q], row_starts[q+1])`` of ``rows`` / ``csr_ptr``.

    Returns:
        rows [R] sorted unique sources; starts [Q+1]; row_starts [Q+1]; csc_ptr [Q, D+1]
        per-tile local CSC offsets; local_src [E_c]; edge_ids [E_c]; csr_ptr [R+1]
        column-wide CSR offsets over compact ids; csr_perm [E_c] (tile-CSC position);
        csr_dst [E_c] (local destination).
    """
    num_q = src_bounds.shape[0] - 1
    num_d = dst_hi - dst_lo
    a = indptr[dst_lo]
    b = indptr[dst_hi]
    num_e = b - a
    n = stamp.shape[0]

    # Pass 1: distinct sources and edges per source (slot[v] counts until compacted).
    touched = np.empty(min(num_e, n), dtype=np.int64)
    num_r = 0
    for e in range(a, b):
        v = indices[e]
        if stamp[v] != col:
            stamp[v] = col
            slot[v] = 1
            touched[num_r] = v
            num_r += 1
        else:
            slot[v] += 1
    if num_r * 16 > n:  # dense: scanning the stamps is cheaper than sorting
        rows = np.empty(num_r, dtype=proto.dtype)
        r = 0
        for v in range(n):
            if stamp[v] == col:
                rows[r] = v
                r += 1
    else:
        rows = np.sort(touched[:num_r]).astype(proto.dtype)
    row_starts = np.searchsorted(rows, src_bounds).astype(np.int64)
    csr_ptr = np.empty(num_r + 1, dtype=proto.dtype)
    fill = np.empty(num_r, dtype=np.int64)  # next CSR position of each compact id
    total = 0
    q = 0
    csr_ptr[0] = 0
    for r in range(num_r):
        v = rows[r]
        while r >= row_starts[q + 1]:
            q += 1
        fill[r] = total
        total += slot[v]
        csr_ptr[r + 1] = total
        slot[v] = (r << 16) | q  # compact id and source part, one lookup in pass 2
    starts = np.empty(num_q + 1, dtype=np.int64)
    for q in range(num_q + 1):
        starts[q] = csr_ptr[row_starts[q]]

    # Pass 2: tile-CSC and CSR positions of every edge, walking the column in CSC order.
    nxt = starts[:-1].copy()
    edge_ids = np.empty(num_e, dtype=proto.dtype)
    local_src = np.empty(num_e, dtype=proto.dtype)
    csr_perm = np.empty(num_e, dtype=proto.dtype)
    csr_dst = np.empty(num_e, dtype=proto.dtype)
    csc_ptr = np.zeros((num_q, num_d + 1), dtype=proto.dtype)
    e = a
    for d in range(num_d):
        for _ in range(indptr[dst_lo + d + 1] - indptr[dst_lo + d]):
            x = slot[indices[e]]
            c = x >> 16
            q = x & 0xFFFF
            i = nxt[q]
            nxt[q] = i + 1
            j = fill[c]
            fill[c] = j + 1
            edge_ids[i] = e
            local_src[i] = c - row_starts[q]
            csr_perm[j] = i - starts[q]
            csr_dst[j] = d
            csc_ptr[q, d + 1] += 1
            e += 1
    for q in range(num_q):
        for d in range(num_d):
            csc_ptr[q, d + 1] += csc_ptr[q, d]
    return rows, starts, row_starts, csc_ptr, local_src, edge_ids, csr_ptr, csr_perm, csr_dst


@numba.njit(cache=True, nogil=True)
def grid_counts(
    indptr: np.ndarray,
    indices: np.ndarray,
    dst_bounds: np.ndarray,
    src_part: np.ndarray,
    num_src_parts: int,
):
    """Exact edges and distinct source rows of every tile, without building tiles.

    Walks the CSC column by column; ``last[v]`` remembers the last column that touched
    source ``v``, so each (column, source) pair is counted once. ``O(E + N)``.

    Returns:
        ``(edges [P, Q], src_rows [P, Q])`` int64.
    """
    num_dst_parts = dst_bounds.shape[0] - 1
    edges = np.zeros((num_dst_parts, num_src_parts), dtype=np.int64)
    rows = np.zeros((num_dst_parts, num_src_parts), dtype=np.int64)
    last = np.full(src_part.shape[0], -1, dtype=np.int32)
    for p in range(num_dst_parts):
        for e in range(indptr[dst_bounds[p]], indptr[dst_bounds[p + 1]]):
            v = indices[e]
            q = src_part[v]
            edges[p, q] += 1
            if last[v] != p:
                last[v] = p
                rows[p, q] += 1
    return edges, rows


@numba.njit(cache=True, nogil=True)
def relabel_csc(
    indptr: np.ndarray,
    indices: np.ndarray,
    perm: np.ndarray,
    order: np.ndarray,
    rank: np.ndarray,
    new_indptr: np.ndarray,
    want_old_pos: bool,
):
    """CSC of the relabeled graph: new column ``d`` is old column ``order[d]``, sources
    mapped by ``rank``, edge order inside a column kept.

    Returns:
        (indices, perm, old_pos); ``old_pos`` (old CSC position of each new edge) is
        empty unless ``want_old_pos``.
    """
    num_e = indices.shape[0]
    new_indices = np.empty(num_e, dtype=np.int64)
    new_perm = np.empty(num_e, dtype=np.int64)
    old_pos = np.empty(num_e if want_old_pos else 0, dtype=np.int64)
    for d in range(order.shape[0]):
        o = order[d]
        j = new_indptr[d]
        for e in range(indptr[o], indptr[o + 1]):
            new_indices[j] = rank[indices[e]]
            new_perm[j] = perm[e]
            if want_old_pos:
                old_pos[j] = e
            j += 1
    return new_indices, new_perm, old_pos
