"""numba ``softmax_aggregate``: GAT attention in one pass per destination.

Forward walks each destination's in-edges once with an online (flash-attention
style) softmax: a running max ``m`` and sum ``s`` per head, and an accumulator
that is rescaled by ``exp(m_old - m_new)`` whenever the max grows. Edges are
taken in chunks of :data:`_CHUNK`: the chunk's scores and exps first (its value
rows are prefetched meanwhile), then the feature loop, so the max is updated and
the accumulator rescaled at most once per chunk and the inner loop is a
branch-free ``acc += p * value[u]``. No ``[E, H]`` score or ``[E, H, D]``
message is ever written; only ``out`` and the log-sum-exp ``lse [num_dst, H]``
leave the kernel.

Backward recomputes ``alpha_uv = exp(leaky_relu(raw_uv) - lse[v])`` in passes
that each have one writer per output row (no atomics):

A. over destinations (CSC): ``delta[v] = g[v] . out[v]``, packed with
   ``score_dst`` and ``lse`` into one float64 ``[num_dst, 3, H]`` row that pass B
   gathers once per edge; in the *gather* variant also ``d score_dst`` (this
   re-gathers ``value[u]`` for every edge).
B. over sources (the reverse CSR): ``d value[u]`` and ``d score_src[u]`` (gathers
   ``g[v]`` for every edge); in the *edge-buffer* variant it also writes each
   ``d raw_uv`` to its CSC position in a transient ``[E, H]`` buffer.
C. (edge-buffer variant) over destinations: ``d score_dst[v]`` = contiguous
   segment sums of that buffer.

``softmax_aggregate_bwd_fold`` (attention_aggregate, scores ``value . w``) runs the
gather variant of A, then B with the score gradients folded in at the end of each
source row: ``d value[u] += gss[u] w_src + gsd[u] w_dst`` and the ``[H, D]`` weight
gradients ``sum_u gss[u] value[u]`` (per-thread sums), optionally writing ``d value``
over ``value``: row ``u`` of the value is read only while row ``u`` is walked.

The edge buffer is transient ``O(E * H)`` (freed on return); it replaces a full
second gather of ``value`` rows (``E * H * D`` elements) by one ``H``-element
scattered write and one contiguous read per edge, so it is chosen when a value
row is at least :data:`EDGE_BUFFER_MIN_ROW_BYTES` long. Nothing ``O(E * H * D)``
is ever stored.

Attention dropout (an ``EdgeDropout``: ``drop`` 1 with the edges' counters ``ctr`` in
CSC order, or 2 for the identity counter, each edge's CSC position; the seeds ``s1,
s2``, the threshold ``thr`` and ``dscale = 1 / (1 - p)``) multiplies each weight by
its keep factor (:func:`_kept`, the dropout kernel's hash of
``counter * H + head``) where the weight is used: in the forward's feature sum (the
running sum ``s`` stays undropped: it is the normalizer), in pass A's and pass B's
``dp`` and in pass B's ``d value``. Pass B reads the counters in its own (CSR) order,
``EdgeDropout.reverse_counter``: one contiguous array, not a random read per edge.
Nothing of the mask is stored; off, the arithmetic is unchanged.

A chunk's exponentials (forward's ``p``, the passes' ``alpha``) are taken together, in
one flat loop over its ``[n, H]`` scores with the polynomial ``exp`` of the fused-edge
code generator (:func:`ngra.kernels.cpu._codegen.exp_module`), which LLVM runs as vectors;
libm's scalar ``exp`` had been most of the forward (GAT, 8 heads, Cora: 1.43 -> 1.14 ms).

Scores, running max/sum and alpha are float64; feature accumulators and dot
products use the input dtype (float32 accumulation vectorizes twice as wide and
matches DGL/PyG). Kernels follow ``cpu/util.py``: serial ``nogil`` functions
over a row range, run on ``torch.get_num_threads()`` threads by ``run_rows`` in
equal-work ranges. Specializations: {float32, float64} x {int32, int64 indices}.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ngra.kernels._edge_spec import load_module
from ngra.kernels.cpu._codegen import CODEGEN_VERSION, exp_module
from ngra.kernels.cpu.util import as_numpy, dummy, prefetch_row, row_threads, run_rows
from ngra.kernels.cpu.dropout import _keep
from ngra.kernels.registry import register

__all__ = ["EDGE_BUFFER_MIN_ROW_BYTES", "softmax_aggregate_bwd", "softmax_aggregate_bwd_fold",
           "softmax_aggregate_fwd"]

# A value row (H * D * itemsize bytes) at least this long makes the transient [E, H]
# edge buffer cheaper than re-gathering value rows in backward pass A: the buffer
# costs about two cache lines of traffic per edge (a scattered write and a read).
EDGE_BUFFER_MIN_ROW_BYTES = 128

# Edges whose scores and exps are computed together before their feature loop.
_CHUNK = 8
# Reassociation vectorizes the D-long dot products and allows FMAs; no nnan/ninf,
# so the -inf initial running max and NaN inputs keep IEEE semantics.
_FASTMATH = {"reassoc", "contract"}


# exp as a polynomial LLVM vectorizes (np.exp is a scalar libm call): the exponentials of
# a chunk's (edge, head) scores are taken in one flat loop, :func:`_exp_chunk`.
_exp = load_module("numba", f"ngra_exp_float64_{CODEGEN_VERSION}", exp_module("float64"))._exp


# From this many (edge, head) scores a chunk's exponentials go through _exp as one vector
# loop after the scores; below it each is libm's, taken where it is computed, as before
# (one head: the separate loops took 1.1-1.25x longer, forward and backward).
_VECTOR_EXPS = 16


@njit(cache=True, nogil=True, fastmath=_FASTMATH, inline="always")
def _exp_chunk(x, n, heads):  # pragma: no cover
    """``x[jj, h] = exp(x[jj, h])`` for the first ``n`` rows of a chunk's C-contiguous
    ``[_CHUNK, heads]`` float64 buffer: one flat loop LLVM runs as vectors."""
    flat = x.reshape(x.size)
    for k in range(n * heads):
        flat[k] = _exp(flat[k])


@njit(cache=True, nogil=True, inline="always")
def _kept(c, h, heads, s1, s2, thr, dscale):  # pragma: no cover
    """Attention dropout's factor of head ``h`` of the edge with counter ``c``:
    ``dscale`` where the weight is kept, else 0."""
    return dscale if _keep(c * heads + h, s1, s2, thr) else 0.0


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _fwd_rows(indptr, indices, ss, sd, val, slope, out, lse, drop, ctr, s1, s2, thr, dscale, v0,
              v1):  # pragma: no cover
    heads = ss.shape[1]
    dim = val.shape[2]
    m = np.empty(heads, np.float64)
    s = np.empty(heads, np.float64)
    sdv = np.empty(heads, np.float64)
    xs = np.empty((_CHUNK, heads), np.float64)
    kf = np.empty((_CHUNK, heads), np.float64)
    pw = np.empty((_CHUNK, heads), val.dtype)
    us = np.empty(_CHUNK, np.int64)
    acc = np.empty((heads, dim), val.dtype)
    for v in range(v0, v1):
        start = indptr[v]
        end = indptr[v + 1]
        for h in range(heads):
            m[h] = -np.inf
            s[h] = 0.0
            sdv[h] = sd[v, h]
            for d in range(dim):
                acc[h, d] = 0.0
        for j0 in range(start, end, _CHUNK):
            n = min(_CHUNK, end - j0)
            for jj in range(n):
                u = indices[j0 + jj]
                us[jj] = u
                prefetch_row(val, u)
                for h in range(heads):
                    x = ss[u, h] + sdv[h]
                    xs[jj, h] = x if x > 0.0 else x * slope
                if drop:
                    c = np.int64(ctr[j0 + jj]) if drop == 1 else np.int64(j0 + jj)
                    for h in range(heads):
                        kf[jj, h] = _kept(c, h, heads, s1, s2, thr, dscale)
            for h in range(heads):
                cm = m[h]
                for jj in range(n):
                    cm = max(cm, xs[jj, h])
                if cm > m[h]:
                    c = np.exp(m[h] - cm)  # 0 on the first chunk (m = -inf)
                    s[h] *= c
                    m[h] = cm
                    cv = val.dtype.type(c)
                    for d in range(dim):
                        acc[h, d] *= cv
            if n * heads >= _VECTOR_EXPS:
                for jj in range(n):
                    for h in range(heads):
                        xs[jj, h] -= m[h]
                _exp_chunk(xs, n, heads)
                for h in range(heads):
                    t = 0.0
                    for jj in range(n):
                        p = xs[jj, h]
                        t += p
                        pw[jj, h] = p * kf[jj, h] if drop else p
                    s[h] += t
            else:  # too few to fill a vector: libm's exp, one fused loop
                for h in range(heads):
                    t = 0.0
                    for jj in range(n):
                        p = np.exp(xs[jj, h] - m[h])
                        t += p
                        pw[jj, h] = p * kf[jj, h] if drop else p
                    s[h] += t
            for jj in range(n):
                u = us[jj]
                for h in range(heads):
                    p = pw[jj, h]
                    for d in range(dim):
                        acc[h, d] += p * val[u, h, d]
        if end > start:
            for h in range(heads):
                lse[v, h] = m[h] + np.log(s[h])
                inv = val.dtype.type(1.0 / s[h])
                for d in range(dim):
                    out[v, h, d] = acc[h, d] * inv
        else:
            for h in range(heads):
                lse[v, h] = -np.inf
                for d in range(dim):
                    out[v, h, d] = 0.0


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _bwd_dst_rows(indptr, indices, ss, sd, val, out, have_out, lse, g, slope, gather, delta,
                  gsd, drop, ctr, s1, s2, thr, dscale, v0, v1):  # pragma: no cover
    """Pass A over destinations ``[v0, v1)``. Without ``out`` (``have_out`` false; then
    ``gather`` is true) ``delta = sum_u alpha_uv g[v] . value[u]`` comes from the same walk:
    ``d score_dst = sum aw dp - delta sum aw`` needs no second one."""
    heads = ss.shape[1]
    dim = val.shape[2]
    acc = np.empty(heads, np.float64)
    s_delta = np.empty(heads, np.float64)
    s_aw = np.empty(heads, np.float64)
    aw = np.empty((_CHUNK, heads), np.float64)
    al = np.empty((_CHUNK, heads), np.float64)
    kf = np.empty((_CHUNK, heads), np.float64)
    us = np.empty(_CHUNK, np.int64)
    for v in range(v0, v1):
        for h in range(heads):
            t = val.dtype.type(0.0)
            if have_out:
                for d in range(dim):
                    t += g[v, h, d] * out[v, h, d]
            delta[v, h] = t
            acc[h] = 0.0
            s_delta[h] = 0.0
            s_aw[h] = 0.0
        if not gather:
            continue
        end = indptr[v + 1]
        for j0 in range(indptr[v], end, _CHUNK):
            n = min(_CHUNK, end - j0)
            vec = n * heads >= _VECTOR_EXPS
            for jj in range(n):
                u = indices[j0 + jj]
                us[jj] = u
                prefetch_row(val, u)
                for h in range(heads):
                    raw = ss[u, h] + np.float64(sd[v, h])  # in float64, as the forward
                    x = raw if raw > 0.0 else raw * slope
                    fac = 1.0 if raw > 0.0 else slope  # leaky_relu'
                    if vec:  # exp below, for the whole chunk
                        al[jj, h] = x - lse[v, h]
                        aw[jj, h] = fac
                    else:
                        a = np.exp(x - lse[v, h])
                        al[jj, h] = a
                        aw[jj, h] = a * fac  # alpha * leaky_relu'
                if drop:
                    c = np.int64(ctr[j0 + jj]) if drop == 1 else np.int64(j0 + jj)
                    for h in range(heads):
                        kf[jj, h] = _kept(c, h, heads, s1, s2, thr, dscale)
            if vec:
                _exp_chunk(al, n, heads)  # alpha
                for jj in range(n):
                    for h in range(heads):
                        aw[jj, h] *= al[jj, h]  # alpha * leaky_relu'
            for jj in range(n):
                u = us[jj]
                for h in range(heads):
                    dp = val.dtype.type(0.0)
                    for d in range(dim):
                        dp += g[v, h, d] * val[u, h, d]
                    if drop:
                        dp = dp * kf[jj, h]
                    if have_out:
                        acc[h] += aw[jj, h] * (dp - delta[v, h])
                    else:
                        acc[h] += aw[jj, h] * dp
                        s_delta[h] += al[jj, h] * dp
                        s_aw[h] += aw[jj, h]
        for h in range(heads):
            if have_out:
                gsd[v, h] = acc[h]
            else:
                delta[v, h] = s_delta[h]
                gsd[v, h] = acc[h] - s_delta[h] * s_aw[h]


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _bwd_src_rows(rindptr, rindices, rperm, ss, sd, lse, delta, val, g, slope, use_ebuf, ebuf, gss,
                  gval, fold, ws, wd, gsd, drop, ctr, s1, s2, thr, dscale, ps, pd, u0,
                  u1):  # pragma: no cover
    """Pass B over sources ``[u0, u1)`` of the reverse CSR.

    With ``fold`` (scores that are row dots of the value itself, ``ss = val . ws`` and
    ``sd = val . wd``; source and destination rows the same vertices) the end of row
    ``u`` also adds ``gss[u] ws + gsd[u] wd`` to ``gval[u]`` and ``gss[u] val[u]``,
    ``gsd[u] val[u]`` to this thread's weight-gradient sums ``ps``, ``pd``. Row ``u``
    of ``val`` is read by no other row here (pass A, which gathers it, is done), so
    ``gval`` may be ``val`` itself: each row is read before it is overwritten."""
    heads = ss.shape[1]
    dim = val.shape[2]
    ssu = np.empty(heads, np.float64)
    gs = np.empty(heads, np.float64)
    gv = np.empty((heads, dim), val.dtype)
    aw = np.empty((_CHUNK, heads), np.float64)
    fac = np.empty((_CHUNK, heads), np.float64)
    kf = np.empty((_CHUNK, heads), np.float64)
    vs = np.empty(_CHUNK, np.int64)
    for u in range(u0, u1):
        for h in range(heads):
            ssu[h] = ss[u, h]
            gs[h] = 0.0
            for d in range(dim):
                gv[h, d] = 0.0
        end = rindptr[u + 1]
        for k0 in range(rindptr[u], end, _CHUNK):
            n = min(_CHUNK, end - k0)
            vec = n * heads >= _VECTOR_EXPS
            for kk in range(n):
                v = rindices[k0 + kk]
                vs[kk] = v
                prefetch_row(g, v)
                for h in range(heads):
                    raw = ssu[h] + sd[v, h]
                    x = raw if raw > 0.0 else raw * slope
                    aw[kk, h] = x - lse[v, h] if vec else np.exp(x - lse[v, h])
                    fac[kk, h] = 1.0 if raw > 0.0 else slope
                if drop:
                    c = np.int64(ctr[k0 + kk])  # ctr in CSR order here
                    for h in range(heads):
                        kf[kk, h] = _kept(c, h, heads, s1, s2, thr, dscale)
            if vec:
                _exp_chunk(aw, n, heads)  # alpha
            for kk in range(n):
                v = vs[kk]
                for h in range(heads):
                    a = aw[kk, h]
                    k = kf[kk, h] if drop else 1.0
                    av = val.dtype.type(a * k) if drop else val.dtype.type(a)
                    dp = val.dtype.type(0.0)
                    for d in range(dim):
                        gvd = g[v, h, d]
                        dp += gvd * val[u, h, d]
                        gv[h, d] += av * gvd
                    de = a * ((dp * k if drop else dp) - delta[v, h]) * fac[kk, h]
                    gs[h] += de
                    if use_ebuf:
                        ebuf[rperm[k0 + kk], h] = de
        for h in range(heads):
            gss[u, h] = gs[h]
            if fold:
                gdu = gsd[u, h]
                for d in range(dim):
                    vud = np.float64(val[u, h, d])
                    ps[h, d] += gs[h] * vud
                    pd[h, d] += gdu * vud
                    gval[u, h, d] = gv[h, d] + gs[h] * ws[h, d] + gdu * wd[h, d]
            else:
                for d in range(dim):
                    gval[u, h, d] = gv[h, d]


@njit(cache=True, nogil=True)
def _segment_sum_rows(indptr, ebuf, gsd, v0, v1):  # pragma: no cover
    """Pass C: ``gsd[v] = sum of ebuf rows in CSC segment v`` for ``v`` in ``[v0, v1)``."""
    heads = ebuf.shape[1]
    for v in range(v0, v1):
        for h in range(heads):
            t = 0.0  # float64: the terms nearly cancel (softmax is shift-invariant)
            for j in range(indptr[v], indptr[v + 1]):
                t += ebuf[j, h]
            gsd[v, h] = t


@register("softmax_aggregate_fwd", "cpu")
def softmax_aggregate_fwd(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    score_src: torch.Tensor,
    score_dst: torch.Tensor,
    value: torch.Tensor,
    negative_slope: float,
    drop=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``out [num_dst, H, D]`` (value's dtype) and ``lse [num_dst, H]`` (float64, ``-inf``
    where the in-degree is 0). Inputs contiguous, ``indptr`` int64; ``drop``: an
    ``EdgeDropout`` of the weights, or ``None``."""
    num_dst, heads = score_dst.shape
    out = torch.empty((num_dst,) + tuple(value.shape[1:]), dtype=value.dtype)
    lse = torch.empty((num_dst, heads), dtype=torch.float64)
    ip = as_numpy(indptr)
    run_rows(_fwd_rows, ip, ip, as_numpy(indices), as_numpy(score_src), as_numpy(score_dst),
             as_numpy(value), float(negative_slope), as_numpy(out), as_numpy(lse),
             *_drop_args(drop))
    return out, lse


def _drop_args(drop) -> tuple:
    """``(drop, ctr, s1, s2, thr, dscale)`` of the kernels for an ``EdgeDropout`` or ``None``
    (``drop``: 0 none, 1 the counters ``ctr``, 2 the identity: no array)."""
    if drop is None:
        return 0, dummy(np.int64, 1), 0, 0, 0, 1.0
    code, ctr = (2, dummy(np.int64, 1)) if drop.counter is None else (1, as_numpy(drop.counter))
    return code, ctr, drop.s1, drop.s2, drop.thr, float(drop.scale)


@register("softmax_aggregate_bwd", "cpu")
def softmax_aggregate_bwd(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    rev: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    score_src: torch.Tensor,
    score_dst: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor | None,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    negative_slope: float,
    edge_buffer: bool | None = None,
    drop=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(d score_src, d score_dst, d value)``.

    Args:
        rev: ``(rev_indptr [num_src + 1] int64, rev_indices [E] destinations,
            rev_perm [E] int64 CSC position of each CSR edge)``.
        out: the forward's output, or ``None``: pass A then gets ``g[v] . out[v]`` from
            its walk over the in-edges (the gather variant: no edge buffer).
        edge_buffer: force the transient ``[E, H]`` edge-buffer variant on or off
            (default: on when a value row is >= ``EDGE_BUFFER_MIN_ROW_BYTES``).
        drop: the forward's ``EdgeDropout``, or ``None``.
    """
    if out is None:
        edge_buffer = False
    elif edge_buffer is None:
        edge_buffer = (score_src.shape[1] * value.shape[2] * value.element_size()
                       >= EDGE_BUFFER_MIN_ROW_BYTES)
    g_score_src, g_score_dst, g_value, _ = _backward(
        indptr, indices, rev, score_src, score_dst, value, out, lse, grad_out, negative_slope,
        edge_buffer, None, torch.empty_like(value), drop)
    return g_score_src, g_score_dst, g_value


@register("softmax_aggregate_bwd_fold", "cpu")
def softmax_aggregate_bwd_fold(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    rev: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    value: torch.Tensor,
    w_src: torch.Tensor,
    w_dst: torch.Tensor,
    score_src: torch.Tensor,
    score_dst: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    negative_slope: float,
    inplace: bool,
    drop=None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(d value, d w_src, d w_dst)`` of ``attention_aggregate`` (scores
    ``value . w``): the score gradients are folded into pass B, and with ``inplace``
    ``d value`` is written over ``value`` (which then no longer holds the value)."""
    gval = value if inplace else torch.empty_like(value)
    _, _, g_value, (ps, pd) = _backward(
        indptr, indices, rev, score_src, score_dst, value, None, lse, grad_out, negative_slope,
        False, (as_numpy(w_src), as_numpy(w_dst)), gval, drop)
    return g_value, ps.to(value.dtype), pd.to(value.dtype)


def _backward(indptr, indices, rev, score_src, score_dst, value, out, lse, grad_out,
              negative_slope, edge_buffer, fold, g_value, drop):
    """Passes A, B (and C with ``edge_buffer``); ``fold = (w_src, w_dst)`` numpy ``[H, D]``
    or ``None``. Returns ``(d score_src, d score_dst, g_value, (P_src, P_dst) or None)``."""
    rev_indptr, rev_indices, rev_perm = rev
    heads, dim = score_src.shape[1], value.shape[2]
    num_dst = score_dst.shape[0]
    ip, rip = as_numpy(indptr), as_numpy(rev_indptr)
    ss, val, g = as_numpy(score_src), as_numpy(value), as_numpy(grad_out)
    slope = float(negative_slope)
    # per destination and head: delta = g[v] . out[v] (pass A), read by pass B with the
    # score and lse it already has; [num_dst, H] float64, not a packed copy of all three
    delta = np.empty((num_dst, heads), np.float64)
    lse_np = as_numpy(lse.to(torch.float64).contiguous())
    sd = as_numpy(score_dst)
    g_score_src = torch.empty_like(score_src)
    g_score_dst = torch.empty_like(score_dst)
    gsd = as_numpy(g_score_dst)
    out_np = dummy(val.dtype, 3) if out is None else as_numpy(out)
    dargs = _drop_args(drop)
    run_rows(_bwd_dst_rows, ip, ip, as_numpy(indices), ss, sd, val, out_np, out is not None,
             lse_np, g, slope, not edge_buffer, delta, gsd, *dargs)
    ebuf = np.empty((indices.numel(), heads), val.dtype) if edge_buffer else dummy(val.dtype, 2)
    threads = row_threads(rip)
    if fold is None:
        ws = wd = dummy(val.dtype, 2)
        sums = [(dummy(np.float64, 2), dummy(np.float64, 2))] * threads
    else:
        ws, wd = fold
        sums = [(np.zeros((heads, dim)), np.zeros((heads, dim))) for _ in range(threads)]
    if drop is not None:  # pass B reads the counters in its (CSR) order
        dargs = (1, as_numpy(drop.reverse_counter(rev_perm)), *dargs[2:])
    run_rows(_bwd_src_rows, rip, rip, as_numpy(rev_indices), as_numpy(rev_perm), ss,
             sd, lse_np, delta, val, g, slope, bool(edge_buffer), ebuf, as_numpy(g_score_src),
             as_numpy(g_value), fold is not None, ws, wd, gsd, *dargs, per_thread=sums)
    if edge_buffer:
        run_rows(_segment_sum_rows, ip, ip, ebuf, gsd)
    if fold is None:
        return g_score_src, g_score_dst, g_value, None
    return g_score_src, g_score_dst, g_value, tuple(
        torch.from_numpy(sum(part[k] for part in sums)) for k in (0, 1))
