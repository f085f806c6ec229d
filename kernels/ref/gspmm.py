"""Reference g-SpMM: gather, multiply, scatter-reduce in plain torch (the specification)."""

from __future__ import annotations

import torch

from ngra.kernels.ref.util import dst_ids, scatter_extreme
from ngra.kernels.ref.gsddmm import gsddmm
from ngra.kernels.registry import register


@register("gspmm", "ref")
def gspmm(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    src: torch.Tensor,
    edge: torch.Tensor | None,
    reduce: str,
    eperm: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``out[v] = reduce_{j in [indptr[v], indptr[v+1])} src[indices[j]] * edge[eid(j)]``.

    ``eid(j) = eperm[j]`` when ``eperm`` is given, else ``j``. Shapes: ``src``
    [N, H, D], ``edge`` [E, H, De] with ``De`` in ``{1, D}``; returns ``out``
    [M, H, D] and, for max/min, ``arg`` [M, H, D] int64, the ``eid`` of the first
    extreme edge (-1 where the destination has no in-edges).
    """
    num_dst = indptr.numel() - 1
    seg = dst_ids(indptr)
    eids = eperm.long() if eperm is not None else torch.arange(indices.numel(), device=src.device)
    msg = src.index_select(0, indices.long())
    if edge is not None:
        msg = msg * edge.index_select(0, eids)
    if reduce in ("sum", "mean"):
        out = src.new_zeros((num_dst,) + src.shape[1:]).index_add_(0, seg, msg)
        if reduce == "mean":
            deg = (indptr[1:] - indptr[:-1]).clamp(min=1).to(src.dtype)
            out = out / deg.view(-1, *([1] * (out.dim() - 1)))
        return out, None
    return scatter_extreme(seg, msg, num_dst, reduce, eids)


@register("gspmm_scaled", "ref")
def gspmm_scaled(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    src: torch.Tensor,
    src_scale: torch.Tensor,
    dst_scale: torch.Tensor,
    reduce: str,
) -> torch.Tensor:
    """``out[v] = dst_scale[v] * reduce_{j in [indptr[v], indptr[v+1])} src_scale[u] src[u]``
    with ``u = indices[j]`` and ``reduce`` sum or mean: a sum/mean g-SpMM whose edge weight
    is a product of per-vertex factors. ``src`` [N, H, D], scales [N] / [M]."""
    w = src_scale.index_select(0, indices.long()) * dst_scale.index_select(0, dst_ids(indptr))
    out, _ = gspmm(indptr, indices, src, w.to(src.dtype).view(-1, 1, 1), reduce)
    return out


@register("gspmm_backward", "ref")
def gspmm_backward(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    rev: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    grad_out: torch.Tensor,
    src: torch.Tensor,
    edge: torch.Tensor | None,
    need_src: bool,
    need_edge: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of sum g-SpMM (a mean's ``grad_out`` arrives divided by the degree).

    ``grad_src`` is a sum g-SpMM of ``grad_out`` over the reverse graph ``rev``
    (``grad_src[u] = sum_{e = u -> v} edge[e] * grad_out[v]``); ``grad_edge[e]``
    is the per-edge dot (``edge`` [E, H, 1]) or product (``edge`` [E, H, D]) of
    ``grad_out[v]`` and ``src[u]``, a g-SDDMM.
    """
    grad_src = grad_edge = None
    if need_src:
        rev_indptr, rev_indices, rev_perm = rev
        grad_src, _ = gspmm(rev_indptr, rev_indices, grad_out, edge, "sum", rev_perm)
    if need_edge:
        op = "dot" if edge.shape[2] == 1 else "mul"
        grad_edge = gsddmm(indptr, indices, grad_out, src, op, "dst", "src")
    return grad_src, grad_edge


@register("gspmm_arg_backward", "ref")
def gspmm_arg_backward(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    rev: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
    grad_out: torch.Tensor,
    src: torch.Tensor,
    edge: torch.Tensor | None,
    arg: torch.Tensor,
    need_src: bool,
    need_edge: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of max/min g-SpMM: each output element's gradient flows to its arg edge.

    ``grad_src[indices[a], h, d] += grad_out[v, h, d] * edge[a, h, d|0]`` and
    ``grad_edge[a, h, d|0] += grad_out[v, h, d] * src[indices[a], h, d]`` with
    ``a = arg[v, h, d] >= 0``. ``rev`` is unused here (the optimized backends
    need it to avoid scatter races).
    """
    num_edges = indices.numel()
    grad_src = torch.zeros_like(src) if need_src else None
    grad_edge = None
    if need_edge:
        grad_edge = torch.zeros((num_edges,) + edge.shape[1:], dtype=src.dtype, device=src.device)
    if num_edges == 0:
        return grad_src, grad_edge
    valid = arg >= 0
    a = arg.clamp(min=0)
    u = indices.long()[a]
    g = grad_out * valid
    if need_src:
        c = g if edge is None else g * torch.gather(edge.expand(-1, -1, src.shape[2]), 0, a)
        grad_src.scatter_add_(0, u, c)
    if need_edge:
        full = torch.zeros((num_edges,) + src.shape[1:], dtype=src.dtype, device=src.device)
        full.scatter_add_(0, a, g * torch.gather(src, 0, u))
        grad_edge = full if edge.shape[2] == src.shape[2] else full.sum(-1, keepdim=True)
    return grad_src, grad_edge


@register("gspmm_csc_backward", "ref")
def gspmm_csc_backward(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    grad_out: torch.Tensor,
    num_src: int,
    dst_weight: torch.Tensor | None,
    src_scale: torch.Tensor | None,
) -> torch.Tensor:
    """``grad_src[u] = src_scale[u] * sum_{j: indices[j] = u} dst_weight[v] grad_out[v]``
    (``v`` the destination of CSC edge ``j``; a missing weight or scale is 1): the sum
    g-SpMM's source gradient, computed from the CSC as it is (no reverse structure).
    ``grad_out`` [M, H, D], weights [M], scales [N]; returns [N, H, D]."""
    seg = dst_ids(indptr)
    g = grad_out if dst_weight is None else grad_out * dst_weight.to(grad_out.dtype).view(-1, 1, 1)
    out = grad_out.new_zeros((num_src,) + tuple(grad_out.shape[1:]))
    out.index_add_(0, indices.long(), g.index_select(0, seg))
    if src_scale is not None:
        out = out * src_scale.to(out.dtype).view(-1, 1, 1)
    return out
