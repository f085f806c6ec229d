"""``softmax_aggregate``: GAT's whole attention (score, edge softmax, weighted sum) as one op.

The public function validates its arguments, then runs a custom autograd
Function whose forward and backward are the registered backend kernels
``"softmax_aggregate_fwd"`` / ``"softmax_aggregate_bwd"`` (see ``ref/``, ``cpu/``,
``gpu/``). The backend is chosen once, at forward time, and the same backend runs
the backward.

Only ``O(num_dst * H)`` is saved for backward beyond the inputs: the
per-destination log-sum-exp. The backward recomputes the attention weights, and
``g[v] . out[v]`` from them, so the output is not kept either (for GAT one
``N x H x D`` tensor less per layer; the output is freed once ApplyVertex has read it).

Attention dropout (``dropout=``, an :class:`~ngra.kernels.dropout.EdgeDropout`) drops
the normalized weights inside the kernels: forward and backward hash each weight's
keep flag from its edge's counter (see ``EdgeDropout``: the runtime passes the
graph's original edge ids, ``Graph.perm``, or a distributed runtime's global edge
ids), so only the seeds and the counter array (which the graph already holds) are
kept for backward, never an ``[E, H]`` mask.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.checks import (
    check_csc,
    check_feat,
    check_rev,
    check_same_device,
    check_slope,
    kernel_offsets,
)
from ngra.kernels.dropout import EdgeDropout, check_edge_dropout
from ngra.kernels.registry import lookup
from ngra.kernels.transpose import reverse_of

__all__ = ["softmax_aggregate", "softmax_aggregate_backward"]


def softmax_aggregate(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    score_src: torch.Tensor,
    score_dst: torch.Tensor,
    value: torch.Tensor,
    *,
    negative_slope: float = 0.2,
    rev: Any = None,
    return_lse: bool = False,
    dropout: EdgeDropout | None = None,
) -> Any:
    r"""Attention-weighted aggregation over each destination's in-edges (GAT).

    .. math::
        e_{uv} = \mathrm{LeakyReLU}(s^{src}_{u,h} + s^{dst}_{v,h}), \quad
        \alpha_{uv} = \frac{\exp e_{uv}}{\sum_{w \to v} \exp e_{wv}}, \quad
        \mathrm{out}_{v,h} = \sum_{u \to v} \alpha_{uv}\, \mathrm{value}_{u,h}

    computed per destination in one pass with an online max/sum, so no ``[E, H]``
    or ``[E, H, D]`` tensor is formed by the fused backends. A destination without
    in-edges gets 0. Differentiable in ``score_src``, ``score_dst`` and ``value``.

    Args:
        indptr: ``[num_dst + 1]`` int32/int64 CSC offsets over destinations.
        indices: ``[E]`` int32/int64 source of each edge, destination-sorted.
        score_src: ``[num_src, H]`` float32/float64 per-source scores
            (GAT: ``(W x_u * a_src).sum(-1)``).
        score_dst: ``[num_dst, H]`` per-destination scores, same dtype.
        value: ``[num_src, H, D]`` messages, same dtype.
        negative_slope: LeakyReLU slope applied to the summed score (default: ``0.2``).
        rev: optional precomputed reverse (CSR over sources) used by backward:
            ``(rev_indptr [num_src + 1], rev_indices [E] destination ids,
            rev_perm [E] CSC position of each CSR edge)``, or an object with
            ``indptr``/``indices``/``perm`` such as ``ngra.Graph.csr()`` (default:
            built on demand in backward by :func:`ngra.kernels.transpose.reverse_of`,
            which caches the last few).
        return_lse: also return the per-destination log-sum-exp of the scores
            (default: ``False``).
        dropout: attention dropout of the weights ``alpha`` (an
            :class:`~ngra.kernels.dropout.EdgeDropout` with one counter per edge, in
            CSC order, on ``indices``' device), applied as PyG's ``GATConv(dropout=p)``
            does: ``out_v = sum_u alpha_uv k_uv value_u`` with ``k_uv = 1 / (1 - p)``
            where the weight is kept, else 0; the ``lse`` is the undropped normalizer
            (default: ``None``, no dropout).

    Returns:
        ``[num_dst, H, D]`` tensor of ``value``'s dtype; with ``return_lse``, the pair
        ``(out, lse)`` where ``lse`` is ``[num_dst, H]`` float64, ``-inf`` for a
        destination without in-edges, and not differentiable (the chunked executor
        merges per-tile ``lse`` into the normalizer that
        :func:`softmax_aggregate_backward` takes).

    Raises:
        TypeError: non-tensor arguments, wrong dtypes, mixed devices.
        ValueError: inconsistent shapes, malformed ``indptr``, out-of-range indices.
    """
    score_src = check_feat(score_src, "score_src")
    score_dst = check_feat(score_dst, "score_dst")
    value = check_feat(value, "value")
    if score_src.dim() != 2 or score_dst.dim() != 2:
        raise ValueError(
            "score_src and score_dst must be 2-D [num_nodes, H]; got shapes "
            f"{list(score_src.shape)} and {list(score_dst.shape)}. For one head use .unsqueeze(-1)."
        )
    if value.dim() != 3:
        raise ValueError(
            f"value must be 3-D [num_src, H, D]; got shape {list(value.shape)}. "
            "Reshape with value.view(num_src, H, D)."
        )
    if not score_src.dtype == score_dst.dtype == value.dtype:
        raise TypeError(
            "score_src, score_dst and value must share one dtype; got "
            f"{score_src.dtype}, {score_dst.dtype} and {value.dtype}."
        )
    num_src, heads = score_src.shape
    if value.shape[0] != num_src:
        raise ValueError(
            f"value and score_src must have one row per source; got {value.shape[0]} and "
            f"{num_src} rows."
        )
    if score_dst.shape[1] != heads or value.shape[1] != heads:
        raise ValueError(
            f"head counts differ: score_src has H={heads}, score_dst H={score_dst.shape[1]}, "
            f"value H={value.shape[1]} (value is [num_src, H, D])."
        )
    num_dst = check_csc(indptr, indices, num_src)
    if score_dst.shape[0] != num_dst:
        raise ValueError(
            f"score_dst must have num_dst = len(indptr) - 1 = {num_dst} rows; "
            f"got {score_dst.shape[0]}."
        )
    check_same_device(indices, score_src=score_src, score_dst=score_dst, value=value)
    negative_slope = check_slope(negative_slope)
    if rev is not None:
        rev = check_rev(rev, num_src, num_dst, indices.numel(), indices.device)
    dropout = check_edge_dropout(dropout, indices.numel(), indices.device)
    out, lse = _SoftmaxAggregate.apply(
        kernel_offsets(indptr), indices.contiguous(), score_src.contiguous(),
        score_dst.contiguous(), value.contiguous(), float(negative_slope), rev, dropout,
    )
    return (out, lse) if return_lse else out


def softmax_aggregate_backward(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    score_src: torch.Tensor,
    score_dst: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    *,
    negative_slope: float = 0.2,
    rev: Any = None,
    dropout: EdgeDropout | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""The gradients of :func:`softmax_aggregate` over these edges, given the normalizer.

    With ``lse`` and ``out`` of the *whole* aggregation, the gradient of
    ``out`` restricted to a subset of each destination's in-edges is this same
    formula on that subset,

    .. math::
        \alpha_{uv} = \exp(e_{uv} - \mathrm{lse}_v), \quad
        \partial \mathrm{value}_u \mathrel{+}= \alpha_{uv} g_v, \quad
        \partial e_{uv} = \alpha_{uv} (g_v \cdot \mathrm{value}_u - g_v \cdot \mathrm{out}_v),

    so a chunked executor differentiates one tile at a time without recomputing
    its forward. Arguments are as for :func:`softmax_aggregate`, plus ``out``
    ``[num_dst, H, D]``, ``lse`` ``[num_dst, H]`` (any float dtype) and ``grad_out``
    ``[num_dst, H, D]``. With attention ``dropout`` (the forward's, restricted to these
    edges with :meth:`~ngra.kernels.dropout.EdgeDropout.take`) the kept weights
    ``alpha k`` replace ``alpha`` in ``d value`` and ``k g_v . value_u`` replaces
    ``g_v . value_u``; ``out`` is the dropped output.

    Returns:
        ``(grad_score_src [num_src, H], grad_score_dst [num_dst, H], grad_value [num_src, H, D])``.
    """
    num_src = score_src.shape[0]
    num_dst = check_csc(indptr, indices, num_src)
    want = (num_dst,) + tuple(value.shape[1:])
    for name, t in (("out", out), ("grad_out", grad_out)):
        t = check_feat(t, name)
        if tuple(t.shape) != want:
            raise ValueError(f"{name} must be [num_dst, H, D] = {list(want)}; got {list(t.shape)}.")
    if tuple(lse.shape) != want[:2]:
        raise ValueError(f"lse must be [num_dst, H] = {list(want[:2])}; got {list(lse.shape)}.")
    check_same_device(indices, score_src=score_src, score_dst=score_dst, value=value, out=out,
                      lse=lse, grad_out=grad_out)
    dropout = check_edge_dropout(dropout, indices.numel(), indices.device)
    bwd = lookup("softmax_aggregate_bwd", value.device)
    rev = reverse_of(indptr, indices, num_src,
                     None if rev is None else check_rev(rev, num_src, num_dst, indices.numel(),
                                                        indices.device))
    return bwd(kernel_offsets(indptr), indices.contiguous(), rev,
               score_src.contiguous(), score_dst.contiguous(), value.contiguous(),
               out.to(value.dtype).contiguous(), lse, grad_out.to(value.dtype).contiguous(),
               float(negative_slope), drop=dropout)


class _SoftmaxAggregate(torch.autograd.Function):
    """Autograd over validated, contiguous operands; saves ``lse [num_dst, H]``, not ``out``
    (and of a dropout its seeds and counter array, not a mask)."""

    @staticmethod
    def forward(ctx, indptr, indices, score_src, score_dst, value, negative_slope, rev, drop):
        fwd = lookup("softmax_aggregate_fwd", value.device)
        ctx.bwd = lookup("softmax_aggregate_bwd", value.device)  # same backend as forward
        out, lse = fwd(indptr, indices, score_src, score_dst, value, negative_slope, drop=drop)
        ctx.save_for_backward(indptr, indices, score_src, score_dst, value, lse)
        ctx.negative_slope, ctx.rev, ctx.drop = negative_slope, rev, drop
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, _grad_lse):
        indptr, indices, score_src, score_dst, value, lse = ctx.saved_tensors
        rev = reverse_of(indptr, indices, score_src.shape[0], ctx.rev)
        grads = ctx.bwd(
            indptr, indices, rev, score_src, score_dst, value, None, lse,
            grad_out.to(value.dtype).contiguous(), ctx.negative_slope, drop=ctx.drop,
        )
        g_src, g_dst, g_val = (
            g if need else None for g, need in zip(grads, ctx.needs_input_grad[2:5])
        )
        return None, None, g_src, g_dst, g_val, None, None, None
