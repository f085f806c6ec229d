"""CUDA ``softmax_aggregate`` in plain torch (no compiled extension, imports without CUDA).

Edge-parallel: the ``[E, H]`` scores are formed (cheap on a GPU, as in DGL's
GATConv), but the ``[E, H, D]`` messages never are: edges are processed in chunks
of about :data:`CHUNK_ELEMENTS` message elements, each chunk's weighted rows
``index_add_``-ed (atomics) into the output. Backward recomputes ``alpha`` from
the saved log-sum-exp the same way. The registered kernels require CUDA tensors
(like every ``gpu`` kernel); the implementations :func:`forward` / :func:`backward`
are device-agnostic, so the tests check them on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ngra.kernels.gpu._util import require_cuda
from ngra.kernels.ref.softmax_aggregate import fold_score_grads
from ngra.kernels.registry import register

__all__ = ["CHUNK_ELEMENTS", "backward", "forward", "softmax_aggregate_bwd",
           "softmax_aggregate_bwd_fold", "softmax_aggregate_fwd"]

# Transient message elements per chunk (2^24 float32 = 64 MiB).
CHUNK_ELEMENTS = 1 << 24


def _edges(indptr: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    deg = (indptr[1:] - indptr[:-1]).long()
    dst = torch.repeat_interleave(
        torch.arange(deg.numel(), device=indices.device), deg, output_size=indices.numel()
    )
    return indices.long(), dst


def _chunk_edges(row: int) -> int:
    """Edges per chunk for message rows of ``row`` elements."""
    return max(1, CHUNK_ELEMENTS // max(row, 1))


def _scores(score_src, score_dst, src, dst, negative_slope):
    raw = score_src[src] + score_dst[dst]
    return raw, F.leaky_relu(raw, negative_slope)


def forward(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    score_src: torch.Tensor,
    score_dst: torch.Tensor,
    value: torch.Tensor,
    negative_slope: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``out [num_dst, H, D]`` and ``lse [num_dst, H]`` (``-inf`` where in-degree is 0)."""
    src, dst = _edges(indptr, indices)
    num_dst, heads = score_dst.shape
    _, e = _scores(score_src, score_dst, src, dst, negative_slope)
    m = torch.full((num_dst, heads), -torch.inf, dtype=e.dtype, device=e.device)
    m = m.scatter_reduce(0, dst.unsqueeze(1).expand(-1, heads), e, "amax", include_self=True)
    p = torch.exp(e - m[dst])
    s = torch.zeros_like(m).index_add_(0, dst, p)
    alpha = p / s[dst]
    del e, p
    out = value.new_zeros((num_dst,) + tuple(value.shape[1:]))
    step = _chunk_edges(heads * value.shape[2])
    for lo in range(0, src.numel(), step):
        hi = lo + step
        out.index_add_(0, dst[lo:hi], alpha[lo:hi].unsqueeze(-1) * value[src[lo:hi]])
    return out, m + torch.log(s)


def backward(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    rev: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    score_src: torch.Tensor,
    score_dst: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor | None,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    negative_slope: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(d score_src, d score_dst, d value)``; ``rev`` is not needed (atomics).
    ``out=None``: ``g[v] . out[v]`` is summed from the edges in the same chunk loop."""
    src, dst = _edges(indptr, indices)
    raw, e = _scores(score_src, score_dst, src, dst, negative_slope)
    alpha = torch.exp(e - lse[dst])
    del e
    delta = None if out is None else (grad_out * out).sum(-1)
    sums = alpha.new_zeros(lse.shape) if out is None else None
    d_raw = torch.empty_like(alpha)
    g_value = torch.zeros_like(value)
    step = _chunk_edges(value.shape[1] * value.shape[2])
    for lo in range(0, src.numel(), step):
        hi = lo + step
        s_c, d_c, a_c = src[lo:hi], dst[lo:hi], alpha[lo:hi]
        g_c = grad_out[d_c]
        dp = (g_c * value[s_c]).sum(-1)
        d_raw[lo:hi] = a_c * dp
        if sums is not None:
            sums.index_add_(0, d_c, d_raw[lo:hi])
        g_value.index_add_(0, s_c, a_c.unsqueeze(-1) * g_c)
    d_raw -= alpha * (sums if delta is None else delta)[dst]
    d_raw = torch.where(raw > 0, d_raw, d_raw * negative_slope)
    g_score_src = torch.zeros_like(score_src).index_add_(0, src, d_raw)
    g_score_dst = torch.zeros_like(score_dst).index_add_(0, dst, d_raw)
    return g_score_src, g_score_dst, g_value


@register("softmax_aggregate_fwd", "gpu")
def softmax_aggregate_fwd(indptr, indices, score_src, score_dst, value, negative_slope):
    """See :func:`forward`; CUDA tensors only."""
    require_cuda(indptr, indices, score_src, score_dst, value)
    return forward(indptr, indices, score_src, score_dst, value, negative_slope)


@register("softmax_aggregate_bwd", "gpu")
def softmax_aggregate_bwd(indptr, indices, rev, score_src, score_dst, value, out, lse, grad_out,
                          negative_slope):
    """See :func:`backward`; CUDA tensors only."""
    require_cuda(indptr, indices, score_src, score_dst, value, out, lse, grad_out)
    return backward(indptr, indices, rev, score_src, score_dst, value, out, lse, grad_out,
                    negative_slope)


@register("softmax_aggregate_bwd_fold", "gpu")
def softmax_aggregate_bwd_fold(indptr, indices, rev, value, w_src, w_dst, score_src, score_dst,
                               lse, grad_out, negative_slope, inplace):
    """The reference's fold over :func:`backward`; CUDA tensors only, never in place."""
    require_cuda(indptr, indices, value, w_src, w_dst, score_src, score_dst, lse, grad_out)
    return fold_score_grads(softmax_aggregate_bwd, indptr, indices, rev, value, w_src, w_dst,
                            score_src, score_dst, lse, grad_out, negative_slope)
