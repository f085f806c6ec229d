"""CUDA edge softmax: torch ``scatter_reduce_`` / ``index_add_`` (the ``ref/`` formulation)."""

from __future__ import annotations

from ngra.kernels.gpu._util import require_cuda
from ngra.kernels.ref import edge_softmax as _ref
from ngra.kernels.registry import register


@register("edge_softmax", "gpu")
def edge_softmax(indptr, scores):
    """See :func:`ngra.kernels.ref.edge_softmax.edge_softmax`."""
    require_cuda(indptr, scores)
    return _ref.edge_softmax(indptr, scores)


@register("edge_softmax_backward", "gpu")
def edge_softmax_backward(indptr, p, grad):
    """See :func:`ngra.kernels.ref.edge_softmax.edge_softmax_backward`."""
    require_cuda(indptr, p, grad)
    return _ref.edge_softmax_backward(indptr, p, grad)
