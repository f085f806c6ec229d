"""numba ``pair_bce``: a walk over destinations, then one over sources (see
:mod:`ngra.kernels.pair_bce`).

The destination walk is parallel over destination ranges: each range writes the
coefficients of its own pairs, the gradient rows of its own destinations and its
destinations' loss terms (summed afterwards in float64), so there is one writer per
output element. The source walk gives thread ``t`` of ``T`` the rows ``u`` with
``(u >> 5) % T == t`` (blocks of 32 rows dealt round-robin, so the hubs of a power-law
graph spread over the threads); each thread walks every pair in destination order, so
``z_v`` streams and only the rows it owns are written, by it alone.
Specializations: {float32, float64} x {int32, int64 indices}.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ngra.kernels.cpu.util import (as_numpy, prefetch_distance, prefetch_row, run_ranges,
                                   run_rows)
from ngra.kernels.registry import register

_BLOCK_SHIFT = 5  # source rows dealt to threads in blocks of 32


_BLOCK = 64  # pairs scored, then put through the loss, then accumulated, at a time


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, inline="always")
def _dst_rows(indptr, indices, z, v, label, scale, coef, g, grad, pf):
    """One destination's pairs of one set: their loss terms (returned, summed), their
    coefficients and (``grad``) the destination-side gradient of ``v``.

    In blocks of :data:`_BLOCK` pairs, three loops: the scores (independent loads, the
    rows prefetched ahead), the loss terms and coefficients (``exp``/``log1p``, no loads),
    then the gradient (the block's rows still in cache). One loop doing all three per
    pair chains each pair's math behind its load; split, the math of a block overlaps
    the other pairs' work instead of adding to it."""
    nf = z.shape[1]
    num = indices.shape[0]
    total = 0.0
    for b0 in range(indptr[v], indptr[v + 1], _BLOCK):
        b1 = min(b0 + _BLOCK, indptr[v + 1])
        for j in range(b0, b1):
            if j + pf < num:
                prefetch_row(z, indices[j + pf])
            u = indices[j]
            s = z.dtype.type(0)
            for f in range(nf):
                s += z[u, f] * z[v, f]
            coef[j] = s
        for j in range(b0, b1):
            s = coef[j]
            e = math.exp(-abs(s))  # one exp serves the loss term and the sigmoid
            x = -s if label == 1 else s  # softplus(x) = max(x, 0) + log1p(exp(-|x|))
            total += max(x, 0.0) + math.log1p(e)
            sig = 1.0 / (1.0 + e) if s >= 0 else e / (1.0 + e)  # stable either side of 0
            coef[j] = z.dtype.type((sig - label) * scale)
        if grad:
            for j in range(b0, b1):
                u = indices[j]
                c = coef[j]
                for f in range(nf):
                    g[v, f] += c * z[u, f]
    return total


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _by_dst(p_ptr, p_idx, n_ptr, n_idx, z, scale, p_coef, n_coef, g, grad, loss_v, pf,
            v0, v1):
    for v in range(v0, v1):
        loss_v[v] = (_dst_rows(p_ptr, p_idx, z, v, 1, scale, p_coef, g, grad, pf)
                     + _dst_rows(n_ptr, n_idx, z, v, 0, scale, n_coef, g, grad, pf))


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"}, inline="always")
def _src_rows(indptr, indices, coef, z, g, v, t, nt, pf):
    nf = z.shape[1]
    num = indices.shape[0]
    for j in range(indptr[v], indptr[v + 1]):
        if j + pf < num:
            w = indices[j + pf]
            if (w >> _BLOCK_SHIFT) % nt == t:
                prefetch_row(g, w)
        u = indices[j]
        if (u >> _BLOCK_SHIFT) % nt == t:
            c = coef[j]
            for f in range(nf):
                g[u, f] += c * z[v, f]


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _by_src(p_ptr, p_idx, p_coef, n_ptr, n_idx, n_coef, z, g, nt, pf, t0, t1):
    n = p_ptr.shape[0] - 1
    for t in range(t0, t1):
        for v in range(n):
            _src_rows(p_ptr, p_idx, p_coef, z, g, v, t, nt, pf)
            _src_rows(n_ptr, n_idx, n_coef, z, g, v, t, nt, pf)


@register("pair_bce", "cpu")
def pair_bce(z: torch.Tensor, pos_indptr: torch.Tensor, pos_indices: torch.Tensor,
             neg_indptr: torch.Tensor, neg_indices: torch.Tensor, scale: float,
             grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """See :func:`ngra.kernels.ref.pair_bce.pair_bce` (same contract)."""
    n, nf = z.shape
    row_bytes = nf * z.element_size()
    pf = prefetch_distance(row_bytes)
    zn = as_numpy(z)
    p_ptr, p_idx = as_numpy(pos_indptr), as_numpy(pos_indices)
    n_ptr, n_idx = as_numpy(neg_indptr), as_numpy(neg_indices)
    p_coef = np.empty(p_idx.size, dtype=zn.dtype)  # scores, then d loss / d score
    n_coef = np.empty(n_idx.size, dtype=zn.dtype)
    gz = torch.zeros(n, nf, dtype=z.dtype) if grad else torch.zeros(0, nf, dtype=z.dtype)
    g = as_numpy(gz)
    loss_v = np.zeros(n, dtype=np.float64)
    work = p_ptr.astype(np.int64) + n_ptr  # both sets' pairs balance the ranges
    run_rows(_by_dst, work, p_ptr, p_idx, n_ptr, n_idx, zn, float(scale), p_coef, n_coef, g,
             bool(grad), loss_v, pf, row_bytes=row_bytes)
    if grad:
        threads = max(1, min(torch.get_num_threads(), n))
        run_ranges(_by_src, threads, threads, p_ptr, p_idx, p_coef, n_ptr, n_idx, n_coef,
                   zn, g, threads, pf)
    loss = torch.tensor(float(loss_v.sum()) * scale, dtype=z.dtype)
    return loss, gz if grad else None
