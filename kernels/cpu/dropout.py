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

from ngra.kernels.cpu.util import as_numpy, run_rows
from ngra.kernels.registry import register

BLOCK = 1 << 14  # elements per work unit handed to a thread


@njit(cache=True, nogil=True, inline="always")
def _mix32(x):
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@njit(cache=True, nogil=True, inline="always")
def _keep(i, s1, s2, thr):
    """Whether flat element ``i`` (of a range whose seed ``s1`` is offset to its start) is kept."""
    return _mix32(_mix32((i + s1) & 0xFFFFFFFF) ^ s2) >= thr


@njit(cache=True, nogil=True, inline="always")
def _dropout_range(x, out, s1, s2, thr, scale):
    for i in range(x.shape[0]):
        out[i] = x[i] * scale if _keep(i, s1, s2, thr) else 0


@njit(cache=True, nogil=True)
def _dropout_fwd(x, out, s1, s2, thr, scale, b0, b1):
    # a slice indexed from 0, the seed offset by its start: the same draws, and LLVM
    # vectorizes a loop from 0 where it left one from b0 * BLOCK scalar
    i0, i1 = b0 * BLOCK, min(b1 * BLOCK, x.shape[0])
    _dropout_range(x[i0:i1], out[i0:i1], (s1 + i0) & 0xFFFFFFFF, s2, thr, scale)


@njit(cache=True, nogil=True)
def _dropout_rows(x, out, keep, base, s1, s2, thr, scale, r0, r1):
    # row r's elements draw from base[r] + column; ``keep`` (uint8, one per element, or
    # empty) records the draws for packing
    for r in range(r0, r1):
        s = (s1 + base[r]) & 0xFFFFFFFF
        xr, outr = x[r], out[r]
        for c in range(xr.shape[0]):
            k = _keep(c, s, s2, thr)
            outr[c] = xr[c] * scale if k else 0
            if keep.shape[0]:
                keep[r, c] = k


def _rows_fwd(x: torch.Tensor, out: torch.Tensor, base: torch.Tensor, s1: int, s2: int,
              thr: int, scale: float, keep: np.ndarray | None = None) -> None:
    n = x.shape[0]
    if x.numel() == 0:
        return
    x2, out2 = as_numpy(x.reshape(n, -1)), as_numpy(out.view(n, -1))
    k = keep if keep is not None else np.empty((0, 0), dtype=np.uint8)
    run_rows(_dropout_rows, np.zeros(n + 1, dtype=np.int64), x2, out2, k,
             as_numpy(base), s1, s2, thr, x2.dtype.type(scale),
             row_bytes=max(1, x2.shape[1] * x2.itemsize))


def _blocks(n: int) -> np.ndarray:
    """An edge-free ``indptr`` over ``ceil(n / BLOCK)`` blocks: :func:`run_rows` splits it evenly."""
    return np.zeros((n + BLOCK - 1) // BLOCK + 1, dtype=np.int64)


@register("dropout", "cpu")
def dropout(x: torch.Tensor, s1: int, s2: int, thr: int, scale: float,
            base: torch.Tensor | None = None):
    """See :func:`ngra.kernels.ref.dropout.dropout` (same contract and mask)."""
    out = torch.empty_like(x)
    if base is not None:
        _rows_fwd(x, out, base, s1, s2, thr, scale)
        return out
    flat = as_numpy(x.view(-1))
    ip = _blocks(flat.shape[0])
    run_rows(_dropout_fwd, ip, flat, as_numpy(out.view(-1)), s1, s2, thr,
             flat.dtype.type(scale), row_bytes=BLOCK * flat.itemsize)
    return out


# Packed masks for ngra.kernels.dropout_linear: bit j of byte b is the keep flag of
# element 8 * b + j. Slices from index 0 again (a range from b0 * BLOCK was not vectorized).
@njit(cache=True, nogil=True, inline="always")
def _bits_range(x, out, bits, s1, s2, thr, scale):
    n, full = x.shape[0], x.shape[0] // 8
    for b in range(full):
        acc = np.uint32(0)
        for j in range(8):
            i = 8 * b + j
            keep = _keep(i, s1, s2, thr)
            out[i] = x[i] * scale if keep else 0
            acc |= np.uint32(keep) << j
        bits[b] = acc
    if n % 8:  # a partial last byte
        last = 0  # not acc: numba would unify the two variables' types
        for i in range(8 * full, n):
            keep = _keep(i, s1, s2, thr)
            out[i] = x[i] * scale if keep else 0
            last |= np.int64(keep) << (i - 8 * full)
        bits[full] = last


@njit(cache=True, nogil=True)
def _dropout_bits(x, out, bits, s1, s2, thr, scale, b0, b1):
    lo, hi = b0 * BLOCK, min(b1 * BLOCK, bits.shape[0])
    e0, e1 = 8 * lo, min(8 * hi, x.shape[0])
    _bits_range(x[e0:e1], out[e0:e1], bits[lo:hi], (s1 + e0) & 0xFFFFFFFF, s2, thr, scale)


@njit(cache=True, nogil=True, inline="always")
def _apply_range(x, out, bits, scale):
    n, full = x.shape[0], x.shape[0] // 8
    for b in range(full):
        v = bits[b]
        for j in range(8):
            i = 8 * b + j
            out[i] = x[i] * scale if (v >> j) & 1 else 0
    for i in range(8 * full, n):
        out[i] = x[i] * scale if (bits[full] >> (i - 8 * full)) & 1 else 0


@njit(cache=True, nogil=True)
def _apply_bits(x, out, bits, scale, b0, b1):
    lo, hi = b0 * BLOCK, min(b1 * BLOCK, bits.shape[0])
    e0, e1 = 8 * lo, min(8 * hi, x.shape[0])
    _apply_range(x[e0:e1], out[e0:e1], bits[lo:hi], scale)


@register("dropout_mask", "cpu")
def dropout_mask(x: torch.Tensor, s1: int, s2: int, thr: int, scale: float, out: torch.Tensor,
                 base: torch.Tensor | None = None):
    """See :func:`ngra.kernels.ref.dropout.dropout_mask`; the mask is packed, 1 bit per element."""
    if base is not None:
        # per-element flags, then packed: rows of threads would share bytes of the bits
        keep = np.empty((x.shape[0], x.numel() // max(x.shape[0], 1)), dtype=np.uint8)
        _rows_fwd(x, out, base, s1, s2, thr, scale, keep)
        return np.packbits(keep.reshape(-1), bitorder="little")
    flat = as_numpy(x.view(-1))
    bits = np.empty((flat.shape[0] + 7) // 8, dtype=np.uint8)
    run_rows(_dropout_bits, _blocks(bits.shape[0]), flat, as_numpy(out.view(-1)), bits,
             s1, s2, thr, flat.dtype.type(scale), row_bytes=8 * BLOCK * flat.itemsize)
    return bits


@register("dropout_apply", "cpu")
def dropout_apply(x: torch.Tensor, mask, scale: float, out: torch.Tensor) -> torch.Tensor:
    """See :func:`ngra.kernels.ref.dropout.dropout_apply`."""
    flat = as_numpy(x.view(-1))
    run_rows(_apply_bits, _blocks(mask.shape[0]), flat, as_numpy(out.view(-1)), mask,
             flat.dtype.type(scale), row_bytes=8 * BLOCK * flat.itemsize)
    return out
