"""Edge softmax: normalize edge scores over each destination's in-edges."""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.checks import check_feat, check_indptr, check_same_device, kernel_offsets
from ngra.kernels.registry import current_backend, lookup, use_backend

__all__ = ["edge_softmax"]


def edge_softmax(indptr: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    r"""Softmax of edge scores over the in-edges of each destination.

    .. math::
        p_e = \frac{\exp(s_e - m_v)}{\sum_{e' \to v} \exp(s_{e'} - m_v)},
        \qquad m_v = \max_{e' \to v} s_{e'}

    Subtracting the per-destination max keeps it finite for large scores.
    Differentiable: :math:`\partial L / \partial s = p \odot (g - \sum_v p \odot g)`.

    Args:
        indptr: ``[num_dst + 1]`` int32/int64 CSC offsets over destinations.
        scores: ``[E]`` or ``[E, H]`` (any trailing shape: one softmax per
            trailing element) float32/float64, in CSC edge order.

    Returns:
        Probabilities with the shape of ``scores``.
    """
    scores = check_feat(scores, "scores")
    check_indptr(indptr, scores.shape[0])
    check_same_device(indptr, scores=scores)
    flat = scores.reshape(scores.shape[0], math.prod(scores.shape[1:])).contiguous()
    out = _EdgeSoftmax.apply(kernel_offsets(indptr), flat)
    return out.view(scores.shape)


class _EdgeSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, indptr, scores):
        ctx.backend = current_backend()
        p = lookup("edge_softmax", scores.device)(indptr, scores)
        ctx.save_for_backward(indptr, p)
        return p

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        with use_backend(ctx.backend):
            return _EdgeSoftmax._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        indptr, p = ctx.saved_tensors
        return None, lookup("edge_softmax_backward", p.device)(indptr, p, grad.contiguous())
