"""Segment reduction over rows sorted by segment (the generic executor's Gather)."""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.checks import (
    REDUCES,
    check_choice,
    check_feat,
    check_indptr,
    check_same_device,
    kernel_offsets,
)
from ngra.kernels.registry import current_backend, lookup, use_backend

__all__ = ["segment_reduce"]


def segment_reduce(indptr: torch.Tensor, values: torch.Tensor, reduce: str = "sum") -> torch.Tensor:
    r"""Reduce contiguous row segments: ``out[s] = reduce(values[indptr[s]:indptr[s+1]])``.

    With a CSC ``indptr`` and per-edge values in CSC order this is the Gather of
    an edge-wise UDF. Empty segments give 0. Differentiable; for max/min the
    gradient goes to the first extreme row.

    Args:
        indptr: ``[num_seg + 1]`` int32/int64 offsets, ``indptr[-1] == len(values)``.
        values: ``[E, *F]`` float32/float64.
        reduce: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``. (default: ``"sum"``)

    Returns:
        ``[num_seg, *F]``.
    """
    check_choice(reduce, "reduce", REDUCES)
    values = check_feat(values, "values")
    num_seg = check_indptr(indptr, values.shape[0])
    check_same_device(indptr, values=values)
    flat = values.reshape(values.shape[0], math.prod(values.shape[1:])).contiguous()
    out = _SegmentReduce.apply(kernel_offsets(indptr), flat, reduce)
    return out.view((num_seg,) + tuple(values.shape[1:]))


class _SegmentReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, indptr, values, reduce):
        ctx.backend = current_backend()
        out, arg = lookup("segment_reduce", values.device)(indptr, values, reduce)
        ctx.reduce, ctx.rows = reduce, values.shape[0]
        ctx.save_for_backward(indptr, arg)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        with use_backend(ctx.backend):
            return _SegmentReduce._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out):
        indptr, arg = ctx.saved_tensors
        grad = lookup("segment_reduce_backward", grad_out.device)(
            indptr, grad_out.contiguous(), arg, ctx.reduce, ctx.rows
        )
        return None, grad, None
