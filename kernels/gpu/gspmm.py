"""CUDA g-SpMM: torch's gather + ``index_add_`` / ``scatter_reduce_`` kernels.

The plain-torch formulation of ``ref/`` runs unchanged on CUDA (atomics make the
scatter race-free there); it materializes ``[E, H, D]`` messages, which a fused
CUDA kernel would avoid.
"""

from __future__ import annotations

from ngra.kernels.gpu._util import require_cuda
from ngra.kernels.ref import gspmm as _ref
from ngra.kernels.registry import register


@register("gspmm", "gpu")
def gspmm(indptr, indices, src, edge, reduce, eperm=None):
    """See :func:`ngra.kernels.ref.gspmm.gspmm` (same contract)."""
    require_cuda(indptr, indices, src, edge, eperm)
    return _ref.gspmm(indptr, indices, src, edge, reduce, eperm)


@register("gspmm_backward", "gpu")
def gspmm_backward(indptr, indices, rev, grad_out, src, edge, need_src, need_edge):
    """See :func:`ngra.kernels.ref.gspmm.gspmm_backward` (same contract)."""
    require_cuda(indptr, indices, grad_out, src, edge)
    return _ref.gspmm_backward(indptr, indices, rev, grad_out, src, edge, need_src, need_edge)


@register("gspmm_arg_backward", "gpu")
def gspmm_arg_backward(indptr, indices, rev, grad_out, src, edge, arg, need_src, need_edge):
    """See :func:`ngra.kernels.ref.gspmm.gspmm_arg_backward` (same contract)."""
    require_cuda(indptr, indices, grad_out, src, edge, arg)
    return _ref.gspmm_arg_backward(
        indptr, indices, rev, grad_out, src, edge, arg, need_src, need_edge
    )
