"""numba Linear over the non-zeros of ``x``: one row at a time, columns in increasing
order, from zero (:mod:`ngra.kernels.ref.sparse_input` spells the order out).

Each output row has one writer and one sequential sum, and no fast-math flag lets LLVM
reorder or fuse it (it vectorizes across the output columns only), so the bits depend
neither on the thread count nor on which thread takes which rows, and ``scan_linear`` of a
dense ``x`` equals ``csr_linear`` of its CSR copy bit for bit.
"""

from __future__ import annotations

import torch
from numba import njit

from ngra.kernels.cpu.util import as_numpy, run_ranges, run_rows
from ngra.kernels.registry import register

#: Below this many bytes of ``x`` one thread scans it (waking the pool costs ~50 us).
_MIN_PARALLEL_BYTES = 1 << 20


@njit(nogil=True, cache=True)
def _csr_rows(indptr, indices, values, wt, out, v0, v1):  # pragma: no cover - numba
    fo = wt.shape[1]
    for r in range(v0, v1):
        for j in range(fo):
            out[r, j] = 0
        for k in range(indptr[r], indptr[r + 1]):
            c, v = indices[k], values[k]
            for j in range(fo):
                out[r, j] += v * wt[c, j]


@njit(nogil=True, cache=True)
def _scan_rows(x, wt, out, v0, v1):  # pragma: no cover - numba
    fi, fo = x.shape[1], wt.shape[1]
    for r in range(v0, v1):
        for j in range(fo):
            out[r, j] = 0
        for c in range(fi):
            v = x[r, c]
            if v != 0:  # as x.nonzero(): -0.0 is skipped, NaN is not
                for j in range(fo):
                    out[r, j] += v * wt[c, j]


@register("csr_linear", "cpu")
def csr_linear(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor,
               wt: torch.Tensor) -> torch.Tensor:
    """See :func:`ngra.kernels.ref.sparse_input.csr_linear`."""
    out = torch.empty(indptr.numel() - 1, wt.shape[1], dtype=wt.dtype)
    ip = as_numpy(indptr)
    run_rows(_csr_rows, ip, ip, as_numpy(indices), as_numpy(values), as_numpy(wt.contiguous()),
             as_numpy(out), row_bytes=wt.shape[1] * wt.element_size())
    return out


@register("scan_linear", "cpu")
def scan_linear(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    """See :func:`ngra.kernels.ref.sparse_input.scan_linear`."""
    n = x.shape[0]
    out = torch.empty(n, wt.shape[1], dtype=wt.dtype)
    big = x.numel() * x.element_size() >= _MIN_PARALLEL_BYTES
    run_ranges(_scan_rows, n, torch.get_num_threads() if big else 1, as_numpy(x),
               as_numpy(wt.contiguous()), as_numpy(out))
    return out
