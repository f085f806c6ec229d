"""Triton edge softmax: one program per destination, its in-edges' scores in blocks.

Forward: one pass with an online max and sum (the sum rescaled whenever the max
grows), a second writing ``p = exp(s - m) / sum``. Backward: one pass summing
``p * g`` over the in-edges, a second writing ``p * (g - sum)``. Scores and
probabilities are ``[E, H]`` (the op's own input and output); nothing else per edge.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ngra.kernels.gpu.util import autotune, pow2, require_cuda
from ngra.kernels.registry import register

_CONFIGS = [triton.Config({"BLOCK_E": 32}, num_warps=1),
            triton.Config({"BLOCK_E": 64}, num_warps=2),
            triton.Config({"BLOCK_E": 128}, num_warps=4)]


@autotune(_CONFIGS, key=["H"])
@triton.jit
def _softmax_rows(indptr, scores, p, H, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    v = tl.program_id(0).to(tl.int64)
    hs = tl.arange(0, BLOCK_H)
    hmask = hs < H
    start = tl.load(indptr + v)
    end = tl.load(indptr + v + 1)
    m = tl.full([BLOCK_H], float("-inf"), scores.dtype.element_ty)
    s = tl.zeros([BLOCK_H], m.dtype)
    for j in range(start, end, BLOCK_E):
        e = j + tl.arange(0, BLOCK_E)
        m2 = (e < end)[:, None] & hmask[None, :]
        x = tl.load(scores + e[:, None] * H + hs[None, :], mask=m2, other=float("-inf"))
        # a lane that has seen only -inf keeps m = -inf; shift it by 0, not by -inf (NaN)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift[None, :]), axis=0)
        m = m_new
    for j in range(start, end, BLOCK_E):
        e = j + tl.arange(0, BLOCK_E)
        m2 = (e < end)[:, None] & hmask[None, :]
        x = tl.load(scores + e[:, None] * H + hs[None, :], mask=m2, other=0.0)
        tl.store(p + e[:, None] * H + hs[None, :], tl.exp(x - m[None, :]) / s[None, :], mask=m2)


@autotune(_CONFIGS, key=["H"])
@triton.jit
def _softmax_grad_rows(indptr, p, g, out, H, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    v = tl.program_id(0).to(tl.int64)
    hs = tl.arange(0, BLOCK_H)
    hmask = hs < H
    start = tl.load(indptr + v)
    end = tl.load(indptr + v + 1)
    acc = tl.zeros([BLOCK_H], out.dtype.element_ty)
    for j in range(start, end, BLOCK_E):
        e = j + tl.arange(0, BLOCK_E)
        m2 = (e < end)[:, None] & hmask[None, :]
        off = e[:, None] * H + hs[None, :]
        acc += tl.sum(tl.load(p + off, mask=m2, other=0.0) * tl.load(g + off, mask=m2, other=0.0),
                      axis=0)
    for j in range(start, end, BLOCK_E):
        e = j + tl.arange(0, BLOCK_E)
        m2 = (e < end)[:, None] & hmask[None, :]
        off = e[:, None] * H + hs[None, :]
        pv = tl.load(p + off, mask=m2, other=0.0)
        gv = tl.load(g + off, mask=m2, other=0.0)
        tl.store(out + off, pv * (gv - acc[None, :]), mask=m2)


@register("edge_softmax", "gpu")
def edge_softmax(indptr: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """See :func:`ngra.kernels.ref.edge_softmax.edge_softmax`."""
    require_cuda(indptr, scores)
    p = torch.empty_like(scores)
    num_dst, heads = indptr.numel() - 1, scores.shape[1]
    if num_dst and scores.numel():
        _softmax_rows[(num_dst,)](indptr, scores, p, heads, BLOCK_H=pow2(heads))
    return p


@register("edge_softmax_backward", "gpu")
def edge_softmax_backward(indptr: torch.Tensor, p: torch.Tensor, grad: torch.Tensor
                          ) -> torch.Tensor:
    """See :func:`ngra.kernels.ref.edge_softmax.edge_softmax_backward`."""
    require_cuda(indptr, p, grad)
    out = torch.empty_like(p)
    num_dst, heads = indptr.numel() - 1, p.shape[1]
    if num_dst and p.numel():
        _softmax_grad_rows[(num_dst,)](indptr, p, grad, out, heads, BLOCK_H=pow2(heads))
    return out
