"""CUDA CSC -> CSR transpose: torch's stable sort (the ``ref/`` formulation)."""

from __future__ import annotations

from ngra.kernels.gpu._util import require_cuda
from ngra.kernels.ref import transpose as _ref
from ngra.kernels.registry import register


@register("transpose_csc", "gpu")
def transpose_csc(indptr, indices, num_src, with_perm=True):
    """See :func:`ngra.kernels.ref.transpose.transpose_csc`."""
    require_cuda(indptr, indices)
    return _ref.transpose_csc(indptr, indices, num_src, with_perm)
