"""numba ``pair_bce``: one walk over the pairs' destinations (see :mod:`ngra.kernels.pair_bce`).

Parallel over destination ranges: each range writes the coefficients of its own pairs,
the destination-side gradient rows of its own destinations and its destinations' loss
terms (summed afterwards in float64), so there is one writer per output element.
Specializations: {float32, float64} x {int32, int64 indices}.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ngra.kernels.cpu.util import as_numpy, prefetch_distance, prefetch_row, run_rows
from ngra.kernels.registry import register


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _pair_bce(indptr, indices, z, label, scale, coef, gdst, loss_v, pf, v0, v1):
    nf = z.shape[1]
    num = indices.shape[0]
    for v in range(v0, v1):
        total = 0.0
        for j in range(indptr[v], indptr[v + 1]):
            if j + pf < num:
                prefetch_row(z, indices[j + pf])
            u = indices[j]
            s = z.dtype.type(0)
            for f in range(nf):
                s += z[u, f] * z[v, f]
            x = -s if label == 1 else s  # softplus(x): the loss term
            total += max(x, 0.0) + math.log1p(math.exp(-abs(x)))
            if s >= 0:  # sigmoid(s), stable either side of 0
                sig = 1.0 / (1.0 + math.exp(-s))
            else:
                e = math.exp(s)
                sig = e / (1.0 + e)
            c = z.dtype.type((sig - label) * scale)
            coef[j] = c
            for f in range(nf):
                gdst[v, f] += c * z[u, f]
        loss_v[v] = total


@register("pair_bce", "cpu")
def pair_bce(indptr: torch.Tensor, indices: torch.Tensor, z: torch.Tensor, label: int,
             scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """See :func:`ngra.kernels.ref.pair_bce.pair_bce` (same contract)."""
    n, nf = z.shape
    coef = torch.empty(indices.numel(), dtype=z.dtype)
    gdst = torch.zeros(n, nf, dtype=z.dtype)
    loss_v = np.zeros(n, dtype=np.float64)
    ip = as_numpy(indptr)
    run_rows(_pair_bce, ip, ip, as_numpy(indices), as_numpy(z), int(label), float(scale),
             as_numpy(coef), as_numpy(gdst), loss_v, prefetch_distance(nf * z.element_size()),
             row_bytes=nf * z.element_size(), edge_arrays=(as_numpy(indices),))
    loss = torch.tensor(float(loss_v.sum()) * scale, dtype=z.dtype)
    return loss, coef, gdst
