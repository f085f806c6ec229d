"""Reference ``softmax_aggregate``: plain torch, the specification and test oracle.

Materializes the ``[E, H]`` scores and even the ``[E, H, D]`` messages; it is
meant to be obviously correct, not fast. The fused backends must agree with it.

Math (per destination ``v``, head ``h``, over in-edges ``u -> v``)::

    e_uv     = leaky_relu(score_src[u, h] + score_dst[v, h], negative_slope)
    alpha_uv = exp(e_uv - lse[v, h]),   lse[v, h] = log sum_u exp(e_uv)
    out[v, h] = sum_u alpha_uv * value[u, h]

Backward, with ``g = grad_out`` and ``delta[v, h] = g[v, h] . out[v, h]``::

    d value[u, h]  = sum_{v: u -> v} alpha_uv * g[v, h]
    d e_uv         = alpha_uv * (g[v, h] . value[u, h] - delta[v, h])
    d raw_uv       = d e_uv * (1 if raw_uv > 0 else negative_slope)
    d score_src[u] = sum over out-edges of d raw;  d score_dst[v] = sum over in-edges.

With attention dropout (``drop``, an ``EdgeDropout``: ``k_uv`` = 1/(1-p) where the
weight is kept, else 0) the sum uses ``alpha_uv * k_uv`` while ``lse`` stays the
undropped normalizer; backward replaces ``alpha_uv`` by ``alpha_uv k_uv`` in
``d value`` and ``dp_uv`` by ``k_uv dp_uv`` in ``d e_uv``. ``delta = g . out`` still
holds, as ``out`` is the dropped sum::

    out[v, h]     = sum_u alpha_uv k_uv value[u, h]
    d value[u, h] = sum_v alpha_uv k_uv g[v, h]
    d e_uv        = alpha_uv * (k_uv g[v, h] . value[u, h] - delta[v, h])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ngra.kernels.ref.dropout import edge_keep_scale
from ngra.kernels.registry import register

__all__ = ["fold_score_grads", "softmax_aggregate_bwd", "softmax_aggregate_bwd_fold",
           "softmax_aggregate_fwd"]


def _edge_ends(indptr: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    num_dst = indptr.numel() - 1
    deg = indptr[1:] - indptr[:-1]
    dst = torch.repeat_interleave(
        torch.arange(num_dst, device=indptr.device), deg.long(), output_size=indices.numel()
    )
    return indices.long(), dst


@register("softmax_aggregate_fwd", "ref")
def softmax_aggregate_fwd(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    score_src: torch.Tensor,
    score_dst: torch.Tensor,
    value: torch.Tensor,
    negative_slope: float,
    drop=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``out [num_dst, H, D]`` and ``lse [num_dst, H]`` (``-inf`` where in-degree
    is 0); ``drop``: an ``EdgeDropout`` of the weights, or ``None``."""
    src, dst = _edge_ends(indptr, indices)
    num_dst, heads = score_dst.shape
    e = F.leaky_relu(score_src[src] + score_dst[dst], negative_slope)  # [E, H]
    idx = dst.unsqueeze(1).expand(-1, heads)
    m = torch.full((num_dst, heads), -torch.inf, dtype=e.dtype, device=e.device)
    m = m.scatter_reduce(0, idx, e, "amax", include_self=True)
    p = torch.exp(e - m[dst])
    s = torch.zeros_like(m).index_add_(0, dst, p)
    alpha = p / s[dst]
    if drop is not None:
        alpha = alpha * edge_keep_scale(drop, heads, alpha.dtype, alpha.device)
    out = value.new_zeros((num_dst,) + tuple(value.shape[1:]))
    out.index_add_(0, dst, alpha.unsqueeze(-1) * value[src])
    lse = m + torch.log(s)  # -inf + log(0) = -inf for isolated destinations
    return out, lse


@register("softmax_aggregate_bwd", "ref")
def softmax_aggregate_bwd(
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
    drop=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(d score_src, d score_dst, d value)``; ``rev`` is not needed here.
    ``out=None``: ``g[v] . out[v]`` is summed from the edges (``sum_u alpha_uv dp_uv``)."""
    src, dst = _edge_ends(indptr, indices)
    raw = score_src[src] + score_dst[dst]
    e = F.leaky_relu(raw, negative_slope)
    alpha = torch.exp(e - lse[dst])  # [E, H]
    g_dst = grad_out[dst]  # [E, H, D]
    dp = (g_dst * value[src]).sum(-1)
    keep = 1.0 if drop is None else edge_keep_scale(drop, alpha.shape[1], alpha.dtype,
                                                    alpha.device)
    dp = dp * keep
    if out is None:
        delta = torch.zeros_like(lse, dtype=dp.dtype).index_add_(0, dst, alpha.to(dp.dtype) * dp)
    else:
        delta = (grad_out * out).sum(-1)  # [num_dst, H]
    d_e = alpha * (dp - delta[dst])
    # Same convention as torch's leaky_relu backward: slope 1 only where raw > 0.
    d_raw = torch.where(raw > 0, d_e, d_e * negative_slope)
    g_score_src = torch.zeros_like(score_src).index_add_(0, src, d_raw)
    g_score_dst = torch.zeros_like(score_dst).index_add_(0, dst, d_raw)
    g_value = torch.zeros_like(value).index_add_(0, src, (alpha * keep).unsqueeze(-1) * g_dst)
    return g_score_src, g_score_dst, g_value


def fold_score_grads(bwd, indptr, indices, rev, value, w_src, w_dst, score_src, score_dst, lse,
                     grad_out, negative_slope, drop=None):
    """``(d value, d w_src, d w_dst)`` when ``score_src = value . w_src`` and
    ``score_dst = value . w_dst`` (per head; ``w`` ``[H, D]``), from the score and value
    gradients of ``bwd`` (a ``softmax_aggregate_bwd``) and the chain rule through the
    row dot products. Plain torch on any device; never in place."""
    g_ss, g_sd, g_value = bwd(indptr, indices, rev, score_src, score_dst, value, None, lse,
                              grad_out, negative_slope, drop=drop)
    g_value = g_value + g_ss.unsqueeze(-1) * w_src + g_sd.unsqueeze(-1) * w_dst
    g_w_src = (g_ss.unsqueeze(-1) * value).sum(0)
    g_w_dst = (g_sd.unsqueeze(-1) * value).sum(0)
    return g_value, g_w_src, g_w_dst


@register("softmax_aggregate_bwd_fold", "ref")
def softmax_aggregate_bwd_fold(indptr, indices, rev, value, w_src, w_dst, score_src, score_dst,
                               lse, grad_out, negative_slope, inplace, drop=None):
    """:func:`fold_score_grads` over :func:`softmax_aggregate_bwd`; ``inplace`` is ignored."""
    return fold_score_grads(softmax_aggregate_bwd, indptr, indices, rev, value, w_src, w_dst,
                            score_src, score_dst, lse, grad_out, negative_slope, drop)
