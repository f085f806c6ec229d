"""numba dropout: the reference's counter-based mask (see ``ref/dropout.py``), in parallel.

torch's CPU ``bernoulli_`` draws one Mersenne-Twister number per element on one
thread (PubMed's 19,717 x 500 input: ~240 ms per dropout call, most of a GCN
epoch); a hash of the element index is a few vectorized integer ops per
element and splits over threads with an identical result.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ngra.kernels.cpu._util import as_numpy, run_rows
from ngra.kernels.registry import register

BLOCK = 1 << 14  # elements per work unit handed to a thread


@njit(cache=True, nogil=True, inline="always")
def _mix32(x):
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@njit(cache=True, nogil=True)
def _dropout_fwd(x, out, s1, s2, thr, scale, b0, b1):
    i1 = min(b1 * BLOCK, x.shape[0])
    for i in range(b0 * BLOCK, i1):
        keep = _mix32(_mix32((i + s1) & 0xFFFFFFFF) ^ s2) >= thr
        out[i] = x[i] * scale if keep else 0


def _blocks(n: int) -> np.ndarray:
    """An edge-free ``indptr`` over ``ceil(n / BLOCK)`` blocks: :func:`run_rows` splits it evenly."""
    return np.zeros((n + BLOCK - 1) // BLOCK + 1, dtype=np.int64)


@register("dropout", "cpu")
def dropout(x: torch.Tensor, s1: int, s2: int, thr: int, scale: float):
    """See :func:`ngra.kernels.ref.dropout.dropout` (same contract and mask)."""
    out = torch.empty_like(x)
    flat = as_numpy(x.view(-1))
    ip = _blocks(flat.shape[0])
    run_rows(_dropout_fwd, ip, flat, as_numpy(out.view(-1)), s1, s2, thr,
             flat.dtype.type(scale), row_bytes=BLOCK * flat.itemsize)
    return out
