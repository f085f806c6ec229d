"""numba g-SpMM: one pass over destinations, no atomics, no [E, F] temporaries.

:func:`_spmm_copy` serves the copy-sum/mean forward (CSC) and backward (the same
kernel over the reverse CSR); :func:`_spmm_sum` the sum/mean with edge data, forward
and backward (edge ids through ``eperm``), and the
max/min backward w.r.t. sources (``MASKED_SUM``: only the arg-extreme edge
contributes); :func:`_spmm_extreme` the max/min forward; :func:`_spmm_scaled` a
sum/mean whose edge weight is a product of per-vertex factors (GCN's normalization),
forward and, over the reverse CSR with the factors swapped, backward. Each compiles
for {float32, float64} x {int32, int64 offsets} x {int32, int64 indices}.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ngra.kernels.cpu import _outputs as outputs
from ngra.kernels.cpu._rowsum import sum_rows
from ngra.kernels.cpu.util import (
    MASKED_SUM,
    MAX,
    MEAN,
    MIN,
    REDUCE_CODES,
    as_numpy,
    dummy,
    prefetch_distance,
    prefetch_row,
    row_threads,
    run_ranges,
    run_rows,
    walk_blocks,
)
from ngra.kernels.cpu.gsddmm import gsddmm as _gsddmm
from ngra.kernels.registry import register


@njit(cache=True, nogil=True)
def _spmm_copy(indptr, indices, src, out, mean, pf, v0, v1):
    """``out[v] = sum_{j in row v} src[indices[j]]`` (``mean``: over the in-degree) for
    ``v`` in ``[v0, v1)``: copy-sum/mean, forward (CSC) and backward (reverse CSR), each
    row summed in registers (:func:`ngra.kernels.cpu._rowsum.sum_rows`). A kernel of its
    own: inlined into :func:`_spmm_sum`'s case switch the same loop ran ~25% slower."""
    for v in range(v0, v1):
        lo, hi = indptr[v], indptr[v + 1]
        inv = out.dtype.type(1)
        if mean and hi > lo:
            inv = inv / out.dtype.type(hi - lo)
        sum_rows(indices, src, None, out, v, lo, hi, pf, inv)


@njit(cache=True, nogil=True)
def _spmm_sum(
    indptr, indices, eperm, src, edge, arg, out, nh, reduce, has_edge, has_perm, pf, v0, v1
):
    """``out[v] = sum_{j in row v} src[indices[j]] * edge[e(j)]`` for ``v`` in ``[v0, v1)``
    (with edge data, or ``MASKED_SUM``; copy-sum/mean is :func:`_spmm_copy`).

    ``e(j) = eperm[j]`` if ``has_perm`` else ``j``. Rows are flattened:
    ``src`` [N, F] with F = nh * D, ``edge`` [E, F] (one weight per element) or
    [E, nh] (one weight per head, broadcast over its D elements), ``out``
    [M, F]. MEAN divides by the in-degree. MASKED_SUM adds only terms with
    ``arg[indices[j], f] == e(j)`` (``arg`` [*, F] indexed like ``src``).
    """
    nf = src.shape[1]
    nd = nf // nh if nh > 0 else 0
    num_edges = indices.shape[0]
    vec_edge = has_edge and edge.shape[1] != nh
    for v in range(v0, v1):
        lo, hi = indptr[v], indptr[v + 1]
        # Accumulate straight into the output row: it has one writer and stays in L1.
        for f in range(nf):
            out[v, f] = 0
        # One edge loop per case, chosen per row: the inner loops stay branch-free
        # (vectorized); a per-edge case switch cost ~10% on copy-sum.
        if reduce == MASKED_SUM:
            for j in range(lo, hi):
                if j + pf < num_edges:
                    prefetch_row(src, indices[j + pf])
                u = indices[j]
                e = eperm[j] if has_perm else j
                for h in range(nh):
                    for d in range(nd):
                        f = h * nd + d
                        if arg[u, f] == e:
                            x = src[u, f]
                            if has_edge:
                                x = x * (edge[e, f] if vec_edge else edge[e, h])
                            out[v, f] += x
        elif vec_edge:
            for j in range(lo, hi):
                if j + pf < num_edges:
                    prefetch_row(src, indices[j + pf])
                u = indices[j]
                e = eperm[j] if has_perm else j
                for f in range(nf):
                    out[v, f] += src[u, f] * edge[e, f]
        else:
            for j in range(lo, hi):
                if j + pf < num_edges:
                    prefetch_row(src, indices[j + pf])
                u = indices[j]
                e = eperm[j] if has_perm else j
                for h in range(nh):
                    w = edge[e, h]
                    base = h * nd  # (indexing base + d vectorizes; range(base, ...) did not)
                    for d in range(nd):
                        out[v, base + d] += w * src[u, base + d]
        if reduce == MEAN and hi > lo:
            inv = out.dtype.type(1) / out.dtype.type(hi - lo)
            for f in range(nf):
                out[v, f] *= inv


@njit(cache=True, nogil=True)
def _spmm_scaled(indptr, indices, src, sscale, dscale, out, mean, pf, v0, v1):
    """``out[v] = dscale[v] * sum_j sscale[u] * src[u]`` (``u = indices[j]``; MEAN also
    divides by the in-degree) for ``v`` in ``[v0, v1)``: a weighted sum whose weight is a
    product of per-vertex factors, read per edge instead of stored per edge."""
    for v in range(v0, v1):
        lo, hi = indptr[v], indptr[v + 1]
        scale = dscale[v]
        if mean and hi > lo:
            scale = scale / (hi - lo)
        sum_rows(indices, src, sscale, out, v, lo, hi, pf, scale)


@njit(cache=True, nogil=True)
def _csc_scatter(indptr, indices, g, dweight, sscale, out, has_weight, has_scale, first, last,
                 v0, v1, u0, u1):
    """``out[u] = sscale[u] * sum_{j: indices[j] = u} dweight[v] g[v]`` for the sources
    ``u`` in ``[u0, u1)``, walking the in-edges of destinations ``v`` in ``[v0, v1)`` (the
    CSC as it is): each range's thread reads all those edges and adds only into its own
    rows. A walk in destination blocks zeroes ``out`` in its ``first`` block and scales
    it in its ``last``."""
    nf = g.shape[1]
    if first:
        for u in range(u0, u1):
            for f in range(nf):
                out[u, f] = 0
    for v in range(v0, v1):
        lo, hi = indptr[v], indptr[v + 1]
        if hi == lo:
            continue
        w = dweight[v] if has_weight else g.dtype.type(1)
        for j in range(lo, hi):
            u = indices[j]
            if u >= u0 and u < u1:
                for f in range(nf):
                    out[u, f] += w * g[v, f]
    if last and has_scale:
        for u in range(u0, u1):
            s = sscale[u]
            for f in range(nf):
                out[u, f] *= s


@njit(cache=True, nogil=True)
def _spmm_extreme(indptr, indices, src, edge, arg, out, nh, is_max, has_edge, pf, v0, v1):
    """Max (``is_max``) or min of ``src[indices[j]] * edge[j]`` over row v (layout as
    in :func:`_spmm_sum`); ``arg`` gets the first extreme edge (-1 and value 0
    for rows without edges)."""
    nf = src.shape[1]
    nd = nf // nh if nh > 0 else 0
    num_edges = indices.shape[0]
    vec_edge = has_edge and edge.shape[1] != nh
    for v in range(v0, v1):
        lo, hi = indptr[v], indptr[v + 1]
        if lo == hi:
            for f in range(nf):
                out[v, f] = 0
                arg[v, f] = -1
        for j in range(lo, hi):
            if j + pf < num_edges:
                prefetch_row(src, indices[j + pf])
            u = indices[j]
            for h in range(nh):
                for d in range(nd):
                    f = h * nd + d
                    x = src[u, f]
                    if has_edge:
                        x = x * (edge[j, f] if vec_edge else edge[j, h])
                    # Strict comparison: among ties the first edge wins (as in the reference).
                    if j == lo or (x > out[v, f] if is_max else x < out[v, f]):
                        out[v, f] = x
                        arg[v, f] = j


@njit(cache=True, nogil=True)
def _arg_edge_grad(indptr, indices, grad_out, src, arg, grad_edge, nh, v0, v1):
    """``grad_edge[a, f | head(f)] += grad_out[v, f] * src[indices[a], f]``, ``a = arg[v, f]``.

    ``grad_edge`` ([E, F] or [E, nh]) must be zeroed. Edge ``a`` belongs to
    destination ``v``, so each row of ``grad_edge`` is written while handling
    one ``v`` only.
    """
    nf = src.shape[1]
    nd = nf // nh if nh > 0 else 0
    vec_edge = grad_edge.shape[1] != nh
    for v in range(v0, v1):
        for h in range(nh):
            for d in range(nd):
                f = h * nd + d
                a = arg[v, f]
                if a >= 0:
                    val = grad_out[v, f] * src[indices[a], f]
                    if vec_edge:
                        grad_edge[a, f] += val
                    else:
                        grad_edge[a, h] += val


# reassoc lets the per-head dot product vectorize; it only reorders additions.
@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _spmm_backward_fused(
    rev_indptr, rev_indices, rev_perm, grad_out, src, edge, grad_src, grad_edge, nh, pf, u0, u1
):
    """Both gradients of a weighted sum g-SpMM in one pass over the reverse CSR.

    For each source ``u`` in ``[u0, u1)`` and each out-edge ``e = rev_perm[j]``
    to ``v = rev_indices[j]``: ``grad_src[u] += edge[e] * grad_out[v]`` and
    ``grad_edge[e] = grad_out[v] . src[u]`` per head (``edge`` [E, nh]) or
    ``grad_out[v] * src[u]`` per element (``edge`` [E, F]). Each ``grad_out``
    row is gathered once for both, where separate kernels gather twice. Rows of
    ``grad_src`` belong to one ``u``, each ``grad_edge`` row to one edge: no race.
    """
    nf = src.shape[1]
    nd = nf // nh if nh > 0 else 0
    num_edges = rev_indices.shape[0]
    vec_edge = edge.shape[1] != nh
    for u in range(u0, u1):
        for f in range(nf):
            grad_src[u, f] = 0
        for j in range(rev_indptr[u], rev_indptr[u + 1]):
            if j + pf < num_edges:
                prefetch_row(grad_out, rev_indices[j + pf])
            v = rev_indices[j]
            e = rev_perm[j]
            if vec_edge:
                for f in range(nf):
                    g = grad_out[v, f]
                    grad_src[u, f] += g * edge[e, f]
                    grad_edge[e, f] = g * src[u, f]
            else:
                for h in range(nh):
                    w = edge[e, h]
                    base = h * nd
                    acc = grad_edge.dtype.type(0)
                    for d in range(nd):
                        g = grad_out[v, base + d]
                        grad_src[u, base + d] += w * g
                        acc += g * src[u, base + d]
                    grad_edge[e, h] = acc


def _flat(t: torch.Tensor) -> np.ndarray:
    """``[rows, H, D]`` tensor as a ``[rows, H * D]`` numpy view."""
    return as_numpy(t.view(t.shape[0], t.shape[1] * t.shape[2]))


def _flat_edge(edge: torch.Tensor | None, like: np.ndarray) -> np.ndarray:
    """``[E, H, De]`` edge tensor as ``[E, H * De]`` (a dummy when absent)."""
    return _flat(edge) if edge is not None else dummy(like.dtype, 2)


@register("gspmm", "cpu")
def gspmm(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    src: torch.Tensor,
    edge: torch.Tensor | None,
    reduce: str,
    eperm: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """See :func:`ngra.kernels.ref.gspmm.gspmm` (same contract)."""
    code = REDUCE_CODES[reduce]
    nh = src.shape[1]
    out = outputs.empty((indptr.numel() - 1,) + tuple(src.shape[1:]), src.dtype)
    ip, idx, src_np = as_numpy(indptr), as_numpy(indices), _flat(src)
    edge_np = _flat_edge(edge, src_np)
    if code in (MAX, MIN):
        if eperm is not None:
            raise NotImplementedError("internal: max/min g-SpMM runs on CSC edge order only.")
        arg = torch.empty(out.shape, dtype=torch.int64)
        run_rows(
            _spmm_extreme,
            ip,
            ip,
            idx,
            src_np,
            edge_np,
            _flat(arg),
            _flat(out),
            nh,
            code == MAX,
            edge is not None,
            prefetch_distance(src_np.strides[0]),
            row_bytes=src_np.strides[0],
            edge_arrays=(idx, edge_np),
        )
        return out, arg
    if edge is None:
        run_rows(_spmm_copy, ip, ip, idx, src_np, _flat(out), code == MEAN,
                 prefetch_distance(src_np.strides[0]), row_bytes=src_np.strides[0],
                 edge_arrays=(idx,))
        return out, None
    eperm_np = as_numpy(eperm) if eperm is not None else dummy(np.int64, 1)
    run_rows(
        _spmm_sum,
        ip,
        ip,
        idx,
        eperm_np,
        src_np,
        edge_np,
        dummy(np.int64, 2),
        _flat(out),
        nh,
        code,
        edge is not None,
        eperm is not None,
        prefetch_distance(src_np.strides[0]),
        row_bytes=src_np.strides[0],
        edge_arrays=(idx,) if eperm is not None else (idx, edge_np),
    )
    return out, None


@register("gspmm_scaled", "cpu")
def gspmm_scaled(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    src: torch.Tensor,
    src_scale: torch.Tensor,
    dst_scale: torch.Tensor,
    reduce: str,
) -> torch.Tensor:
    """See :func:`ngra.kernels.ref.gspmm.gspmm_scaled` (same contract)."""
    out = outputs.empty((indptr.numel() - 1,) + tuple(src.shape[1:]), src.dtype)
    ip, idx, src_np = as_numpy(indptr), as_numpy(indices), _flat(src)
    run_rows(
        _spmm_scaled,
        ip,
        ip,
        idx,
        src_np,
        as_numpy(src_scale.to(src.dtype).contiguous()),
        as_numpy(dst_scale.to(src.dtype).contiguous()),
        _flat(out),
        reduce == "mean",
        prefetch_distance(src_np.strides[0]),
        row_bytes=src_np.strides[0],
        edge_arrays=(idx,),
    )
    return out


@register("gspmm_backward", "cpu")
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
    """See :func:`ngra.kernels.ref.gspmm.gspmm_backward` (same contract).

    Both gradients: one fused pass over the reverse CSR. One of them: the
    reverse g-SpMM (sources) or the per-edge g-SDDMM in CSC order (edges).
    """
    if need_src and need_edge and edge is not None:
        rev_indptr, rev_indices, rev_perm = rev
        grad_src = torch.empty_like(src)
        grad_edge = torch.empty((indices.numel(),) + tuple(edge.shape[1:]), dtype=src.dtype)
        rip, grad_np = as_numpy(rev_indptr), _flat(grad_out)
        run_rows(
            _spmm_backward_fused,
            rip,
            rip,
            as_numpy(rev_indices),
            as_numpy(rev_perm),
            grad_np,
            _flat(src),
            _flat(edge),
            _flat(grad_src),
            _flat(grad_edge),
            src.shape[1],
            prefetch_distance(grad_np.strides[0]),
            row_bytes=grad_np.strides[0],
        )
        return grad_src, grad_edge
    grad_src = grad_edge = None
    if need_src:
        rev_indptr, rev_indices, rev_perm = rev
        # Edge ids (rev_perm) are only needed to read edge features.
        grad_src, _ = gspmm(
            rev_indptr, rev_indices, grad_out, edge, "sum", rev_perm if edge is not None else None
        )
    if need_edge:
        op = "dot" if edge.shape[2] == 1 else "mul"
        grad_edge = _gsddmm(indptr, indices, grad_out, src, op, "dst", "src")
    return grad_src, grad_edge


@register("gspmm_arg_backward", "cpu")
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
    """See :func:`ngra.kernels.ref.gspmm.gspmm_arg_backward`; ``rev`` is required
    for ``need_src`` (sources are the parallel rows, so there is no race)."""
    grad_src = grad_edge = None
    nh = src.shape[1]
    if need_src:
        rev_indptr, rev_indices, rev_perm = rev
        grad_src = torch.empty_like(src)
        rip = as_numpy(rev_indptr)
        grad_np = _flat(grad_out)
        run_rows(
            _spmm_sum,
            rip,
            rip,
            as_numpy(rev_indices),
            as_numpy(rev_perm),
            grad_np,
            _flat_edge(edge, grad_np),
            _flat(arg),
            _flat(grad_src),
            nh,
            MASKED_SUM,
            edge is not None,
            True,
            prefetch_distance(grad_np.strides[0]),
            row_bytes=grad_np.strides[0],
        )
    if need_edge:
        grad_edge = torch.zeros((indices.numel(),) + tuple(edge.shape[1:]), dtype=src.dtype)
        ip = as_numpy(indptr)
        run_rows(
            _arg_edge_grad,
            ip,
            ip,
            as_numpy(indices),
            _flat(grad_out),
            _flat(src),
            _flat(arg),
            _flat(grad_edge),
            nh,
            row_bytes=src.shape[1] * src.shape[2] * src.element_size(),
        )
    return grad_src, grad_edge


@register("gspmm_csc_backward", "cpu")
def gspmm_csc_backward(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    grad_out: torch.Tensor,
    num_src: int,
    dst_weight: torch.Tensor | None,
    src_scale: torch.Tensor | None,
) -> torch.Tensor:
    """See :func:`ngra.kernels.ref.gspmm.gspmm_csc_backward` (same contract). Each of the
    threads takes an equal range of sources and walks all the edges (no reverse CSR, no
    atomics); the edge scan is repeated per thread, the row updates are not."""
    out = torch.empty((num_src,) + tuple(grad_out.shape[1:]), dtype=grad_out.dtype)
    ip, g, idx = as_numpy(indptr), _flat(grad_out), as_numpy(indices)
    dtype = grad_out.dtype
    threads = row_threads(ip, g.strides[0])
    dw = as_numpy(dst_weight.to(dtype).contiguous()) if dst_weight is not None else dummy(g.dtype, 1)
    ss = as_numpy(src_scale.to(dtype).contiguous()) if src_scale is not None else dummy(g.dtype, 1)
    n = ip.shape[0] - 1
    for v0, v1 in walk_blocks(ip, (idx,)):  # one block, unless the structure is on disk
        run_ranges(_csc_scatter, num_src, threads, ip, idx, g, dw, ss, _flat(out),
                   dst_weight is not None, src_scale is not None, v0 == 0, v1 == n, v0, v1)
    return out
