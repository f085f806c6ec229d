"""Reference ``fused_edge_aggregate``: plain torch, the specification and test oracle.

Materializes every per-edge row (``[E, F]``), evaluates the expression with torch
ops (:func:`evaluate`, the reference interpreter of :class:`EdgeExpr`), and reduces
per destination. The backward is torch autograd through that forward, *not* the
symbolic derivatives the fused backends use, so the tests compare two independent
routes. Meant to be obviously correct, not fast.

Math, per edge ``e = (u -> v)`` in CSC order and column ``f``::

    msg[e, f] = expr(src_i[u, f], dst_i[v, f], edge_i[e, f])   # width-1 terms broadcast
    out[v, f] = reduce_{e into v} msg[e, f]                     # 0 without in-edges

``max``/``min`` pick the first edge (lowest CSC position) attaining the extreme and
route the gradient to it only. The ``multi`` ops (several outputs, ``call.outputs``)
evaluate every output's expression and reduce each with its own reducer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ngra.kernels.edge_expr import EdgeExpr, topo_order

from ngra.kernels.fused_edge import FusedEdgeCall
from ngra.kernels.registry import register

__all__ = ["evaluate", "fused_edge_fwd", "fused_edge_fwd_partials", "fused_edge_partials_pay",
           "fused_edge_bwd", "fused_edge_multi_fwd", "fused_edge_multi_bwd", "edge_ends"]


def evaluate(
    roots: Sequence[EdgeExpr],
    leaf: Callable[[EdgeExpr], torch.Tensor],
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """Evaluate expressions with torch ops, sharing common subexpressions.

    Args:
        roots: the expressions.
        leaf: maps a ``src``/``dst``/``edge`` leaf to its per-edge tensor ``[E, w]``.
        dtype, device: of constants.

    Returns:
        One tensor per root, broadcast-compatible with ``[E, F]`` (a constant
        root is a 0-d tensor).
    """
    val: dict[EdgeExpr, torch.Tensor] = {}
    for x in topo_order(roots):
        op = x.op
        a = [val[arg] for arg in x.args]
        if x.is_leaf:
            r = leaf(x)
        elif op == "const":
            r = torch.tensor(x.value, dtype=dtype, device=device)
        elif op == "add":
            r = a[0] + a[1]
        elif op == "sub":
            r = a[0] - a[1]
        elif op == "mul":
            r = a[0] * a[1]
        elif op == "div":
            r = a[0] / a[1]
        elif op == "neg":
            r = -a[0]
        elif op == "sigmoid":
            r = torch.sigmoid(a[0])
        elif op == "tanh":
            r = torch.tanh(a[0])
        elif op == "relu":
            r = torch.relu(a[0])
        elif op == "leaky_relu":
            r = F.leaky_relu(a[0], x.value)
        elif op == "exp":
            r = torch.exp(a[0])
        elif op == "log":
            r = torch.log(a[0])
        elif op == "relu_grad":
            r = (a[0] > 0).to(dtype)
        elif op == "leaky_relu_grad":
            one = torch.ones((), dtype=dtype, device=device)
            r = torch.where(a[0] > 0, one, torch.full((), x.value, dtype=dtype, device=device))
        else:  # pragma: no cover - verify() rejects unknown ops first
            raise ValueError(f"unknown op {op!r}")
        val[x] = r
    return [val[r] for r in roots]


def edge_ends(indptr: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src [E], dst [E])`` int64 ids of every CSC edge."""
    num_dst = indptr.numel() - 1
    deg = (indptr[1:] - indptr[:-1]).long()
    dst = torch.repeat_interleave(
        torch.arange(num_dst, device=indptr.device), deg, output_size=indices.numel()
    )
    return indices.long(), dst


def _messages(
    indptr, indices, call: FusedEdgeCall, src, dst, edge
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(msg [E, F], dst [E])``: the expression on every edge, and each edge's destination."""
    msgs, d_id = _all_messages(indptr, indices, call, src, dst, edge)
    return msgs[0], d_id


def _all_messages(
    indptr, indices, call: FusedEdgeCall, src, dst, edge
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``([msg_j [E, F]], dst [E])``: every output's expression on every edge."""
    s_id, d_id = edge_ends(indptr, indices)
    terms = {"src": (src, s_id), "dst": (dst, d_id), "edge": (edge, None)}

    def leaf(x: EdgeExpr) -> torch.Tensor:
        ts, rows = terms[x.op]
        t = ts[x.index]
        return t if rows is None else t.index_select(0, rows)

    msgs = evaluate([x for x, _ in call.roots()], leaf, call.dtype, indptr.device)
    return [m.expand(indices.numel(), call.width) for m in msgs], d_id


def _reduce(
    indptr: torch.Tensor, d_id: torch.Tensor, msg: torch.Tensor, reduce: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    num_dst = indptr.numel() - 1
    num_edges, width = msg.shape
    out = msg.new_zeros(num_dst, width)
    if reduce in ("sum", "mean"):
        out = out.index_add(0, d_id, msg)
        if reduce == "mean":
            deg = (indptr[1:] - indptr[:-1]).clamp(min=1).to(msg.dtype)
            out = out / deg.unsqueeze(-1)
        return out, None
    ext = msg.detach().new_zeros(num_dst, width).scatter_reduce(
        0, d_id.unsqueeze(-1).expand(-1, width), msg.detach(),
        "amax" if reduce == "max" else "amin", include_self=False,
    )
    # first edge attaining the extreme: smallest CSC position among the ties
    pos = torch.arange(num_edges, device=msg.device).unsqueeze(-1).expand(-1, width)
    hit = msg.detach() == ext.index_select(0, d_id)
    cand = torch.where(hit, pos, torch.full_like(pos, num_edges))
    arg = torch.full((num_dst, width), num_edges, dtype=torch.int64, device=msg.device)
    arg = arg.scatter_reduce(0, d_id.unsqueeze(-1).expand(-1, width), cand, "amin")
    has = arg < num_edges
    safe = torch.where(has, arg, torch.zeros_like(arg))
    picked = msg.gather(0, safe) if num_edges else msg.new_zeros(num_dst, width)
    out = torch.where(has, picked, torch.zeros_like(picked))
    return out, torch.where(has, arg, torch.full_like(arg, -1))


@register("fused_edge_fwd", "ref")
def fused_edge_fwd(
    indptr: torch.Tensor, indices: torch.Tensor, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forward: ``(out [num_dst, F], arg [num_dst, F] int64 for max/min else None)``."""
    msg, d_id = _messages(indptr, indices, call, src, dst, edge)
    return _reduce(indptr, d_id, msg, call.reduce)


@register("fused_edge_fwd_partials", "ref")
def fused_edge_fwd_partials(
    indptr: torch.Tensor, indices: torch.Tensor, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
    partials: tuple[int, ...],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Sum/mean forward and ``K_i[v, f] = d out[v, f] / d dst_i[v, f]`` for ``i`` in ``partials``.

    By autograd, not by derivative expressions: column ``f`` of the expression reads
    column ``f`` of a full-width term, and ``dst_i[v]`` reaches no output row but
    ``out[v]``, so the gradient of ``out.sum()`` with respect to ``dst_i`` is ``K_i``.
    """
    with torch.enable_grad():
        leaves_ = [t.detach().requires_grad_(i in partials) for i, t in enumerate(dst)]
        msg, d_id = _messages(indptr, indices, call, [t.detach() for t in src], leaves_,
                              [t.detach() for t in edge])
        out, _ = _reduce(indptr, d_id, msg, call.reduce)
        wanted = [leaves_[i] for i in partials]
        ks = (torch.autograd.grad(out, wanted, torch.ones_like(out), allow_unused=True)
              if out.requires_grad else [None] * len(wanted))
    return out.detach(), [torch.zeros_like(t) if k is None else k for t, k in zip(wanted, ks)]


@register("fused_edge_partials_pay", "ref")
def fused_edge_partials_pay(indptr: torch.Tensor, call: FusedEdgeCall) -> bool:
    """Always: the reference runs both routes' math wherever they apply."""
    return True


@register("fused_edge_bwd", "ref")
def fused_edge_bwd(
    indptr: torch.Tensor, indices: torch.Tensor, get_rev: Callable, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
    aux: torch.Tensor | None, grad_out: torch.Tensor,
    need: tuple[tuple[bool, ...], tuple[bool, ...], tuple[bool, ...]],
) -> tuple[list, list, list]:
    """Backward by torch autograd through the reference forward.

    Returns:
        ``(src_grads, dst_grads, edge_grads)``, each a list with a tensor of the
        term's shape where ``need`` says so and ``None`` elsewhere.
    """
    del get_rev, aux  # autograd needs neither the reverse graph nor the saved argmax
    groups = [list(src), list(dst), list(edge)]
    with torch.enable_grad():
        leaves_ = [
            [t.detach().requires_grad_(n) for t, n in zip(ts, ns)] for ts, ns in zip(groups, need)
        ]
        msg, d_id = _messages(indptr, indices, call, *leaves_)
        out, _ = _reduce(indptr, d_id, msg, call.reduce)
        return _term_grads(leaves_, [out], [grad_out])


def _term_grads(leaves_: list[list[torch.Tensor]], outs: list[torch.Tensor],
                grad_outs: list[torch.Tensor]) -> tuple[list, list, list]:
    """``(src, dst, edge)`` gradients of the leaves that require grad (zeros where an
    output does not reach one), ``None`` for the others, by autograd from ``outs``."""
    pairs = [(o, g) for o, g in zip(outs, grad_outs) if o.requires_grad]
    wanted = [t for ts in leaves_ for t in ts if t.requires_grad]
    grads = (
        torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                            allow_unused=True)
        if wanted and pairs else [None] * len(wanted)
    )
    it = iter(grads)
    result: list[list] = []
    for ts in leaves_:
        row = []
        for t in ts:
            if not t.requires_grad:
                row.append(None)
                continue
            gr = next(it)
            row.append(torch.zeros_like(t) if gr is None else gr)
        result.append(row)
    return result[0], result[1], result[2]


def _multi_reduce(indptr, d_id, msgs, call: FusedEdgeCall) -> tuple[list, list]:
    outs, args = [], []
    for msg, (_, r) in zip(msgs, call.outputs):
        out, arg = _reduce(indptr, d_id, msg, r)
        outs.append(out)
        if arg is not None:
            args.append(arg)
    return outs, args


@register("fused_edge_multi_fwd", "ref")
def fused_edge_multi_fwd(
    indptr: torch.Tensor, indices: torch.Tensor, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Forward of several outputs: ``([out_j], [arg_j of each max/min output])``."""
    msgs, d_id = _all_messages(indptr, indices, call, src, dst, edge)
    return _multi_reduce(indptr, d_id, msgs, call)


@register("fused_edge_multi_bwd", "ref")
def fused_edge_multi_bwd(
    indptr: torch.Tensor, indices: torch.Tensor, get_rev: Callable, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
    args: list[torch.Tensor], grad_outs: list[torch.Tensor],
    need: tuple[tuple[bool, ...], tuple[bool, ...], tuple[bool, ...]],
) -> tuple[list, list, list]:
    """Backward of several outputs by torch autograd through the reference forward."""
    del get_rev, args
    groups = [list(src), list(dst), list(edge)]
    with torch.enable_grad():
        leaves_ = [
            [t.detach().requires_grad_(n) for t, n in zip(ts, ns)] for ts, ns in zip(groups, need)
        ]
        msgs, d_id = _all_messages(indptr, indices, call, *leaves_)
        outs, _ = _multi_reduce(indptr, d_id, msgs, call)
        return _term_grads(leaves_, outs, grad_outs)
