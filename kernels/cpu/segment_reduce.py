"""numba segment reduction and its backward, parallel over segments.

Specializations: {float32, float64} (``indptr`` is always int64).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ngra.kernels.cpu.util import MAX, MEAN, MIN, REDUCE_CODES, as_numpy, dummy, run_rows
from ngra.kernels.registry import register


@njit(cache=True, nogil=True)
def _segment_reduce(indptr, values, out, arg, reduce, v0, v1):
    nf = values.shape[1]
    for v in range(v0, v1):
        lo, hi = indptr[v], indptr[v + 1]
        if reduce == MAX or reduce == MIN:
            if lo == hi:
                for f in range(nf):
                    out[v, f] = 0
                    arg[v, f] = -1
            for j in range(lo, hi):
                for f in range(nf):
                    x = values[j, f]
                    # Strict comparison: among ties the first row wins.
                    if j == lo or (x > out[v, f] if reduce == MAX else x < out[v, f]):
                        out[v, f] = x
                        arg[v, f] = j
        else:
            for f in range(nf):
                out[v, f] = 0
            for j in range(lo, hi):
                for f in range(nf):
                    out[v, f] += values[j, f]
            if reduce == MEAN and hi > lo:
                inv = out.dtype.type(1) / out.dtype.type(hi - lo)
                for f in range(nf):
                    out[v, f] *= inv


@njit(cache=True, nogil=True)
def _segment_reduce_backward(indptr, grad_out, arg, grad, reduce, v0, v1):
    """Rows of segment v are written only while handling v: no race."""
    nf = grad_out.shape[1]
    for v in range(v0, v1):
        lo, hi = indptr[v], indptr[v + 1]
        if reduce == MAX or reduce == MIN:
            for j in range(lo, hi):
                for f in range(nf):
                    grad[j, f] = 0
            for f in range(nf):
                a = arg[v, f]
                if a >= 0:
                    grad[a, f] = grad_out[v, f]
        else:
            scale = grad_out.dtype.type(1)
            if reduce == MEAN and hi > lo:
                scale = scale / grad_out.dtype.type(hi - lo)
            for j in range(lo, hi):
                for f in range(nf):
                    grad[j, f] = grad_out[v, f] * scale


@register("segment_reduce", "cpu")
def segment_reduce(
    indptr: torch.Tensor, values: torch.Tensor, reduce: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """See :func:`ngra.kernels.ref.segment_reduce.segment_reduce`."""
    code = REDUCE_CODES[reduce]
    out = torch.empty((indptr.numel() - 1, values.shape[1]), dtype=values.dtype)
    arg = torch.empty(out.shape, dtype=torch.int64) if code in (MAX, MIN) else None
    ip = as_numpy(indptr)
    arg_np = as_numpy(arg) if arg is not None else dummy(np.int64, 2)
    run_rows(_segment_reduce, ip, ip, as_numpy(values), as_numpy(out), arg_np, code)
    return out, arg


@register("segment_reduce_backward", "cpu")
def segment_reduce_backward(
    indptr: torch.Tensor, grad_out: torch.Tensor, arg: torch.Tensor | None, reduce: str,
    num_rows: int | None = None,
) -> torch.Tensor:
    """See :func:`ngra.kernels.ref.segment_reduce.segment_reduce_backward`."""
    grad = torch.empty((int(indptr[-1]), grad_out.shape[1]), dtype=grad_out.dtype)
    ip = as_numpy(indptr)
    arg_np = as_numpy(arg) if arg is not None else dummy(np.int64, 2)
    run_rows(
        _segment_reduce_backward,
        ip,
        ip,
        as_numpy(grad_out),
        arg_np,
        as_numpy(grad),
        REDUCE_CODES[reduce],
    )
    return grad
