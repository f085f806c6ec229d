"""CUDA ``fused_edge_aggregate``: the expression with torch ops over chunks of edges.

No generated kernel: each chunk of CSC edges gathers its term rows, evaluates the
expression (or, in backward, its derivative expressions) with the reference
interpreter, and reduces with ``index_add_`` / ``scatter_reduce_`` (atomics are cheap
on a GPU, so the src-term backward needs no reverse graph). Memory holds one chunk's
``[chunk, F]`` temporaries, never ``[E, F]``: the chunk is sized so that one such
tensor is at most :data:`CHUNK_ELEMENTS` elements.

Plain torch, so this module imports without CUDA. The registered ops refuse non-CUDA
tensors (the backend's convention); :func:`chunked_fwd` / :func:`chunked_bwd` are the
device-agnostic bodies, which the tests run on CPU tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from ngra.kernels.fused_edge import EdgeExpr, FusedEdgeCall, derivative, leaves
from ngra.kernels.gpu._util import require_cuda
from ngra.kernels.ref.fused_edge import edge_ends, evaluate
from ngra.kernels.registry import register

__all__ = ["fused_edge_fwd", "fused_edge_fwd_partials", "fused_edge_partials_pay",
           "fused_edge_bwd", "chunked_fwd", "chunked_fwd_partials", "chunked_bwd",
           "CHUNK_ELEMENTS"]

CHUNK_ELEMENTS = 1 << 24  # elements of one [chunk, F] temporary (64 MiB in float32)


def _chunks(num_edges: int, width: int) -> Iterator[tuple[int, int]]:
    step = max(1, CHUNK_ELEMENTS // max(1, width))
    for lo in range(0, num_edges, step):
        yield lo, min(num_edges, lo + step)


def _leaf_fn(src, dst, edge, s_id, d_id, lo: int, hi: int) -> Callable[[EdgeExpr], torch.Tensor]:
    def leaf(x: EdgeExpr) -> torch.Tensor:
        if x.op == "src":
            return src[x.index].index_select(0, s_id[lo:hi])
        if x.op == "dst":
            return dst[x.index].index_select(0, d_id[lo:hi])
        return edge[x.index][lo:hi]

    return leaf


@register("fused_edge_fwd", "gpu")
def fused_edge_fwd(
    indptr: torch.Tensor, indices: torch.Tensor, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forward: ``(out [num_dst, F], arg [num_dst, F] int64 for max/min else None)``."""
    require_cuda(indptr, indices, *src, *dst, *edge)
    return chunked_fwd(indptr, indices, call, src, dst, edge)


@register("fused_edge_fwd_partials", "gpu")
def fused_edge_fwd_partials(
    indptr: torch.Tensor, indices: torch.Tensor, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
    partials: tuple[int, ...],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Sum/mean forward and the summed partials of the dst terms in ``partials``."""
    require_cuda(indptr, indices, *src, *dst, *edge)
    return chunked_fwd_partials(indptr, indices, call, src, dst, edge, partials)


@register("fused_edge_partials_pay", "gpu")
def fused_edge_partials_pay(indptr: torch.Tensor, call: FusedEdgeCall) -> bool:
    """Never: the chunked backward gets dst gradients in the pass it makes anyway, so
    partials would only hold ``K`` in memory."""
    return False


@register("fused_edge_bwd", "gpu")
def fused_edge_bwd(
    indptr: torch.Tensor, indices: torch.Tensor, get_rev: Callable, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
    aux: torch.Tensor | None, grad_out: torch.Tensor,
    need: tuple[tuple[bool, ...], tuple[bool, ...], tuple[bool, ...]],
) -> tuple[list, list, list]:
    """Backward: ``(src_grads, dst_grads, edge_grads)``, ``None`` where not needed."""
    require_cuda(indptr, indices, grad_out, *src, *dst, *edge)
    del get_rev  # index_add_ on the source ids replaces the reverse-graph pass
    return chunked_bwd(indptr, indices, call, src, dst, edge, aux, grad_out, need)


def chunked_fwd(
    indptr: torch.Tensor, indices: torch.Tensor, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward on any device, one chunk of edges at a time."""
    if call.reduce not in ("max", "min"):
        return _chunked_sums(indptr, indices, call, src, dst, edge, [call.expr])[0], None
    device = indptr.device
    num_dst, num_edges, width = indptr.numel() - 1, indices.numel(), call.width
    s_id, d_id = edge_ends(indptr, indices)
    deg = indptr[1:] - indptr[:-1]
    fill = float("-inf") if call.reduce == "max" else float("inf")
    out = torch.full((num_dst, width), fill, dtype=call.dtype, device=device)
    how = "amax" if call.reduce == "max" else "amin"
    for lo, hi in _chunks(num_edges, width):
        leaf = _leaf_fn(src, dst, edge, s_id, d_id, lo, hi)
        (msg,) = evaluate([call.expr], leaf, call.dtype, device)
        idx = d_id[lo:hi].unsqueeze(-1).expand(-1, width)
        out.scatter_reduce_(0, idx, msg.expand(hi - lo, width), how, include_self=True)
    # second pass: the first edge (lowest CSC position) attaining each extreme
    arg = torch.full((num_dst, width), num_edges, dtype=torch.int64, device=device)
    for lo, hi in _chunks(num_edges, width):
        leaf = _leaf_fn(src, dst, edge, s_id, d_id, lo, hi)
        (msg,) = evaluate([call.expr], leaf, call.dtype, device)
        hit = msg.expand(hi - lo, width) == out.index_select(0, d_id[lo:hi])
        pos = torch.arange(lo, hi, device=device).unsqueeze(-1).expand(-1, width)
        cand = torch.where(hit, pos, torch.full_like(pos, num_edges))
        arg.scatter_reduce_(0, d_id[lo:hi].unsqueeze(-1).expand(-1, width), cand, "amin")
    empty = (deg == 0).unsqueeze(-1)
    out.masked_fill_(empty, 0.0)
    arg[arg == num_edges] = -1
    return out, arg


def chunked_fwd_partials(
    indptr: torch.Tensor, indices: torch.Tensor, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
    partials: tuple[int, ...],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Sum/mean forward on any device, with ``K_i``: the derivative expressions of the
    dst terms in ``partials`` summed like the expression itself."""
    roots = [call.expr] + [derivative(call.expr, ("dst", i)) for i in partials]
    out, *ks = _chunked_sums(indptr, indices, call, src, dst, edge, roots)
    return out, ks


def _chunked_sums(indptr, indices, call: FusedEdgeCall, src, dst, edge,
                  roots: list[EdgeExpr]) -> list[torch.Tensor]:
    """Each root summed (sum) or averaged (mean) over every destination's in-edges."""
    device = indptr.device
    num_dst, num_edges, width = indptr.numel() - 1, indices.numel(), call.width
    s_id, d_id = edge_ends(indptr, indices)
    sums = [torch.zeros(num_dst, width, dtype=call.dtype, device=device) for _ in roots]
    for lo, hi in _chunks(num_edges, width):
        leaf = _leaf_fn(src, dst, edge, s_id, d_id, lo, hi)
        for total, val in zip(sums, evaluate(roots, leaf, call.dtype, device)):
            total.index_add_(0, d_id[lo:hi], val.expand(hi - lo, width))
    if call.reduce == "mean":
        deg = (indptr[1:] - indptr[:-1]).clamp(min=1).to(call.dtype).unsqueeze(-1)
        for total in sums:
            total /= deg
    return sums


def chunked_bwd(
    indptr: torch.Tensor, indices: torch.Tensor, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
    aux: torch.Tensor | None, grad_out: torch.Tensor,
    need: tuple[tuple[bool, ...], tuple[bool, ...], tuple[bool, ...]],
) -> tuple[list, list, list]:
    """The backward on any device: derivative expressions per chunk, ``index_add_``."""
    device = indptr.device
    num_edges, width = indices.numel(), call.width
    groups = {"src": src, "dst": dst, "edge": edge}
    wanted = dict(zip(("src", "dst", "edge"), need))
    grads: dict[str, list[torch.Tensor | None]] = {
        k: [torch.zeros_like(t) if n else None for t, n in zip(groups[k], wanted[k])]
        for k in groups
    }
    todo = [(k, i) for k, i in leaves(call.expr) if wanted[k][i]]
    if not todo:
        return grads["src"], grads["dst"], grads["edge"]
    roots = [derivative(call.expr, (k, i)) for k, i in todo]
    s_id, d_id = edge_ends(indptr, indices)
    g = grad_out
    if call.reduce == "mean":
        g = g / (indptr[1:] - indptr[:-1]).clamp(min=1).to(g.dtype).unsqueeze(-1)
    for lo, hi in _chunks(num_edges, width):
        leaf = _leaf_fn(src, dst, edge, s_id, d_id, lo, hi)
        gc = g.index_select(0, d_id[lo:hi])
        if aux is not None:  # max/min: only the selected edge of each (v, f) gets gradient
            pos = torch.arange(lo, hi, device=device).unsqueeze(-1)
            gc = gc * (aux.index_select(0, d_id[lo:hi]) == pos).to(gc.dtype)
        for (k, i), val in zip(todo, evaluate(roots, leaf, call.dtype, device)):
            contrib = gc * val
            if groups[k][i].shape[1] == 1 and width != 1:
                contrib = contrib.sum(-1, keepdim=True)
            target = grads[k][i]
            if k == "src":
                target.index_add_(0, s_id[lo:hi], contrib)
            elif k == "dst":
                target.index_add_(0, d_id[lo:hi], contrib)
            else:
                target[lo:hi] = contrib
    return grads["src"], grads["dst"], grads["edge"]
