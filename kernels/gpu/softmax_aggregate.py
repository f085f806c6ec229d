"""Triton ``softmax_aggregate``: GAT attention in one pass per destination, no [E, H].

Forward (:func:`_fwd_rows`): one program per (destination, head) walks the in-edges
in blocks with an online softmax (flash-attention style): a running max ``m`` and
sum ``s`` and a ``[D]`` accumulator, rescaled by ``exp(m_old - m_new)`` when the max
grows. Only ``out [M, H, D]`` and the log-sum-exp ``lse [M, H]`` are written.

Backward recomputes ``alpha_uv = exp(leaky_relu(raw_uv) - lse[v])`` in two passes,
each with one writer per output row (no atomics, deterministic):

A. (:func:`_bwd_dst_rows`) per (destination, head): ``delta[v] = g[v] . out[v]`` (from
   ``out``, or summed over the in-edges as ``sum_u alpha_uv g[v] . value[u]`` when the
   output was not kept) and ``d score_dst[v] = sum_u alpha_uv lr'_uv (g[v] . value[u])
   - delta[v] sum_u alpha_uv lr'_uv``, all from the same walk.
B. (:func:`_bwd_src_rows`) per (source, head) over the reverse CSR: ``d value[u] =
   sum_v alpha_uv g[v]`` and ``d score_src[u] = sum_v alpha_uv lr'_uv (g[v] . value[u]
   - delta[v])``. For ``attention_aggregate`` (``FOLD``) it also adds the score
   gradients' share of the value gradient, ``d score_src[u] w_src + d score_dst[u]
   w_dst``, before writing the row; the ``[H, D]`` weight gradients are then two
   matrix-vector products per head.

Scores, running max/sum and accumulators use the value's dtype.

Attention dropout (``drop``, an ``EdgeDropout``; ``DROP`` 1 with counters ``ctr``, 2 for the
identity counter, each edge's CSC position, read without an array) multiplies each weight by its
keep factor (:func:`_keep_factor`: the dropout kernels' hash of ``counter * H + head``,
in uint32) where the weight is used: in the forward's accumulator (not in the running
sum, the undropped normalizer), in pass A's ``g . value`` terms and in pass B's value
gradient and ``g . value`` term. Pass B reads the counters in its own (CSR) order
(``EdgeDropout.reverse_counter``). Nothing of the mask is stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ngra.kernels.gpu.util import autotune, pow2, require_cuda
from ngra.kernels.gpu.dropout import mix32  # the one hash: the masks agree with dropout's
from ngra.kernels.registry import register

__all__ = ["softmax_aggregate_bwd", "softmax_aggregate_bwd_fold", "softmax_aggregate_fwd"]

_CONFIGS = [triton.Config({"BLOCK_E": 16}, num_warps=1),
            triton.Config({"BLOCK_E": 32}, num_warps=2),
            triton.Config({"BLOCK_E": 64}, num_warps=4)]


@triton.jit
def _keep_factor(c, h, H, dseed, dscale):
    """``dscale`` where the weight of head ``h`` of the edges with counters ``c`` is kept,
    else 0: ``ref.dropout.mask_hash(c * H + h, s1, s2) >= thr`` with ``dseed = (s1, s2,
    thr)`` (int64, loaded: an int argument of value 1 would be specialized to a constant)."""
    x = mix32((c.to(tl.int64) * H + h + tl.load(dseed)).to(tl.uint32))  # either counter width
    x = x ^ tl.load(dseed + 1).to(tl.uint32)
    x = mix32(x)
    return tl.where(x.to(tl.int64) >= tl.load(dseed + 2), dscale, 0.0)


@triton.jit
def _counter_of(ctr, e, emask, DROP: tl.constexpr):
    """The counters of CSC edges ``e``: loaded from ``ctr`` (``DROP == 1``), or the
    positions themselves (``DROP == 2``, the identity)."""
    if DROP == 2:
        return e
    else:
        return tl.load(ctr + e, mask=emask, other=0)


@autotune(_CONFIGS, key=["D", "H"])
@triton.jit
def _fwd_rows(indptr, indices, ss, sd, value, out, lse, ctr, dseed, dscale, H, D,
              slope: tl.constexpr, DROP: tl.constexpr, BLOCK_E: tl.constexpr,
              BLOCK_D: tl.constexpr):
    v = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    F = H * D
    start = tl.load(indptr + v)
    end = tl.load(indptr + v + 1)
    sdv = tl.load(sd + v * H + h)
    sl = tl.full([1], slope, out.dtype.element_ty)  # exact in float64 (a bare float is fp32)
    m = tl.full([1], float("-inf"), out.dtype.element_ty)
    s = tl.zeros([1], out.dtype.element_ty)
    acc = tl.zeros([BLOCK_D], out.dtype.element_ty)
    if DROP:
        ks = tl.load(dscale)
    for j in range(start, end, BLOCK_E):
        e = j + tl.arange(0, BLOCK_E)
        emask = e < end
        u = tl.load(indices + e, mask=emask, other=0).to(tl.int64)
        raw = tl.load(ss + u * H + h, mask=emask, other=0.0) + sdv
        x = tl.where(emask, tl.where(raw > 0, raw, raw * sl), float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        scale = tl.exp(m - m_new)
        p = tl.exp(x - m_new)
        val = tl.load(value + u[:, None] * F + h * D + d[None, :],
                      mask=emask[:, None] & dmask[None, :], other=0.0)
        s = s * scale + tl.sum(p, axis=0)
        if DROP:  # the running sum stays undropped: it is the normalizer
            p = p * _keep_factor(_counter_of(ctr, e, emask, DROP), h, H, dseed, ks)
        acc = acc * scale + tl.sum(p[:, None] * val, axis=0)
        m = m_new
    full = end > start
    tl.store(out + v * F + h * D + d, tl.where(full, acc / tl.where(full, s, 1.0), 0.0),
             mask=dmask)
    tl.store(lse + v * H + h + tl.arange(0, 1),
             tl.where(full, m + tl.log(tl.where(full, s, 1.0)), float("-inf")))


@autotune(_CONFIGS, key=["D", "H"])
@triton.jit
def _bwd_dst_rows(indptr, indices, ss, sd, value, out, lse, g, delta, gsd, ctr, dseed,
                  dscale, H, D, slope: tl.constexpr, HAS_OUT: tl.constexpr, DROP: tl.constexpr,
                  BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
    v = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    F = H * D
    start = tl.load(indptr + v)
    end = tl.load(indptr + v + 1)
    sdv = tl.load(sd + v * H + h)
    lsev = tl.load(lse + v * H + h)
    sl = tl.full([1], slope, g.dtype.element_ty)
    gv = tl.load(g + v * F + h * D + d, mask=dmask, other=0.0)
    s1 = tl.zeros([1], g.dtype.element_ty)  # sum alpha dp
    s2 = tl.zeros([1], g.dtype.element_ty)  # sum alpha lr' dp
    s3 = tl.zeros([1], g.dtype.element_ty)  # sum alpha lr'
    if DROP:
        ks = tl.load(dscale)
    for j in range(start, end, BLOCK_E):
        e = j + tl.arange(0, BLOCK_E)
        emask = e < end
        u = tl.load(indices + e, mask=emask, other=0).to(tl.int64)
        raw = tl.load(ss + u * H + h, mask=emask, other=0.0) + sdv
        lr = tl.where(raw > 0, 1.0, sl)
        alpha = tl.where(emask, tl.exp(raw * lr - lsev), 0.0)
        val = tl.load(value + u[:, None] * F + h * D + d[None, :],
                      mask=emask[:, None] & dmask[None, :], other=0.0)
        dp = tl.sum(val * gv[None, :], axis=1)
        if DROP:  # d alpha = k g . value
            dp = dp * _keep_factor(_counter_of(ctr, e, emask, DROP), h, H, dseed, ks)
        s1 += tl.sum(alpha * dp, axis=0)
        s2 += tl.sum(alpha * lr * dp, axis=0)
        s3 += tl.sum(alpha * lr, axis=0)
    if HAS_OUT:
        dl = s1 * 0 + tl.sum(gv * tl.load(out + v * F + h * D + d, mask=dmask, other=0.0), axis=0)
    else:
        dl = s1
    one = tl.arange(0, 1)
    tl.store(delta + v * H + h + one, dl)
    tl.store(gsd + v * H + h + one, s2 - dl * s3)


@autotune(_CONFIGS, key=["D", "H"])
@triton.jit
def _bwd_src_rows(rev_indptr, rev_indices, ss, sd, value, lse, g, delta, gss, gval,
                  ws, wd, gsd, rctr, dseed, dscale, H, D, slope: tl.constexpr,
                  FOLD: tl.constexpr, DROP: tl.constexpr, BLOCK_E: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    u = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    F = H * D
    start = tl.load(rev_indptr + u)
    end = tl.load(rev_indptr + u + 1)
    ssu = tl.load(ss + u * H + h)
    sl = tl.full([1], slope, g.dtype.element_ty)
    valu = tl.load(value + u * F + h * D + d, mask=dmask, other=0.0)
    acc_s = tl.zeros([1], g.dtype.element_ty)
    acc_v = tl.zeros([BLOCK_D], g.dtype.element_ty)
    if DROP:
        ks = tl.load(dscale)
    for j in range(start, end, BLOCK_E):
        e = j + tl.arange(0, BLOCK_E)
        emask = e < end
        v = tl.load(rev_indices + e, mask=emask, other=0).to(tl.int64)
        raw = ssu + tl.load(sd + v * H + h, mask=emask, other=0.0)
        lr = tl.where(raw > 0, 1.0, sl)
        alpha = tl.where(emask, tl.exp(raw * lr - tl.load(lse + v * H + h, mask=emask,
                                                            other=0.0)), 0.0)
        gv = tl.load(g + v[:, None] * F + h * D + d[None, :],
                     mask=emask[:, None] & dmask[None, :], other=0.0)
        dp = tl.sum(gv * valu[None, :], axis=1)
        dl = tl.load(delta + v * H + h, mask=emask, other=0.0)
        if DROP:  # rctr: the counters in this walk's (CSR) order
            k = _keep_factor(tl.load(rctr + e, mask=emask, other=0), h, H, dseed, ks)
            acc_s += tl.sum(alpha * lr * (k * dp - dl), axis=0)
            acc_v += tl.sum((alpha * k)[:, None] * gv, axis=0)
        else:
            acc_s += tl.sum(alpha * lr * (dp - dl), axis=0)
            acc_v += tl.sum(alpha[:, None] * gv, axis=0)
    if FOLD:  # attention_aggregate: the scores are value . w, so their gradients join value's
        acc_v += acc_s * tl.load(ws + h * D + d, mask=dmask, other=0.0)
        acc_v += tl.load(gsd + u * H + h) * tl.load(wd + h * D + d, mask=dmask, other=0.0)
    tl.store(gss + u * H + h + tl.arange(0, 1), acc_s)
    tl.store(gval + u * F + h * D + d, acc_v, mask=dmask)


def _drop_args(drop, value, counter=None) -> tuple:
    """``(ctr, dseed, dscale)`` of the kernels (``DROP`` 0: placeholders): the seeds and
    threshold ``dseed = (s1, s2, thr)`` as an int64 tensor, ``1 / (1 - p)`` as a tensor of
    value's dtype (a float argument would be fp32)."""
    if drop is None:
        return value, value, value
    if isinstance(drop.s1, torch.Tensor):  # drawn on the device: no host copy
        seeds = torch.stack([drop.s1, drop.s2, drop.s1.new_full((), drop.thr)])
    else:
        seeds = torch.tensor([drop.s1, drop.s2, drop.thr], dtype=torch.int64,
                             device=value.device)
    ctr = drop.counter if counter is None else counter
    return (value if ctr is None else ctr), seeds, value.new_full((1,), drop.scale)


def _drop_code(drop, counter=None) -> int:
    """``DROP``: 0 no dropout, 1 counters in an array, 2 the identity counter."""
    if drop is None:
        return 0
    return 2 if drop.counter is None and counter is None else 1


def forward(indptr, indices, score_src, score_dst, value, negative_slope, drop=None):
    num_dst, heads = score_dst.shape
    dim = value.shape[2]
    out = value.new_empty((num_dst, heads, dim))
    lse = value.new_empty((num_dst, heads))
    if num_dst and heads:
        _fwd_rows[(num_dst, heads)](indptr, indices, score_src, score_dst, value, out, lse,
                                    *_drop_args(drop, value), heads, dim, negative_slope,
                                    DROP=_drop_code(drop), BLOCK_D=pow2(dim))
    return out, lse


def backward(indptr, indices, rev, score_src, score_dst, value, out, lse, grad_out,
             negative_slope, fold=None, drop=None):
    """``(d score_src, d score_dst, d value)``; with ``fold = (ws, wd)`` the value
    gradient also holds the score gradients' share (``attention_aggregate``); ``drop``:
    the forward's ``EdgeDropout``, or ``None``."""
    num_dst, heads = score_dst.shape
    num_src, dim = value.shape[0], value.shape[2]
    lse = lse.to(value.dtype)
    delta = value.new_empty((num_dst, heads))
    gsd = value.new_empty((num_dst, heads))
    gss = value.new_empty((num_src, heads))
    gval = value.new_empty(value.shape)
    if not heads:
        return gss, gsd, gval
    if num_dst:
        _bwd_dst_rows[(num_dst, heads)](indptr, indices, score_src, score_dst, value,
                                        value if out is None else out, lse, grad_out, delta,
                                        gsd, *_drop_args(drop, value), heads, dim,
                                        negative_slope, HAS_OUT=out is not None,
                                        DROP=_drop_code(drop), BLOCK_D=pow2(dim))
    if num_src:
        rev_indptr, rev_indices, rev_perm = rev
        ws, wd = fold if fold is not None else (value, value)
        rctr = None if drop is None else drop.reverse_counter(rev_perm)
        _bwd_src_rows[(num_src, heads)](rev_indptr, rev_indices, score_src, score_dst, value,
                                        lse, grad_out, delta, gss, gval, ws, wd, gsd,
                                        *_drop_args(drop, value, rctr), heads, dim,
                                        negative_slope, FOLD=fold is not None,
                                        DROP=_drop_code(drop, rctr), BLOCK_D=pow2(dim))
    return gss, gsd, gval


@register("softmax_aggregate_fwd", "gpu")
def softmax_aggregate_fwd(indptr, indices, score_src, score_dst, value, negative_slope,
                          drop=None):
    """See :func:`ngra.kernels.ref.softmax_aggregate.softmax_aggregate_fwd`."""
    require_cuda(indptr, indices, score_src, score_dst, value, _counter(drop))
    return forward(indptr, indices, score_src, score_dst, value, negative_slope, drop)


@register("softmax_aggregate_bwd", "gpu")
def softmax_aggregate_bwd(indptr, indices, rev, score_src, score_dst, value, out, lse, grad_out,
                          negative_slope, drop=None):
    """See :func:`ngra.kernels.ref.softmax_aggregate.softmax_aggregate_bwd`."""
    require_cuda(indptr, indices, score_src, score_dst, value, out, lse, grad_out,
                 _counter(drop))
    return backward(indptr, indices, rev, score_src, score_dst, value, out, lse, grad_out,
                    negative_slope, drop=drop)


def _counter(drop):
    return None if drop is None else drop.counter


@register("softmax_aggregate_bwd_fold", "gpu")
def softmax_aggregate_bwd_fold(indptr, indices, rev, value, w_src, w_dst, score_src, score_dst,
                               lse, grad_out, negative_slope, inplace, drop=None):
    """``(d value, d w_src, d w_dst)`` of ``attention_aggregate``: the score gradients are
    folded into the value gradient in pass B. Never in place (``inplace`` is ignored):
    the weight gradients read the value after that pass."""
    require_cuda(indptr, indices, value, w_src, w_dst, score_src, score_dst, lse, grad_out,
                 _counter(drop))
    gss, gsd, gval = backward(indptr, indices, rev, score_src, score_dst, value, None, lse,
                              grad_out, negative_slope, fold=(w_src, w_dst), drop=drop)
    heads = value.shape[1]
    g_ws = torch.stack([value[:, h, :].t() @ gss[:, h] for h in range(heads)])
    g_wd = torch.stack([value[:, h, :].t() @ gsd[:, h] for h in range(heads)])
    return gval, g_ws.view(w_src.shape), g_wd.view(w_dst.shape)
