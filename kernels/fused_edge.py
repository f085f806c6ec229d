"""``fused_edge_aggregate``: Scatter-ApplyEdge-Gather in one kernel, no ``[E, F]`` tensor.

NeuGraph fuses an element-wise ApplyEdge with the Gather that follows it: per edge
``u -> v`` and feature column ``f`` an expression of per-vertex and per-edge terms is
evaluated and immediately reduced into the destination's accumulator, so no edge
tensor is ever written. G-GCN's edge stage is the running example::

    out[v] = sum_{u -> v} sigmoid(a[v] + b[u]) * c[u]      # a = W_H x, b = W_C x, c = x

The expression is an :class:`~ngra.kernels.edge_expr.EdgeExpr` (:mod:`ngra.kernels.edge_expr`:
the closed op set, :class:`~ngra.kernels.edge_expr.E` to build one, the symbolic
:func:`~ngra.kernels.edge_expr.derivative` that gives the backward's expressions).

The public function validates every argument, then runs a custom autograd Function
whose forward and backward are the registered backend kernels ``"fused_edge_fwd"``
and ``"fused_edge_bwd"`` (``ref/``, ``cpu/``, ``gpu/``). The backend is chosen once,
at forward time, and the same backend runs the backward. Backend contract::

    fused_edge_fwd(indptr, indices, call, src, dst, edge) -> (out [num_dst, F], aux)
    fused_edge_fwd_partials(indptr, indices, call, src, dst, edge, partials)
        -> (out [num_dst, F], [K_i [num_dst, F] for i in partials])     # sum/mean only
    fused_edge_partials_pay(indptr, call) -> bool     # whether the forward should take them
    fused_edge_shared_rows() -> bool                  # whether it reads shared dst rows
    fused_edge_bwd(indptr, indices, get_rev, call, src, dst, edge, aux, grad_out, need)
        -> (src_grads, dst_grads, edge_grads)
    fused_edge_multi_fwd(indptr, indices, call, src, dst, edge)
        -> ([out_j [num_dst, F]], [arg_j [num_dst, F] int64 for each max/min output j])
    fused_edge_multi_bwd(indptr, indices, get_rev, call, src, dst, edge, args, grad_outs, need)
        -> (src_grads, dst_grads, edge_grads)

The ``multi`` ops serve :func:`fused_edge_aggregate_multi` (several outputs, each with
its own expression and reducer, from one walk; ``call.outputs``); ``ref`` and ``cpu``
implement them.

``call`` is a :class:`FusedEdgeCall`; ``src``/``dst``/``edge`` are lists of contiguous
term tensors; ``aux`` is ``None`` for sum/mean and, for max/min, the ``[num_dst, F]``
int64 CSC position of the selected edge (-1 without in-edges); ``get_rev()`` returns
the reverse CSR (built on first call); ``need`` says, per term, whether its gradient
is wanted, and each returned list holds a gradient or ``None`` per term.

**Dst partials.** Under ``sum`` (``mean``) a destination's gradient factors:
``d out[v, f] / d dst_i[v, f] = sum_{u -> v} d expr / d dst_i`` (divided by the degree)
does not depend on ``grad_out``, so the forward can sum it while it walks the
destination's in-edges anyway: ``K_i [num_dst, F]``, and the backward's gradient of
``dst_i`` is ``grad_out * K_i``, element-wise, with no graph walk. The walk over
sources that the src gradients need then writes only rows of its own source (no
per-thread ``[num_dst, F]`` buffers, no random read-modify-write of destination rows).
It costs one ``K_i`` saved for backward per term, so it runs only where the backend
says it pays (``fused_edge_partials_pay``): on cpu where the one-walk backward would
otherwise add a ``[num_dst, F]`` buffer per extra thread (two or more threads, a dense
enough graph; on sparse graphs the two walks need no buffer), never on gpu (whose
chunked backward gets dst gradients from the same pass as the others), always on ref
(the specification). It applies to full-width dst terms that need a gradient while
grad mode is on, not in a :func:`~ngra.kernels.backward_only` recompute (its forward is
skipped). ``NGRA_DST_PARTIALS`` (read at each call) or :data:`DST_PARTIALS` overrides the
backend's choice (tests compare both routes).

**Shared rows.** A dst term may be one row ``[1, F]`` that every destination reads (a
parameter vector: the compiler passes a bias or a weight that multiplies edge data so).
A backend that says it reads shared rows (``fused_edge_shared_rows``: cpu) gets that
row as it is: nothing per destination is made for it or saved for backward, it takes no
dst partial, and the backward walk sums its gradient over destinations into one row
(per thread). Other backends get the ``[num_dst, F]`` copy, and their gradient of it
is summed here.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.edge_expr import EdgeExpr, leaves, verify
from ngra.kernels.checks import check_choice, check_csc, check_feat, check_range, check_rev
from ngra.kernels.registry import forward_skipped, lookup, thread_setting
from ngra.kernels.transpose import reverse_of
from ngra.settings import get

__all__ = [
    "FusedEdgeCall",
    "fused_edge_aggregate",
    "fused_edge_aggregate_multi",
    "REDUCERS",
    "DST_PARTIALS",
    "dst_partials",
    "partials_judged_on",
]

REDUCERS = ("sum", "mean", "max", "min")

#: Sum full-width dst terms' partial derivatives in the forward (see "Dst partials" above):
#: ``"auto"`` where the backend says they pay, ``"always"``, or ``"never"``. ``None`` (the
#: default): the ``NGRA_DST_PARTIALS`` environment variable, read at each call
#: (benchmarks, A/B runs); tests and experiments set this to compare routes.
DST_PARTIALS: str | None = None


# ============================================================================ public op
@dataclass(frozen=True)
class FusedEdgeCall:
    """What the backends receive besides tensors: the expression and the term layout.

    Attributes:
        expr: the verified expression.
        reduce: one of :data:`REDUCERS`.
        num_terms: ``(len(src_terms), len(dst_terms), len(edge_terms))``.
        width: ``F``, the common feature width (output ``[num_dst, F]``).
        dtype: the terms' float dtype (the output's).
        outputs: ``((expr, reduce), ...)`` of a :func:`fused_edge_aggregate_multi` call
            (then ``expr``/``reduce`` are the first output's expression and ``"multi"``);
            empty for one output.
    """

    expr: EdgeExpr
    reduce: str
    num_terms: tuple[int, int, int]
    width: int
    dtype: torch.dtype
    outputs: tuple[tuple[EdgeExpr, str], ...] = ()

    def roots(self) -> tuple[tuple[EdgeExpr, str], ...]:
        """``((expr, reduce), ...)`` of every output."""
        return self.outputs or ((self.expr, self.reduce),)

    def leaves(self) -> list[tuple[str, int]]:
        """Every ``(kind, index)`` leaf some output's expression reads, sorted."""
        return sorted({leaf for x, _ in self.roots() for leaf in leaves(x)})

    def split(self, terms: Sequence[Any]) -> tuple[list[Any], list[Any], list[Any]]:
        """Split a flat term list into ``(src_terms, dst_terms, edge_terms)``."""
        ns, nd, _ = self.num_terms
        return list(terms[:ns]), list(terms[ns:ns + nd]), list(terms[ns + nd:])


def fused_edge_aggregate(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    expr: EdgeExpr,
    src_terms: Sequence[torch.Tensor] = (),
    dst_terms: Sequence[torch.Tensor] = (),
    edge_terms: Sequence[torch.Tensor] = (),
    *,
    reduce: str = "sum",
    rev: Any = None,
) -> torch.Tensor:
    r"""Evaluate an element-wise edge expression and reduce it over in-edges, fused.

    .. math::
        \mathrm{out}_{v,f} = \bigoplus_{e = (u \to v)}
            \mathrm{expr}\big(\mathrm{src}_i[u, f],\ \mathrm{dst}_i[v, f],\
            \mathrm{edge}_i[e, f]\big)

    with :math:`\oplus` = ``reduce``. A term of width 1 broadcasts over ``f``. A
    destination without in-edges gets 0. Differentiable in every term; gradients are
    computed by derivative expressions (:func:`derivative`) in a pass over
    destinations (dst and edge terms) and one over sources (src terms), so neither
    direction forms an ``[E, F]`` tensor; under sum/mean a full-width dst term's
    derivatives are summed in the forward instead (module docs, "Dst partials").
    ``max``/``min`` route each gradient to the first edge (in CSC order) attaining the
    extreme; their NaN handling is unspecified.

    Args:
        indptr: ``[num_dst + 1]`` int32/int64 CSC offsets over destinations.
        indices: ``[E]`` int32/int64 source id of each edge, destination-sorted.
        expr: the :class:`EdgeExpr`; ``E.src(i)`` reads ``src_terms[i]`` etc.
        src_terms: ``[num_src, F]`` or ``[num_src, 1]`` float32/float64 tensors
            (all with the same ``num_src``) (default: none).
        dst_terms: ``[num_dst, F]`` or ``[num_dst, 1]`` tensors, or ``[1, F]`` / ``[1, 1]``:
            one row that every destination reads (default: none).
        edge_terms: ``[E, F]`` or ``[E, 1]`` tensors in CSC edge order (default: none).
        reduce: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"`` (default: ``"sum"``).
        rev: optional reverse CSR for the src-term backward: ``(rev_indptr [num_src + 1],
            rev_indices [E] destination ids, rev_perm [E] CSC position of each CSR edge)``
            or an object with ``indptr``/``indices``/``perm`` such as ``Graph.csr()``
            (default: built on demand, and cached, by :func:`ngra.kernels.transpose.reverse_of`).

    Returns:
        ``[num_dst, F]`` in the terms' dtype, ``F`` the largest term width (1 if none).

    Raises:
        TypeError: wrong types or dtypes, malformed ``expr``.
        ValueError: inconsistent shapes, mixed devices, ``expr`` reading a term that was
            not given, unknown ``reduce``, malformed ``indptr``, out-of-range indices.
    """
    verify(expr)
    check_choice(reduce, "reduce", REDUCERS)
    groups, width, dtype, num_src, rev_t = _checked_call(
        indptr, indices, [expr], src_terms, dst_terms, edge_terms, rev)
    num_dst = indptr.numel() - 1
    call = FusedEdgeCall(
        expr, reduce, (len(groups["src"]), len(groups["dst"]), len(groups["edge"])), width,
        dtype if dtype is not None else torch.get_default_dtype(),
    )
    shared = tuple(i for i, t in enumerate(groups["dst"]) if t.shape[0] != num_dst)
    partials = (_partials(call, groups["dst"], indptr, shared) if torch.is_grad_enabled()
                else ())
    return _FusedEdge.apply(
        indptr, indices, call, rev_t, num_src, (partials, shared),
        *groups["src"], *groups["dst"], *groups["edge"]
    )


def fused_edge_aggregate_multi(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    outputs: Sequence[tuple[EdgeExpr, str]],
    src_terms: Sequence[torch.Tensor] = (),
    dst_terms: Sequence[torch.Tensor] = (),
    edge_terms: Sequence[torch.Tensor] = (),
    *,
    rev: Any = None,
) -> list[torch.Tensor]:
    r"""Several element-wise edge expressions over the same terms, each reduced over the
    in-edges by its own reducer, in one walk (PNA's mean, max, min and second moment).

    .. math::
        \mathrm{out}^{(j)}_{v,f} = \bigoplus^{(j)}_{e = (u \to v)}
            \mathrm{expr}_j\big(\mathrm{src}_i[u, f],\ \mathrm{dst}_i[v, f],\
            \mathrm{edge}_i[e, f]\big)

    Each output equals ``fused_edge_aggregate(indptr, indices, expr_j, ..., reduce=r_j)``
    (the same ``max``/``min`` first-edge rule for ties); the backend evaluates every
    expression per edge and column while it walks a destination's in-edges once, and its
    backward likewise adds every output's share of a term's gradient in one walk
    (``sum_j g_j * d expr_j / d term``, a max/min output's only on the edge that won).
    No dst partials. Backends: ``ref`` and ``cpu``; a device whose preferred backend
    lacks the op (``gpu``) falls back to ``ref``, so callers that care check
    :func:`~ngra.kernels.registry.backend_for` first.

    Args:
        indptr, indices, src_terms, dst_terms, edge_terms, rev: as for
            :func:`fused_edge_aggregate`.
        outputs: ``[(expr, reduce), ...]``, at least one; ``reduce`` one of :data:`REDUCERS`.

    Returns:
        One ``[num_dst, F]`` tensor per output, ``F`` the largest term width (1 if none).

    Raises:
        TypeError, ValueError: as :func:`fused_edge_aggregate`, for any output.
    """
    if isinstance(outputs, (str, EdgeExpr)) or not isinstance(outputs, Sequence) or not outputs:
        raise TypeError("outputs must be a non-empty list of (expr, reduce) pairs; got "
                        f"{outputs!r}.")
    for j, pair in enumerate(outputs):
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise TypeError(f"outputs[{j}] must be an (expr, reduce) pair; got {pair!r}.")
        verify(pair[0])
        check_choice(pair[1], f"outputs[{j}] reduce", REDUCERS)
    groups, width, dtype, num_src, rev_t = _checked_call(
        indptr, indices, [x for x, _ in outputs], src_terms, dst_terms, edge_terms, rev)
    num_dst = indptr.numel() - 1
    call = FusedEdgeCall(
        outputs[0][0], "multi", (len(groups["src"]), len(groups["dst"]), len(groups["edge"])),
        width, dtype if dtype is not None else torch.get_default_dtype(), tuple(outputs),
    )
    shared = tuple(i for i, t in enumerate(groups["dst"]) if t.shape[0] != num_dst)
    return list(_FusedEdgeMulti.apply(indptr, indices, call, rev_t, num_src, shared,
                                      *groups["src"], *groups["dst"], *groups["edge"]))


def _checked_call(indptr, indices, exprs, src_terms, dst_terms, edge_terms, rev):
    """Validate a call's graph, terms and ``rev`` for expressions ``exprs``: ``(groups,
    F, dtype or None, num_src, rev tensors or None)``."""
    num_dst = check_csc(indptr, indices)
    num_edges = indices.numel()
    groups = {
        "src": _as_term_list(src_terms, "src_terms"),
        "dst": _as_term_list(dst_terms, "dst_terms"),
        "edge": _as_term_list(edge_terms, "edge_terms"),
    }
    for expr in exprs:
        for kind, i in leaves(expr):
            if i >= len(groups[kind]):
                raise ValueError(
                    f"expr reads {kind}{i} ({kind}_terms[{i}]) but only {len(groups[kind])} "
                    f"{kind}_terms were given; expr = {expr}."
                )
    width, dtype, num_src = _check_terms(groups, num_dst, num_edges, indptr.device)
    if num_src is not None:
        check_range(indices, num_src, "indices", "num_src = rows of src_terms")
    else:  # no src terms: nothing is gathered by source id, any non-negative id is fine
        check_range(indices, 2**62, "indices", "source ids")
        num_src = int(indices.max()) + 1 if num_edges else 0
    rev_t = None
    if rev is not None:
        rev_t = check_rev(rev, num_src, num_dst, num_edges, indptr.device)
    return groups, width, dtype, num_src, rev_t


def _reads_shared_rows(device: torch.device) -> bool:
    """Whether the backend for ``device`` reads a one-row dst term as it is."""
    try:
        return bool(lookup("fused_edge_shared_rows", device)())
    except NotImplementedError:
        return False


_judge = threading.local()


@contextlib.contextmanager
def partials_judged_on(indptr: torch.Tensor) -> Iterator[None]:
    """Inside the block, whether dst partials pay is judged on ``indptr`` (``[N + 1]`` CSC
    offsets of another graph) instead of the call's own: a memory budget prices a layer on
    a small sample of its graph, and the sample must take the partials the whole graph
    will take (they pay only on dense enough graphs)."""
    with thread_setting(_judge, "indptr", indptr):
        yield


def dst_partials() -> str:
    """The dst partials mode in force: :data:`DST_PARTIALS` if set, else
    ``NGRA_DST_PARTIALS`` (``"auto"`` when unset)."""
    if DST_PARTIALS is None:
        return str(get("NGRA_DST_PARTIALS"))
    if DST_PARTIALS not in ("auto", "always", "never"):
        raise ValueError("ngra.kernels.fused_edge.DST_PARTIALS must be 'auto', 'always', 'never' "
                         f"or None; got {DST_PARTIALS!r}.")
    return DST_PARTIALS


def _partials(call: FusedEdgeCall, dst: list[torch.Tensor], indptr: torch.Tensor,
              shared: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The dst terms whose summed partial derivatives the forward computes: full-width,
    read by the expression, wanting a gradient, not a shared row, under sum/mean, where
    the backend says they pay (see "Dst partials")."""
    mode = dst_partials()
    if (mode == "never" or call.reduce not in ("sum", "mean")
            or forward_skipped(call.reduce)):
        return ()
    read = {i for kind, i in leaves(call.expr) if kind == "dst"}
    parts = tuple(i for i, t in enumerate(dst) if i in read and i not in shared
                  and t.requires_grad and t.shape[1] == call.width > 1)
    judged = getattr(_judge, "indptr", None)
    if (parts and mode == "auto"
            and not lookup("fused_edge_partials_pay", indptr.device)(
                indptr if judged is None else judged, call)):
        return ()
    return parts


class _FusedEdge(torch.autograd.Function):
    _ARGS = 6  # non-term arguments of apply: indptr, indices, call, rev, num_src, routes

    @staticmethod
    def forward(ctx, indptr, indices, call, rev, num_src, routes, *terms):  # type: ignore[override]
        partials, shared = routes  # dst partials, one-row dst terms (module docs)
        device = indptr.device
        ctx.bwd = lookup("fused_edge_bwd", device)  # same backend as the forward
        terms, ctx.copied = _backend_terms(call, indptr, shared, terms)
        src, dst, edge = call.split(terms)
        aux, ks = None, []
        if forward_skipped(call.reduce):
            out = indptr.new_zeros((), dtype=call.dtype).expand(indptr.numel() - 1, call.width)
        elif partials:
            fwd = lookup("fused_edge_fwd_partials", device)
            out, ks = fwd(indptr, indices, call, src, dst, edge, partials)
        else:
            out, aux = lookup("fused_edge_fwd", device)(indptr, indices, call, src, dst, edge)
        ctx.call, ctx.rev, ctx.num_src, ctx.partials = call, rev, num_src, partials
        ctx.has_aux = aux is not None
        ctx.save_for_backward(indptr, indices, *((aux,) if ctx.has_aux else ()), *ks, *terms)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):  # type: ignore[override]
        saved = ctx.saved_tensors
        indptr, indices = saved[:2]
        rest = saved[2:]
        aux = rest[0] if ctx.has_aux else None
        rest = rest[1:] if ctx.has_aux else rest
        partials: tuple[int, ...] = ctx.partials
        ks, terms = rest[:len(partials)], rest[len(partials):]
        call: FusedEdgeCall = ctx.call
        skip = (None,) * _FusedEdge._ARGS
        needs = ctx.needs_input_grad[_FusedEdge._ARGS:]
        if not any(needs):
            return skip + (None,) * len(terms)
        src, dst, edge = call.split(terms)
        ns, nd, _ = call.num_terms
        g = grad_out.to(call.dtype).contiguous()
        # dst terms with partials: grad_out * K, no walk; the backend skips them
        dst_need = [n and i not in partials for i, n in enumerate(needs[ns:ns + nd])]
        need = (tuple(needs[:ns]), tuple(dst_need), tuple(needs[ns + nd:]))
        if any(itertools.chain(*need)):

            def get_rev() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
                # built only when a src term needs a gradient; cached per graph tensors
                return reverse_of(indptr, indices, ctx.num_src, ctx.rev)

            gs, gd, ge = ctx.bwd(indptr, indices, get_rev, call, src, dst, edge, aux, g, need)
            gd = list(gd)
        else:
            gs, gd, ge = [None] * ns, [None] * nd, [None] * (len(terms) - ns - nd)
        for i, k in zip(partials, ks):
            if needs[ns + i]:
                gd[i] = g * k
        for i in ctx.copied:  # gradient of the copy -> of the row
            if gd[i] is not None:
                gd[i] = gd[i].sum(0, keepdim=True)
        return skip + tuple(gs) + tuple(gd) + tuple(ge)


def _backend_terms(call: FusedEdgeCall, indptr: torch.Tensor, shared: tuple[int, ...],
                   terms: tuple) -> tuple[tuple, tuple[int, ...]]:
    """``(contiguous terms, copied)``: a backend that does not read shared dst rows gets
    ``[num_dst, F]`` copies of them (``copied``: their dst indices, whose gradients the
    caller sums back to one row)."""
    copied: tuple[int, ...] = ()
    if shared and not _reads_shared_rows(indptr.device):
        ns, num_dst = call.num_terms[0], indptr.numel() - 1
        terms = tuple(t.expand(num_dst, -1) if i - ns in shared else t
                      for i, t in enumerate(terms))
        copied = shared
    return tuple(t.contiguous() for t in terms), copied


class _FusedEdgeMulti(torch.autograd.Function):
    """:func:`fused_edge_aggregate_multi`: ``fused_edge_multi_fwd`` and ``_bwd`` of one
    backend (contract: as ``fused_edge_fwd``/``_bwd`` with a list of outputs, a list of
    ``[num_dst, F]`` int64 arg-extremes, one per max/min output, and a list of output
    gradients)."""

    _ARGS = 6  # indptr, indices, call, rev, num_src, shared

    @staticmethod
    def forward(ctx, indptr, indices, call, rev, num_src, shared, *terms):  # type: ignore[override]
        ctx.bwd = lookup("fused_edge_multi_bwd", indptr.device)  # same backend as the forward
        terms, ctx.copied = _backend_terms(call, indptr, shared, terms)
        src, dst, edge = call.split(terms)
        outs, args = lookup("fused_edge_multi_fwd", indptr.device)(indptr, indices, call, src,
                                                                   dst, edge)
        ctx.call, ctx.rev, ctx.num_src, ctx.num_args = call, rev, num_src, len(args)
        ctx.save_for_backward(indptr, indices, *args, *terms)
        return tuple(outs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):  # type: ignore[override]
        saved = ctx.saved_tensors
        indptr, indices = saved[:2]
        args, terms = list(saved[2:2 + ctx.num_args]), saved[2 + ctx.num_args:]
        call: FusedEdgeCall = ctx.call
        skip = (None,) * _FusedEdgeMulti._ARGS
        needs = ctx.needs_input_grad[_FusedEdgeMulti._ARGS:]
        if not any(needs):
            return skip + (None,) * len(terms)
        ns, nd, _ = call.num_terms
        gs = [g.to(call.dtype).contiguous() for g in grads]
        need = (tuple(needs[:ns]), tuple(needs[ns:ns + nd]), tuple(needs[ns + nd:]))

        def get_rev() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return reverse_of(indptr, indices, ctx.num_src, ctx.rev)

        src, dst, edge = call.split(terms)
        g_s, g_d, g_e = ctx.bwd(indptr, indices, get_rev, call, src, dst, edge, args, gs, need)
        g_d = list(g_d)
        for i in ctx.copied:  # gradient of the copy -> of the row
            if g_d[i] is not None:
                g_d[i] = g_d[i].sum(0, keepdim=True)
        return skip + tuple(g_s) + tuple(g_d) + tuple(g_e)


# ============================================================================ validation
def _as_term_list(terms: Any, name: str) -> list[torch.Tensor]:
    if terms is None:
        return []
    if isinstance(terms, torch.Tensor):
        raise TypeError(
            f"{name} must be a list/tuple of tensors; got a single tensor. Wrap it: [{name[:-1]}]."
        )
    if not isinstance(terms, Sequence):
        raise TypeError(f"{name} must be a list/tuple of tensors; got {type(terms).__name__}.")
    for i, t in enumerate(terms):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}[{i}] must be a torch.Tensor; got {type(t).__name__}.")
    return list(terms)


def _iter_terms(groups: dict[str, list[torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for kind, ts in groups.items():
        for i, t in enumerate(ts):
            yield f"{kind}_terms[{i}]", t


def _check_terms(
    groups: dict[str, list[torch.Tensor]], num_dst: int, num_edges: int, device: torch.device
) -> tuple[int, torch.dtype | None, int | None]:
    """Validate every term; returns ``(F, dtype or None, num_src or None)``."""
    for name, t in _iter_terms(groups):
        check_feat(t, name)
        if t.device != device:
            raise ValueError(f"{name} must be on {device} like the graph; got {t.device}.")
        if t.dim() != 2:
            hint = " Use .unsqueeze(-1) for one value per row." if t.dim() == 1 else ""
            raise ValueError(
                f"{name} must be 2-D [rows, F] or [rows, 1]; got shape {list(t.shape)}.{hint}"
            )
    dtypes = {t.dtype for _, t in _iter_terms(groups)}
    if len(dtypes) > 1:
        got = ", ".join(f"{n}: {t.dtype}" for n, t in _iter_terms(groups))
        raise TypeError(f"all terms must share one dtype; got {got}.")
    rows = {"dst": (num_dst, "num_dst = len(indptr) - 1"), "edge": (num_edges, "E = len(indices)")}
    for kind in ("dst", "edge"):
        want, why = rows[kind]
        for i, t in enumerate(groups[kind]):
            if t.shape[0] != want and not (kind == "dst" and t.shape[0] == 1):
                shared = " (or 1, a row every destination reads)" if kind == "dst" else ""
                raise ValueError(
                    f"{kind}_terms[{i}] must have {why} = {want} rows{shared}; got {t.shape[0]}."
                )
    num_src = None
    if groups["src"]:
        num_src = groups["src"][0].shape[0]
        for i, t in enumerate(groups["src"]):
            if t.shape[0] != num_src:
                raise ValueError(
                    f"src_terms must all have num_src rows; src_terms[0] has {num_src}, "
                    f"src_terms[{i}] has {t.shape[0]}."
                )
    widths = {t.shape[1] for _, t in _iter_terms(groups)}
    if 0 in widths:
        raise ValueError("every term needs at least one column; got a width-0 term.")
    wide = widths - {1}
    if len(wide) > 1:
        got = ", ".join(f"{n}: {t.shape[1]}" for n, t in _iter_terms(groups))
        raise ValueError(f"term widths must be 1 or one common F; got {got}.")
    width = wide.pop() if wide else 1
    return width, (dtypes.pop() if dtypes else None), num_src
