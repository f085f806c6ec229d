"""Triton g-SpMM: one program per (destination, column block), no atomics, no [E, F].

:func:`_spmm` walks a destination's in-edges in blocks of ``BLOCK_E``: it gathers the
``[BLOCK_E, BLOCK_F]`` source rows, multiplies by the edge weights (none, one per
head broadcast over its ``D`` columns, or one per element) and reduces them into a
register accumulator, so nothing per edge ever reaches memory. Factored edge weights
(``SCALED``, GCN's ``w_uv = s_src[u] s_dst[v]``) multiply each gathered row by its
source's factor and the accumulator by the destination's. It serves the
sum/mean/max/min forward, the sum/mean backward w.r.t. sources (the same kernel over
the reverse CSR, edge ids through ``eperm``) and the max/min backward w.r.t. sources
(``MASKED``: an edge counts only where it is the arg-extreme of its destination).
:func:`_sddmm_rows` computes the edge gradient (``g[v] . x[u]`` per head, or the
element-wise product) walking destinations the same way. Max/min keep the first
extreme edge (strict comparison across blocks, smallest position within one), as the
reference does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ngra.kernels.gpu.util import autotune, pow2, require_cuda
from ngra.kernels.registry import register

# Globals a compiled kernel reads must be constexpr (the interpreter would take plain ints;
# the compiler does not); the host passes their ``.value``.
SUM, MEAN, MAX, MIN = (tl.constexpr(i) for i in range(4))
_CODES = {"sum": SUM.value, "mean": MEAN.value, "max": MAX.value, "min": MIN.value}
# edge operand: none, one weight per head ([E, H]), one per element ([E, H * D])
NO_EDGE, HEAD_EDGE, FULL_EDGE = (tl.constexpr(i) for i in range(3))


@autotune([triton.Config({"BLOCK_E": 16, "BLOCK_F": 64}, num_warps=2),
           triton.Config({"BLOCK_E": 32, "BLOCK_F": 64}, num_warps=4),
           triton.Config({"BLOCK_E": 32, "BLOCK_F": 128}, num_warps=4),
           triton.Config({"BLOCK_E": 64, "BLOCK_F": 128}, num_warps=8),
           triton.Config({"BLOCK_E": 64, "BLOCK_F": 32}, num_warps=1)],
          key=["F", "D", "REDUCE", "EDGE", "SCALED", "IDENTITY", "AVG_DEG"],
          interpret=triton.Config({"BLOCK_E": 64, "BLOCK_F": 128}, num_warps=8))
@triton.jit
def _spmm(indptr, indices, eperm, src, edge, arg, s_src, s_dst, out, out_arg, F, D, H, AVG_DEG,
          REDUCE: tl.constexpr, EDGE: tl.constexpr, HAS_PERM: tl.constexpr,
          MASKED: tl.constexpr, SCALED: tl.constexpr, IDENTITY: tl.constexpr,
          BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    v = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
    cmask = cols < F
    start = tl.load(indptr + v)
    end = tl.load(indptr + v + 1)
    if EDGE == FULL_EDGE:
        ecol, estride = cols, F
    else:
        ecol, estride = cols // D, H
    if REDUCE >= MAX:
        fill = float("-inf") if REDUCE == MAX else float("inf")
        acc = tl.full([BLOCK_F], fill, out.dtype.element_ty)
        best = tl.full([BLOCK_F], -1, tl.int64)
    else:
        acc = tl.zeros([BLOCK_F], out.dtype.element_ty)
    for j in range(start, end, BLOCK_E):
        e = j + tl.arange(0, BLOCK_E)
        emask = e < end
        m2 = emask[:, None] & cmask[None, :]
        if IDENTITY:  # segment reduction: edge e reads row e itself
            u = e.to(tl.int64)
        else:
            u = tl.load(indices + e, mask=emask, other=0).to(tl.int64)
        if HAS_PERM:
            eid = tl.load(eperm + e, mask=emask, other=0).to(tl.int64)
        else:
            eid = e
        x = tl.load(src + u[:, None] * F + cols[None, :], mask=m2, other=0.0)
        if SCALED:  # w_e = s_src[u] * s_dst[v]: the source factor per edge, s_dst[v] at the end
            x = x * tl.load(s_src + u, mask=emask, other=0.0)[:, None]
        if EDGE != NO_EDGE:
            w = tl.load(edge + eid[:, None] * estride + ecol[None, :], mask=m2, other=0.0)
            x = x * w
        if MASKED:  # only the arg-extreme edge of the destination (``indices`` = dst here)
            a = tl.load(arg + u[:, None] * F + cols[None, :], mask=m2, other=-1)
            x = tl.where(a == eid[:, None], x, 0.0)
        if REDUCE >= MAX:
            x = tl.where(m2, x, fill)
            if REDUCE == MAX:
                bx = tl.max(x, axis=0)
            else:
                bx = tl.min(x, axis=0)
            pos = tl.where((x == bx[None, :]) & m2, e[:, None], end)
            first = tl.min(pos, axis=0)
            if REDUCE == MAX:
                better = (bx > acc) | (best < 0)
            else:
                better = (bx < acc) | (best < 0)
            acc = tl.where(better, bx, acc)
            best = tl.where(better, first, best)
        else:
            acc += tl.sum(x, axis=0)
    if REDUCE == MEAN:
        acc = acc / tl.maximum(end - start, 1).to(acc.dtype)
    if SCALED:
        acc = acc * tl.load(s_dst + v)
    if REDUCE >= MAX:
        acc = tl.where(best < 0, 0.0, acc)
        tl.store(out_arg + v * F + cols, best, mask=cmask)
    tl.store(out + v * F + cols, acc, mask=cmask)


@autotune([triton.Config({"BLOCK_E": 16}, num_warps=2),
           triton.Config({"BLOCK_E": 32}, num_warps=4),
           triton.Config({"BLOCK_E": 64}, num_warps=4)],
          key=["D", "DOT", "AVG_DEG"])
@triton.jit
def _sddmm_rows(indptr, indices, g, src, out, H, D, AVG_DEG, DOT: tl.constexpr,
                BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
    """``out[e, h] = g[v, h] . src[u, h]`` (DOT) or ``out[e, h, :] = g[v, h] * src[u, h]``."""
    v = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    F = H * D
    start = tl.load(indptr + v)
    end = tl.load(indptr + v + 1)
    gv = tl.load(g + v * F + h * D + d, mask=dmask, other=0.0)
    for j in range(start, end, BLOCK_E):
        e = j + tl.arange(0, BLOCK_E)
        emask = e < end
        m2 = emask[:, None] & dmask[None, :]
        u = tl.load(indices + e, mask=emask, other=0).to(tl.int64)
        prod = tl.load(src + u[:, None] * F + h * D + d[None, :], mask=m2, other=0.0) * gv[None, :]
        if DOT:
            tl.store(out + e * H + h, tl.sum(prod, axis=1), mask=emask)
        else:
            tl.store(out + e[:, None] * F + h * D + d[None, :], prod, mask=m2)


def _avg_degree(indptr: torch.Tensor, num_edges: int) -> int:
    """A coarse degree class for autotuning keys (powers of two): long rows want wide
    edge blocks, short rows narrow ones."""
    return pow2(num_edges // max(indptr.numel() - 1, 1))


def spmm(indptr, indices, src, edge, reduce: str, eperm=None, arg=None, scale=None):
    """``(out [M, H, D], arg [M, H, D] int64 or None)``; ``arg`` given: the masked sum;
    ``scale`` given (``(s_src [N], s_dst [M])``, sum/mean without ``edge``): edge weights
    ``s_src[u] * s_dst[v]``."""
    num_dst = indptr.numel() - 1
    num_src, heads, dim = src.shape
    width = heads * dim
    out = src.new_empty((num_dst, heads, dim))
    ext = reduce in ("max", "min")
    assert not (ext and eperm is not None), "max/min report CSC positions: no eperm"
    out_arg = torch.empty((num_dst, heads, dim), dtype=torch.int64, device=src.device) if ext \
        else out
    if num_dst == 0 or width == 0:
        return out, (out_arg if ext else None)
    mode = (NO_EDGE if edge is None else HEAD_EDGE if edge.shape[2] == 1 else FULL_EDGE).value

    def grid(meta):
        return (num_dst, triton.cdiv(width, meta["BLOCK_F"]))

    s_src, s_dst = (src, src) if scale is None else scale
    _spmm[grid](indptr, indices, indices if eperm is None else eperm, src,
                src if edge is None else edge, out_arg if arg is None else arg, s_src, s_dst,
                out, out_arg, width, dim, heads, _avg_degree(indptr, indices.numel()),
                REDUCE=_CODES[reduce], EDGE=mode, HAS_PERM=eperm is not None,
                MASKED=arg is not None, SCALED=scale is not None, IDENTITY=False)
    return out, (out_arg if ext else None)


def segment_rows(indptr: torch.Tensor, values: torch.Tensor, reduce: str
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``reduce`` of each segment ``values[indptr[s]:indptr[s + 1]]`` (``values`` ``[E, F]``):
    the g-SpMM walk with row ``e`` as edge ``e``'s source, so no index array and no
    ``[E]`` segment ids. Returns ``(out [S, F], arg [S, F] int64 or None)``, ``arg`` the
    row of each first extreme (-1 for an empty segment), as the reference's."""
    num_seg = indptr.numel() - 1
    rows, width = values.shape
    out = values.new_empty((num_seg, width))
    ext = reduce in ("max", "min")
    out_arg = (torch.empty((num_seg, width), dtype=torch.int64, device=values.device) if ext
               else out)
    if num_seg and width:
        def grid(meta):
            return (num_seg, triton.cdiv(width, meta["BLOCK_F"]))

        _spmm[grid](indptr, indptr, indptr, values, values, out_arg, values, values, out,
                    out_arg, width, width, 1, _avg_degree(indptr, rows),
                    REDUCE=_CODES[reduce], EDGE=NO_EDGE.value, HAS_PERM=False, MASKED=False,
                    SCALED=False, IDENTITY=True)
    return out, (out_arg if ext else None)


def sddmm_rows(indptr, indices, g, src, dot: bool) -> torch.Tensor:
    """The edge gradient of g-SpMM: ``[E, H, 1]`` (``dot``) or ``[E, H, D]``."""
    num_dst = indptr.numel() - 1
    heads, dim = src.shape[1:]
    out = src.new_zeros((indices.numel(), heads, 1 if dot else dim))
    if num_dst and indices.numel() and dim:
        _sddmm_rows[(num_dst, heads)](indptr, indices, g, src, out, heads, dim,
                                      _avg_degree(indptr, indices.numel()), DOT=dot,
                                      BLOCK_D=pow2(dim))
    return out


@register("gspmm", "gpu")
def gspmm(indptr, indices, src, edge, reduce, eperm=None):
    """See :func:`ngra.kernels.ref.gspmm.gspmm` (same contract)."""
    require_cuda(indptr, indices, src, edge, eperm)
    return spmm(indptr, indices, src, edge, reduce, eperm)


@register("gspmm_scaled", "gpu")
def gspmm_scaled(indptr, indices, src, src_scale, dst_scale, reduce):
    """See :func:`ngra.kernels.ref.gspmm.gspmm_scaled` (same contract): the factors are
    applied inside the g-SpMM, so the output is the only ``[M, H, D]`` tensor it makes
    (no scaled copy of ``src``, no unscaled output, no ``[E]`` weight)."""
    require_cuda(indptr, indices, src, src_scale, dst_scale)
    out, _ = spmm(indptr, indices, src, None, reduce, scale=(src_scale, dst_scale))
    return out


@register("gspmm_backward", "gpu")
def gspmm_backward(indptr, indices, rev, grad_out, src, edge, need_src, need_edge):
    """See :func:`ngra.kernels.ref.gspmm.gspmm_backward` (same contract)."""
    require_cuda(indptr, indices, grad_out, src, edge)
    grad_src = grad_edge = None
    if need_src:
        rev_indptr, rev_indices, rev_perm = rev
        grad_src, _ = spmm(rev_indptr, rev_indices, grad_out, edge, "sum", rev_perm)
    if need_edge:
        grad_edge = sddmm_rows(indptr, indices, grad_out, src, edge.shape[2] == 1)
    return grad_src, grad_edge


@register("gspmm_arg_backward", "gpu")
def gspmm_arg_backward(indptr, indices, rev, grad_out, src, edge, arg, need_src, need_edge):
    """See :func:`ngra.kernels.ref.gspmm.gspmm_arg_backward` (same contract).

    Sources: the masked sum over the reverse CSR (no atomics). Edges: each output
    element's gradient goes to its arg edge, ``[M, H, D]`` work in torch (no ``[E, F]``).
    """
    require_cuda(indptr, indices, grad_out, src, edge, arg)
    grad_src = grad_edge = None
    if need_src:
        rev_indptr, rev_indices, rev_perm = rev
        # rows of the walk are sources; "indices" are destinations, whose arg rows mask it
        grad_src, _ = spmm(rev_indptr, rev_indices, grad_out, edge, "sum", rev_perm, arg=arg)
    if need_edge:
        num_edges, dim = indices.numel(), src.shape[2]
        grad_edge = torch.zeros((num_edges,) + tuple(edge.shape[1:]), dtype=src.dtype,
                                device=src.device)
        if num_edges:
            valid = arg >= 0
            a = arg.clamp(min=0)
            contrib = (grad_out * valid) * torch.gather(src, 0, indices.long()[a])
            if edge.shape[2] == dim:
                grad_edge.scatter_add_(0, a, contrib)
            else:
                _head_scatter(grad_edge, a, contrib)
    return grad_src, grad_edge


def _head_scatter(grad_edge: torch.Tensor, a: torch.Tensor, contrib: torch.Tensor) -> None:
    """``grad_edge[a[v, h, d], h, 0] += contrib[v, h, d]`` (per-head edge weights)."""
    heads = a.shape[1]
    flat = (a * heads + torch.arange(heads, device=a.device).view(1, -1, 1)).view(-1)
    grad_edge.view(-1).index_add_(0, flat, contrib.reshape(-1))
