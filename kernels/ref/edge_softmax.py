"""Reference edge softmax over each destination's in-edges (plain torch)."""

from __future__ import annotations

import torch

from ngra.kernels.ref.util import dst_ids
from ngra.kernels.registry import register


@register("edge_softmax", "ref")
def edge_softmax(indptr: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """``p[j, h] = exp(s[j, h] - m[v, h]) / sum_{k in v} exp(s[k, h] - m[v, h])``.

    ``scores`` [E, H]; ``v`` is edge j's destination and ``m[v]`` its max score.
    """
    num_dst = indptr.numel() - 1
    seg = dst_ids(indptr)
    idx = seg.view(-1, 1).expand_as(scores)
    m = scores.new_full((num_dst, scores.shape[1]), float("-inf"))
    m.scatter_reduce_(0, idx, scores, "amax", include_self=True)
    ex = torch.exp(scores - m.index_select(0, seg))
    den = scores.new_zeros(m.shape).index_add_(0, seg, ex)
    return ex / den.index_select(0, seg)


@register("edge_softmax_backward", "ref")
def edge_softmax_backward(
    indptr: torch.Tensor, p: torch.Tensor, grad: torch.Tensor
) -> torch.Tensor:
    """``grad_s[j] = p[j] * (grad[j] - sum_{k in v} p[k] * grad[k])`` (``[E, H]``)."""
    seg = dst_ids(indptr)
    s = p.new_zeros((indptr.numel() - 1, p.shape[1])).index_add_(0, seg, p * grad)
    return p * (grad - s.index_select(0, seg))
