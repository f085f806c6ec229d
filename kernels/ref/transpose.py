"""Reference CSC -> CSR transpose (plain torch)."""

from __future__ import annotations

import torch

from ngra.idtype import offsets_dtype
from ngra.kernels.ref.util import dst_ids
from ngra.kernels.registry import register


@register("transpose_csc", "ref")
def transpose_csc(
    indptr: torch.Tensor, indices: torch.Tensor, num_src: int, with_perm: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The same edges grouped by source: ``(rev_indptr [num_src + 1], rev_indices [E] =
    destinations (dtype of ``indices``), rev_perm [E] = CSC position of each CSR edge, or
    ``None`` without ``with_perm``)``; edges of one source stay in CSC order. Offsets and
    positions take :func:`ngra.idtype.offsets_dtype`."""
    offsets = offsets_dtype(indices.numel())
    perm = torch.argsort(indices, stable=True)
    counts = torch.bincount(indices, minlength=num_src)
    rev_indptr = torch.zeros(num_src + 1, dtype=torch.int64, device=indices.device)
    torch.cumsum(counts, 0, out=rev_indptr[1:])
    rev_indices = dst_ids(indptr).index_select(0, perm).to(indices.dtype)
    return rev_indptr.to(offsets), rev_indices, perm.to(offsets) if with_perm else None
