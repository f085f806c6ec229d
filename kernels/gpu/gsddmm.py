"""CUDA g-SDDMM: torch row gathers and element-wise ops (the ``ref/`` formulation)."""

from __future__ import annotations

from ngra.kernels.gpu.util import require_cuda
from ngra.kernels.ref import gsddmm as _ref
from ngra.kernels.registry import register


@register("gsddmm", "gpu")
def gsddmm(indptr, indices, lhs, rhs, op, lhs_target, rhs_target):
    """See :func:`ngra.kernels.ref.gsddmm.gsddmm` (same contract)."""
    require_cuda(indptr, indices, lhs, rhs)
    return _ref.gsddmm(indptr, indices, lhs, rhs, op, lhs_target, rhs_target)
