"""Reference Linear over the non-zeros of ``x`` (plain torch), the order spelled out.

Both ops compute ``out[r] = sum_c x[r, c] * wt[c]`` over the non-zero ``x[r, c]`` of
row ``r`` only, one row at a time, in increasing column ``c``, from zero: the fixed
order :mod:`ngra.kernels.sparse_input` guarantees (its two ops give the same bits).
"""

from __future__ import annotations

import torch

from ngra.kernels.ref.util import dst_ids
from ngra.kernels.registry import register


def _rows_in_order(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor,
                   wt: torch.Tensor) -> torch.Tensor:
    n = indptr.numel() - 1
    out = wt.new_zeros(n, wt.shape[1])
    rows = dst_ids(indptr)
    pos = torch.arange(indices.numel()) - indptr.long()[rows]  # place within its row
    for k in range(int(pos.max()) + 1 if pos.numel() else 0):
        at = (pos == k).nonzero().squeeze(1)  # at most one entry per row
        r = rows[at]
        out[r] = out[r] + values[at].unsqueeze(1) * wt[indices[at].long()]
    return out


@register("csr_linear", "ref")
def csr_linear(indptr: torch.Tensor, indices: torch.Tensor, values: torch.Tensor,
               wt: torch.Tensor) -> torch.Tensor:
    """``[N, F_out]``: the CSR matrix ``(indptr [N + 1], indices [nnz] columns sorted in
    each row, values [nnz])`` times ``wt`` ``[F_in, F_out]``, in the module's order."""
    return _rows_in_order(indptr, indices, values, wt)


@register("scan_linear", "ref")
def scan_linear(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    """``x @ wt`` ``[N, F_out]`` for a dense ``x`` ``[N, F_in]``, summed over its
    non-zeros in the module's order (bit for bit :func:`csr_linear` of its CSR copy)."""
    rows, cols = x.nonzero().unbind(1)  # row-major
    indptr = torch.zeros(x.shape[0] + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(rows, minlength=x.shape[0]), 0, out=indptr[1:])
    return _rows_in_order(indptr, cols, x[rows, cols], wt)
