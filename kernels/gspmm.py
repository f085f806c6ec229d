"""g-SpMM: fused gather-(multiply)-reduce over each destination's in-edges.

The message-passing primitive ``copy_u`` / ``u_mul_e`` followed by a builtin
reduce, without materializing an ``[E, F]`` message tensor. Validation and
autograd live here; kernels live in ``ref/``, ``cpu/`` and ``gpu/`` and are
reached through the registry.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.checks import (
    REDUCES,
    check_choice,
    check_csc,
    check_feat,
    check_rev,
    check_same_device,
    kernel_offsets,
    spmm_layout,
)
from ngra.kernels.lean import broadcast_shape
from ngra.kernels.registry import current_backend, forward_skipped, lookup, use_backend
from ngra.kernels.transpose import Rev, csc_walk_preferred, reverse_of, walks_csc
from ngra.mapped import is_mapped

__all__ = ["gspmm"]


def gspmm(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    src_feat: torch.Tensor,
    edge_feat: torch.Tensor | None = None,
    *,
    reduce: str = "sum",
    rev: Rev | None = None,
    scale: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    r"""Generalized sparse-dense matrix multiplication over a CSC graph.

    .. math::
        \mathbf{out}_v = \bigoplus_{e = (u \to v)} \mathbf{x}_u \odot \mathbf{w}_e

    where :math:`\bigoplus` is ``reduce`` over the in-edges of :math:`v` and
    :math:`\mathbf{w}_e = 1` when ``edge_feat`` is ``None`` (``copy_u``).
    Destinations without in-edges get 0. Differentiable w.r.t. ``src_feat`` and
    ``edge_feat``; for max/min the gradient goes to the first extreme edge.

    Args:
        indptr: ``[num_dst + 1]`` int32/int64 CSC offsets over destinations.
        indices: ``[E]`` int32/int64 source of each edge, in ``[0, num_src)``.
        src_feat: ``[num_src, *F]`` float32/float64 source features (at least 2-D).
        edge_feat: optional ``[E]``, ``[E, *F[:k]]`` (broadcast over the trailing
            feature dims, e.g. ``[E, H]`` with ``src_feat`` ``[N, H, D]``) or
            ``[E, *F]``, same dtype as ``src_feat``. (default: ``None``)
        reduce: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``. (default: ``"sum"``)
        rev: optional reverse structure ``(rev_indptr [num_src + 1], rev_indices
            [E], rev_perm [E])`` as returned by :meth:`ngra.Graph.csr` or
            :func:`ngra.kernels.transpose_csc`; built (and cached) on demand by the
            backward pass when ``None``. Under :func:`ngra.kernels.transpose.prefer_csc_walk`
            (a memory budget too tight for the transpose), or when ``indices`` is
            memory-mapped (the on-disk store),
            a sum/mean without ``edge_feat`` given no reverse, or a
            :class:`~ngra.graph.DeferredReverse` not made yet, computes the source
            gradient from the CSC itself and makes none. (default: ``None``)
        scale: optional ``(src_scale [num_src], dst_scale [num_dst])``: edge weights
            that are a product of per-vertex factors, :math:`w_e = s_u d_v` (GCN's
            normalization), applied on the fly; sum/mean without ``edge_feat`` only,
            and the factors get no gradient. (default: ``None``)

    Returns:
        ``[num_dst, *F]`` tensor.
    """
    check_choice(reduce, "reduce", REDUCES)
    src_feat = check_feat(src_feat, "src_feat", min_dim=2)
    num_src = src_feat.shape[0]
    num_dst = check_csc(indptr, indices, num_src)
    num_edges = indices.numel()
    check_same_device(indices, src_feat=src_feat, edge_feat=edge_feat)
    feat_shape = tuple(src_feat.shape[1:])
    edge3 = None
    if edge_feat is None:
        heads, dim = 1, math.prod(feat_shape)
    else:
        edge_feat = check_feat(edge_feat, "edge_feat", min_dim=1)
        if edge_feat.shape[0] != num_edges:
            raise ValueError(
                f"edge_feat must have one row per edge ({num_edges}, len(indices)); "
                f"got shape {list(edge_feat.shape)}."
            )
        if edge_feat.dtype != src_feat.dtype:
            raise TypeError(
                f"edge_feat must have src_feat's dtype {src_feat.dtype}; got {edge_feat.dtype}."
            )
        heads, dim, edge_dim = spmm_layout(feat_shape, edge_feat.shape[1:])
        edge3 = edge_feat.reshape(num_edges, heads, edge_dim).contiguous()
    if rev is not None:
        rev = check_rev(rev, num_src, num_dst, num_edges, indices.device)
    if scale is not None:
        s_src, s_dst = _check_scale(scale, num_src, num_dst, edge_feat, reduce, src_feat)
        out = _GSpMMScaled.apply(kernel_offsets(indptr), indices.contiguous(),
                                 src_feat.reshape(num_src, 1, -1).contiguous(), s_src, s_dst,
                                 reduce, rev)
        return out.view((num_dst,) + feat_shape)
    src3 = src_feat.reshape(num_src, heads, dim).contiguous()
    out = _GSpMM.apply(
        kernel_offsets(indptr), indices.contiguous(), src3, edge3, reduce, rev
    )
    return out.view((num_dst,) + feat_shape)


class _GSpMM(torch.autograd.Function):
    """Autograd over normalized operands: ``src`` [N, H, D], ``edge`` [E, H, De]."""

    @staticmethod
    def forward(ctx, indptr, indices, src, edge, reduce, rev):
        ctx.backend = current_backend()
        if forward_skipped(reduce):
            shape = (indptr.numel() - 1,) + tuple(
                src.shape[1:] if edge is None else broadcast_shape(src.shape[1:], edge.shape[1:]))
            out, arg = src.new_zeros(()).expand(shape), None
        else:
            out, arg = lookup("gspmm", src.device)(indptr, indices, src, edge, reduce, None)
        ctx.reduce, ctx.rev, ctx.num_src = reduce, rev, src.shape[0]
        ctx.walk = csc_walk_preferred() or is_mapped(indices)  # on disk: no transpose
        # Backward reads source rows only for the edge gradient (and the arg-extreme
        # routing): otherwise keep none, since a streamed tile's staged rows would stay
        # alive until backward for nothing.
        if not (ctx.needs_input_grad[3] or reduce in ("max", "min")):
            src = src.new_empty((0,) + tuple(src.shape[1:]))
        ctx.save_for_backward(indptr, indices, src, edge, arg)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        with use_backend(ctx.backend):
            return _GSpMM._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out):
        indptr, indices, src, edge, arg = ctx.saved_tensors
        need_src, need_edge = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
        grad_out = grad_out.contiguous()
        if ctx.reduce == "mean":
            deg = (indptr[1:] - indptr[:-1]).clamp(min=1).to(grad_out.dtype)
            grad_out = grad_out / deg.view(-1, 1, 1)
        if (edge is None and ctx.reduce in ("sum", "mean")
                and walks_csc(ctx.walk, ctx.rev, grad_out.device)):
            grad_src = lookup("gspmm_csc_backward", grad_out.device)(
                indptr, indices, grad_out, ctx.num_src, None, None) if need_src else None
            return None, None, grad_src, None, None, None
        # edge ids (the CSR's perm) are read only with edge features or arg routing
        need_perm = edge is not None or ctx.reduce in ("max", "min")
        rev = reverse_of(indptr, indices, ctx.num_src, ctx.rev, need_perm) if need_src else None
        if ctx.reduce in ("max", "min"):
            grad_src, grad_edge = lookup("gspmm_arg_backward", src.device)(
                indptr, indices, rev, grad_out, src, edge, arg, need_src, need_edge
            )
            return None, None, grad_src, grad_edge, None, None
        # Sources: a sum g-SpMM over the reverse graph; edges: a per-edge dot with
        # the source row (g-SDDMM). Backends may fuse the two (cpu does).
        grad_src, grad_edge = lookup("gspmm_backward", src.device)(
            indptr, indices, rev, grad_out, src, edge, need_src, need_edge
        )
        return None, None, grad_src, grad_edge, None, None


def _check_scale(scale: object, num_src: int, num_dst: int, edge_feat: object, reduce: str,
                 src_feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if edge_feat is not None or reduce not in ("sum", "mean"):
        raise ValueError("gspmm scale=(src_scale, dst_scale) takes reduce 'sum' or 'mean' and "
                         f"no edge_feat; got reduce={reduce!r} and "
                         f"{'an' if edge_feat is not None else 'no'} edge_feat.")
    if not isinstance(scale, (tuple, list)) or len(scale) != 2:
        raise TypeError(f"scale must be a pair (src_scale, dst_scale); got {type(scale).__name__}.")
    out = []
    for name, t, rows in (("src_scale", scale[0], num_src), ("dst_scale", scale[1], num_dst)):
        t = check_feat(t, name)
        if t.shape != (rows,):
            raise ValueError(f"{name} must have shape [{rows}]; got {list(t.shape)}.")
        if t.requires_grad:
            raise ValueError(f"{name} must not require grad (pass the weights as edge_feat).")
        check_same_device(src_feat, **{name: t})
        out.append(t.to(src_feat.dtype).contiguous())
    return out[0], out[1]


class _GSpMMScaled(torch.autograd.Function):
    """Sum/mean g-SpMM with ``w_e = s[u] d[v]``: backward is the same op over the reverse
    graph with the factors swapped (``grad_src[u] = s[u] sum_v d[v] grad_out[v]``)."""

    @staticmethod
    def forward(ctx, indptr, indices, src, s_src, s_dst, reduce, rev):
        ctx.backend = current_backend()
        if forward_skipped(reduce):
            out = src.new_zeros(()).expand((indptr.numel() - 1,) + tuple(src.shape[1:]))
        else:
            out = lookup("gspmm_scaled", src.device)(indptr, indices, src, s_src, s_dst, reduce)
        ctx.reduce, ctx.rev, ctx.num_src = reduce, rev, src.shape[0]
        ctx.walk = csc_walk_preferred() or is_mapped(indices)  # on disk: no transpose
        ctx.save_for_backward(indptr, indices, s_src, s_dst)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[2]:
            return (None,) * 7
        indptr, indices, s_src, s_dst = ctx.saved_tensors
        with use_backend(ctx.backend):
            grad_out = grad_out.contiguous()
            if ctx.reduce == "mean":
                deg = (indptr[1:] - indptr[:-1]).clamp(min=1).to(grad_out.dtype)
                grad_out = grad_out / deg.view(-1, 1, 1)
            if walks_csc(ctx.walk, ctx.rev, grad_out.device):
                grad = lookup("gspmm_csc_backward", grad_out.device)(
                    indptr, indices, grad_out, ctx.num_src, s_dst, s_src)
                return None, None, grad, None, None, None, None
            rev_indptr, rev_indices, _ = reverse_of(indptr, indices, ctx.num_src, ctx.rev,
                                                    need_perm=False)
            grad = lookup("gspmm_scaled", grad_out.device)(
                kernel_offsets(rev_indptr), rev_indices, grad_out, s_dst, s_src, "sum")
        return None, None, grad, None, None, None, None
