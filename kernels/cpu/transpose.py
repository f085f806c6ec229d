"""numba CSC -> CSR transpose: a stable counting sort, O(E), serial.

Specializations: {int32, int64} offsets x {int32, int64} indices.
"""

from __future__ import annotations

import torch
from numba import njit

from ngra.idtype import offsets_dtype
from ngra.kernels.cpu.util import as_numpy
from ngra.kernels.registry import register


@njit(cache=True, nogil=True)
def _transpose(indptr, indices, rev_indptr, rev_indices, rev_perm, with_perm):
    num_src = rev_indptr.shape[0] - 1
    rev_indptr[:] = 0
    for j in range(indices.shape[0]):
        rev_indptr[indices[j] + 1] += 1
    for u in range(num_src):
        rev_indptr[u + 1] += rev_indptr[u]
    cursor = rev_indptr[:num_src].copy()
    # Walking edges in CSC order keeps each source's edges in CSC order (stable).
    for v in range(indptr.shape[0] - 1):
        for j in range(indptr[v], indptr[v + 1]):
            u = indices[j]
            pos = cursor[u]
            rev_indices[pos] = v
            if with_perm:
                rev_perm[pos] = j
            cursor[u] = pos + 1


@register("transpose_csc", "cpu")
def transpose_csc(
    indptr: torch.Tensor, indices: torch.Tensor, num_src: int, with_perm: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """See :func:`ngra.kernels.ref.transpose.transpose_csc`."""
    offsets = offsets_dtype(indices.numel())
    rev_indptr = torch.empty(num_src + 1, dtype=offsets)
    rev_indices = torch.empty_like(indices)
    rev_perm = torch.empty(indices.numel() if with_perm else 1, dtype=offsets)
    _transpose(
        as_numpy(indptr),
        as_numpy(indices),
        as_numpy(rev_indptr),
        as_numpy(rev_indices),
        as_numpy(rev_perm),
        with_perm,
    )
    return rev_indptr, rev_indices, rev_perm if with_perm else None
