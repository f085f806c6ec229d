"""CUDA segment reduction: torch scatter kernels (the ``ref/`` formulation)."""

from __future__ import annotations

from ngra.kernels.gpu.util import require_cuda
from ngra.kernels.ref import segment_reduce as _ref
from ngra.kernels.registry import register


@register("segment_reduce", "gpu")
def segment_reduce(indptr, values, reduce):
    """See :func:`ngra.kernels.ref.segment_reduce.segment_reduce`."""
    require_cuda(indptr, values)
    return _ref.segment_reduce(indptr, values, reduce)


@register("segment_reduce_backward", "gpu")
def segment_reduce_backward(indptr, grad_out, arg, reduce):
    """See :func:`ngra.kernels.ref.segment_reduce.segment_reduce_backward`."""
    require_cuda(indptr, grad_out, arg)
    return _ref.segment_reduce_backward(indptr, grad_out, arg, reduce)
