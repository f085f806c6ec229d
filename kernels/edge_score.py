"""``edge_score``: one attention score per edge and head from an element-wise expression,
reduced over each head's feature columns, with no ``[E, H, D]`` tensor.

Attention layers whose score is not a sum of a source and a destination scalar compute,
per edge ``u -> v`` and head ``h``, an element-wise function of ``[H, D]`` vertex rows
and reduce it over ``D``::

    GATv2:            score[e, h] = sum_d att[h, d] * leaky_relu(xs[u, h, d] + xd[v, h, d])
    TransformerConv:  score[e, h] = sum_d q[v, h, d] * k[u, h, d] / sqrt(D)

Written in torch, each forms ``[E, H, D]`` tensors in forward and saves them for backward;
here the expression (an :class:`~ngra.kernels.edge_expr.EdgeExpr` over src and dst terms,
as in :func:`~ngra.kernels.fused_edge.fused_edge_aggregate`) is evaluated per edge and
column inside the kernel and summed into the ``[E, H]`` output; backward re-evaluates the
symbolic derivatives (:func:`~ngra.kernels.edge_expr.derivative`) per edge. Only the
``[E, H]`` gradient arrives and nothing per edge is saved.

Backend contract (``ref/``, ``cpu/``, ``gpu/``; the gpu backend is plain torch over chunks
of edges, not yet a generated Triton kernel: it forms ``[chunk, F]`` rows, never
``[E, F]``)::

    edge_score_fwd(indptr, indices, call, src, dst) -> out [E, H]
    edge_score_bwd(indptr, indices, call, src, dst, grad [E, H], need) -> (src_grads, dst_grads)

``call`` is an :class:`EdgeScoreCall`; ``src``/``dst`` lists of contiguous 2-D terms;
``need`` says, per term, whether its gradient is wanted (each returned list holds a
gradient or ``None`` per term). A dst term may be one row ``[1, F]`` that every edge
reads (a parameter such as GATv2's ``att``); its gradient is summed over edges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.checks import check_csc, check_feat, check_range
from ngra.kernels.edge_expr import EdgeExpr, leaves, verify
from ngra.kernels.registry import current_backend, lookup, use_backend

__all__ = ["EdgeScoreCall", "edge_score"]


@dataclass(frozen=True)
class EdgeScoreCall:
    """What the backends receive besides tensors.

    Attributes:
        expr: the verified expression (``E.src(i)`` / ``E.dst(i)`` leaves only).
        heads: ``H``; the terms' common width ``F`` is ``H * D``.
        width: ``F``.
        scale: a number multiplying every score.
        num_terms: ``(len(src_terms), len(dst_terms))``.
        dtype: the terms' float dtype.
    """

    expr: EdgeExpr
    heads: int
    width: int
    scale: float
    num_terms: tuple[int, int]
    dtype: torch.dtype


def edge_score(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    expr: EdgeExpr,
    src_terms: Sequence[torch.Tensor] = (),
    dst_terms: Sequence[torch.Tensor] = (),
    *,
    heads: int = 1,
    scale: float = 1.0,
) -> torch.Tensor:
    r"""Per-edge, per-head scores of an element-wise expression summed over each head's columns.

    .. math::
        \mathrm{out}_{e,h} = \mathrm{scale} \sum_{d < D}
            \mathrm{expr}\big(\mathrm{src}_i[u, hD + d],\ \mathrm{dst}_i[v, hD + d]\big),
        \qquad e = (u \to v),\ D = F / H

    A term of width 1 broadcasts over the columns. Differentiable in every term.

    Args:
        indptr: ``[num_dst + 1]`` int32/int64 CSC offsets over destinations.
        indices: ``[E]`` int32/int64 source of each edge, destination-sorted.
        expr: the :class:`EdgeExpr` (no ``E.edge`` leaves).
        src_terms: ``[num_src, F]`` or ``[num_src, 1]`` float32/float64 tensors.
        dst_terms: ``[num_dst, F]`` or ``[num_dst, 1]``, or ``[1, F]`` / ``[1, 1]``: one row
            every edge reads.
        heads: ``H``, dividing ``F`` (default: 1).
        scale: multiplies every score (default: 1).

    Returns:
        ``[E, H]`` in the terms' dtype, in CSC edge order.

    Raises:
        TypeError: wrong types or dtypes, malformed ``expr``.
        ValueError: shapes that do not fit, an ``E.edge`` leaf, ``H`` not dividing ``F``.
    """
    verify(expr)
    num_dst = check_csc(indptr, indices)
    src, dst = list(src_terms), list(dst_terms)
    for kind, i in leaves(expr):
        have = {"src": len(src), "dst": len(dst)}.get(kind)
        if have is None:
            raise ValueError(f"edge_score reads src and dst terms only; expr = {expr} reads "
                             f"{kind}{i}.")
        if i >= have:
            raise ValueError(f"expr reads {kind}{i} but only {have} {kind}_terms were given.")
    terms = [(f"src_terms[{i}]", t) for i, t in enumerate(src)] + \
            [(f"dst_terms[{i}]", t) for i, t in enumerate(dst)]
    for name, t in terms:
        check_feat(t, name)
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2-D [rows, F] or [rows, 1]; got {list(t.shape)}.")
        if t.device != indptr.device:
            raise ValueError(f"{name} must be on {indptr.device} like the graph; got {t.device}.")
    dtypes = {t.dtype for _, t in terms}
    if len(dtypes) > 1:
        raise TypeError(f"all terms must share one dtype; got {sorted(map(str, dtypes))}.")
    widths = {t.shape[1] for _, t in terms} - {1}
    if len(widths) > 1:
        raise ValueError(f"term widths must be 1 or one common F; got {sorted(widths)}.")
    width = widths.pop() if widths else heads
    if not isinstance(heads, int) or heads < 1 or width % heads:
        raise ValueError(f"heads must be a positive int dividing F = {width}; got {heads!r}.")
    for i, t in enumerate(dst):
        if t.shape[0] not in (num_dst, 1):
            raise ValueError(f"dst_terms[{i}] must have num_dst = {num_dst} rows (or 1); "
                             f"got {t.shape[0]}.")
    if src:
        num_src = src[0].shape[0]
        if any(t.shape[0] != num_src for t in src):
            raise ValueError("src_terms must all have the same number of rows.")
        check_range(indices, num_src, "indices", "num_src = rows of src_terms")
    call = EdgeScoreCall(expr, heads, width, float(scale), (len(src), len(dst)),
                         dtypes.pop() if dtypes else torch.get_default_dtype())
    return _EdgeScore.apply(indptr, indices, call, *src, *dst)


class _EdgeScore(torch.autograd.Function):
    @staticmethod
    def forward(ctx, indptr, indices, call, *terms):  # type: ignore[override]
        ctx.backend = current_backend()
        terms = tuple(t.contiguous() for t in terms)
        ns = call.num_terms[0]
        out = lookup("edge_score_fwd", indptr.device)(indptr, indices, call, list(terms[:ns]),
                                                       list(terms[ns:]))
        ctx.call = call
        ctx.save_for_backward(indptr, indices, *terms)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):  # type: ignore[override]
        indptr, indices, *terms = ctx.saved_tensors
        call: EdgeScoreCall = ctx.call
        needs = ctx.needs_input_grad[3:]
        if not any(needs):
            return (None,) * (3 + len(terms))
        ns = call.num_terms[0]
        with use_backend(ctx.backend):
            gs, gd = lookup("edge_score_bwd", indptr.device)(
                indptr, indices, call, terms[:ns], terms[ns:], grad.to(call.dtype).contiguous(),
                (tuple(needs[:ns]), tuple(needs[ns:])))
        return (None, None, None) + tuple(gs) + tuple(gd)
