"""Fuse: match ApplyEdge + Gather to one sparse kernel per message.

After hoisting, an edge stage reads per-vertex terms at each edge's ends. The
patterns, tried in order for each message of a sum/mean/max/min gather:

1. ``term[src]`` (copy), optionally times per-edge factors that do not read the
   source (``edge.data``, a dst-side scalar): **gspmm** (``copy_u``/``u_mul_e``).
   A factor must be one scalar per edge, per head (``[E, H]`` over ``[N, H, D]``),
   or given edge data of the full width.
2. ``term[src].gather(1, type.expand(-1, 1, F)).squeeze(1)`` (a per-type vertex
   term selected by an integer edge field; GG-NN, R-GCN), optionally scaled:
   **typed gspmm**: one gspmm over the ``N * T`` virtual sources ``u * T + type``.
3. an element-wise expression of terms, edge data and constants:
   **fused_edge_aggregate** (the expression is evaluated per edge inside the kernel;
   no ``[E, F]`` tensor is written). Under a per-field gather (``gather = {"m": "mean",
   "hi": "max", ...}``) the element-wise fields of one shape are matched again over shared
   leaf tables and run as one **fused_edge_aggregate_multi** walk, each field with its own
   reducer (``FusedEdgeMatch.group``, kind ``fused_edge_multi``).

A softmax gather whose score is ``leaky_relu(src_term + dst_term)`` (or without the
activation) and whose value is a source term runs as **softmax_aggregate**; when both
terms are ``rowdot(value, w)`` of that value (GAT after ``contract``) the match records
the weights, and whole-graph tiles run **attention_aggregate**. Any other softmax score
that is ``c * expr.sum(-1)`` (``c`` a constant, ``expr`` element-wise in source-side,
destination-side and parameter terms per head: GATv2's ``(leaky_relu(xs + xd) * att).sum(-1)``,
TransformerConv's ``(q[dst] * k[src]).sum(-1) / sqrt(d)``) with a source-term value runs
as **edge_score** (the ``[E, H]`` scores, no ``[E, H, D]`` tensor), **edge_softmax** and a
per-head **gspmm** of the value.
Anything else runs the (hoisted) edge stage through the interpreter, with the
reason recorded.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ngra.compiler.ir import ELEMENTWISE, Node, Op, Program, Stage, format_key, format_node
from ngra.compiler.passes import PassNote
from ngra.compiler.patterns import factor_layout, is_float, match_typed, peel_scale
from ngra.kernels.edge_expr import E

__all__ = ["run", "GspmmMatch", "SoftmaxMatch", "SoftmaxScoreMatch", "FusedEdgeMatch",
           "InterpMatch"]


@dataclass(frozen=True)
class GspmmMatch:
    """``gspmm(src term [* factors])``; ``typed`` for the per-type selection."""

    src: Any
    factors: tuple[tuple[int, bool], ...]
    edge_dims: int          # the factor product is [E, *feat[:edge_dims]]
    feat: tuple[int, ...]   # the selected source row's non-row shape
    out: tuple[int, ...]    # the message's non-row shape
    typed: dict | None = None
    kind: str = "gspmm"


@dataclass(frozen=True)
class SoftmaxMatch:
    """``softmax_aggregate(score_src, score_dst, value)``."""

    score_src: Any          # term key or None
    score_dst: Any
    value: Any
    slope: float
    heads: tuple[int, ...]  # the score's non-row shape
    dims: tuple[int, ...]   # the value's shape after the heads
    # pre node ids (w_src, w_dst) when both scores are rowdot(value, w) of the value
    # itself (GAT): then whole-graph tiles run attention_aggregate; else None
    weights: tuple[int, int] | None = None
    kind: str = "softmax_aggregate"


@dataclass(frozen=True)
class FusedEdgeMatch:
    """``fused_edge_aggregate(expr, src terms, dst terms, edge terms)``.

    Leaves are ``(key or node id, layout)`` with layout ``full`` (``[rows, *S]``),
    ``ones`` (``[rows, 1...]``) or ``expand`` (broadcast on the vertex side).
    ``dst`` leaves are ``("term", key, layout)`` or ``("param", node id, layout)``.
    """

    expr: Any
    src: tuple[tuple[Any, str], ...]
    dst: tuple[tuple[str, Any, str], ...]
    edge: tuple[tuple[int, str], ...]
    out: tuple[int, ...]
    kind: str = "fused_edge"
    # a per-field gather: the fields (this one among them) whose expressions read the
    # same leaves and run as one fused_edge_aggregate_multi walk; () alone
    group: tuple[str, ...] = ()


@dataclass(frozen=True)
class SoftmaxScoreMatch:
    """``gspmm(value, edge_softmax(edge_score(score.expr) * scale))``: a softmax whose score
    is ``scale * expr.sum(-1)``, ``expr`` element-wise per head (``score``: its leaves and
    expression, ``score.out`` = heads + ``(D,)``), and whose value is a source term."""

    score: FusedEdgeMatch
    scale: float
    value: Any
    heads: tuple[int, ...]  # the score's non-row shape
    dims: tuple[int, ...]   # the value's shape after the heads
    kind: str = "softmax_score"


@dataclass(frozen=True)
class InterpMatch:
    """No kernel: the edge stage runs through the interpreter."""

    reason: str
    kind: str = "interp"


def run(program: Program) -> PassNote:
    edge = program.edge
    out = edge.outputs
    if program.gather == "softmax":
        matches = {None: _score_weights(program, _match_softmax(edge, out[0].id, out[1].id))}
    elif isinstance(out, dict) and isinstance(program.gather, dict):
        matches = _match_fields(edge, out, program.gather)
    elif isinstance(out, dict):
        matches = {k: _match_message(edge, r.id, program.gather) for k, r in out.items()}
    else:
        matches = {None: _match_message(edge, out.id, program.gather)}
    program.lowering = matches
    details = []
    for key, m in matches.items():
        who = "message" if key is None else f"message {key!r}"
        details.append(f"{who}: {describe_match(program, m)}")
    fired = [m for m in matches.values() if not isinstance(m, InterpMatch)]
    if not fired:
        return PassNote("fuse", False, "no kernel pattern matched", details)
    kinds = ", ".join(sorted({m.kind for m in fired}))
    gather = program.gather if isinstance(program.gather, str) else "per-field gather"
    return PassNote("fuse", True, f"ApplyEdge + {gather} -> {kinds}", details)


def describe_match(program: Program, m: Any) -> str:
    edge = program.edge
    if isinstance(m, InterpMatch):
        return f"not fused: {m.reason}"
    if isinstance(m, GspmmMatch):
        what = "u_mul_e" if m.factors else "copy_u"
        src = format_key(m.src)
        if m.typed:
            return (f"typed gspmm ({what}): {src} [N, {m.typed['types']}, {m.typed['width']}] "
                    f"seen as [N*{m.typed['types']}, {m.typed['width']}], source u*T + "
                    f"{format_node(edge, m.typed['type_node'])}")
        fs = " * ".join(("1/" if r else "") + format_node(edge, f) for f, r in m.factors)
        return f"gspmm ({what}): {src}[src]" + (f" * {fs}" if fs else "")
    if isinstance(m, SoftmaxMatch):
        s = " + ".join(f"{format_key(k)}[{side}]" for k, side in
                       ((m.score_src, "src"), (m.score_dst, "dst")) if k is not None)
        text = (f"softmax_aggregate: score leaky_relu({s}, {m.slope:g}), value "
                f"{format_key(m.value)}[src], heads {list(m.heads) or [1]}")
        if m.weights is not None:
            text += (f"; both scores are rowdot({format_key(m.value)}, w): on the whole graph "
                     "attention_aggregate (one backward for scores and value, whose gradient "
                     "may overwrite the value)")
        return text
    if isinstance(m, SoftmaxScoreMatch):
        scale = "" if m.scale == 1.0 else f"{m.scale:g} * "
        return (f"edge_score + edge_softmax + gspmm: score {scale}sum_d {m.score.expr} per "
                f"head {list(m.heads) or [1]}, value {format_key(m.value)}[src] "
                "(no [E, H, D] tensor)")
    if isinstance(m, FusedEdgeMatch) and m.group:
        return (f"fused_edge_aggregate_multi: {m.expr}, one walk for fields "
                f"{', '.join(map(repr, m.group))} (no [E, F] tensor)")
    if isinstance(m, FusedEdgeMatch):
        return f"fused_edge_aggregate: {m.expr} (no [E, F] tensor)"
    return str(m)


def _match_fields(edge: Stage, out: dict, gather: dict) -> dict:
    """A per-field gather's matches: each field as its own message, then the element-wise
    fields of one message shape matched again over shared leaf tables, so that they run as
    one ``fused_edge_aggregate_multi`` walk (:attr:`FusedEdgeMatch.group`)."""
    if set(out) != set(gather):
        # the accumulator says what is wrong when the layer runs (generic plan)
        return {k: InterpMatch(f"gather names fields {list(gather)}, apply_edge returns "
                               f"{list(out)}") for k in out}
    matches = {k: _match_message(edge, r.id, gather[k]) for k, r in out.items()}
    by_shape: dict[tuple, list] = {}
    for k, m in matches.items():
        if isinstance(m, FusedEdgeMatch):
            by_shape.setdefault(m.out, []).append(k)
    for keys in by_shape.values():
        if len(keys) < 2:
            continue
        tables: tuple[dict, dict, dict] = ({}, {}, {})
        shared = {k: _match_elementwise(edge, edge.nodes[out[k].id], gather[k], tables)
                  for k in keys}
        if not all(isinstance(m, FusedEdgeMatch) for m in shared.values()):
            continue  # pragma: no cover - each matched alone, so each matches again
        full = _leaf_tables(*tables)
        for k in keys:
            matches[k] = dataclasses.replace(shared[k], src=full[0], dst=full[1], edge=full[2],
                                             group=tuple(keys), kind="fused_edge_multi")
    return matches


# ---------------------------------------------------------------------------- sum/mean/max/min
def _match_message(edge: Stage, nid: int, gather: str = "sum") -> Any:
    msg = edge.nodes[nid]
    expr = format_node(edge, nid)
    if msg.shape is None or len(msg.shape) < 1:
        return InterpMatch(f"the message's shape is unknown: {expr}")
    if not is_float(msg.dtype):
        return InterpMatch(f"the message is {msg.dtype}, not float32/float64")
    core_id, factors = peel_scale(edge, nid)
    core = edge.nodes[core_id]
    reasons = []
    if core.op == Op.SRC and core.shape is not None and len(core.shape) >= 2:
        layout = factor_layout(edge, core, factors)
        if isinstance(layout, int):
            rest = tuple(core.shape[1:])
            cheap = layout < len(rest) or all(edge.nodes[f].deps <= {"edge"} for f, _ in factors)
            if not factors or cheap:
                return GspmmMatch(core.attrs["key"], tuple(factors), layout, rest,
                                  tuple(msg.shape[1:]))
        else:
            reasons.append(layout)
    typed = match_typed(edge, core_id)
    if typed is not None:
        layout = factor_layout(edge, core, factors)
        if isinstance(layout, int):
            return GspmmMatch(typed["src"], tuple(factors), layout, (typed["width"],),
                              tuple(msg.shape[1:]), typed, kind="gspmm_typed")
        reasons.append(layout)
    fused = _match_elementwise(edge, msg, gather)
    if isinstance(fused, FusedEdgeMatch):
        return fused
    return InterpMatch(fused if not reasons else f"{fused}; {reasons[0]}")


def _leaf_layout(n: Node, rest: tuple[int, ...], rowdep: bool) -> str | None:
    if n.shape is None:
        return None
    shp = tuple(n.shape)
    rank = len(rest)
    if rowdep:
        if len(shp) != rank + 1:
            return None
        shp = shp[1:]
    else:
        if len(shp) == rank + 1:
            if shp[0] != 1:
                return None
            shp = shp[1:]
        if len(shp) > rank:
            return None
        shp = (1,) * (rank - len(shp)) + shp
    if all(d == 1 for d in shp):
        return "ones"
    if shp == rest:
        return "full"
    if all(d in (1, s) for d, s in zip(shp, rest)):
        return "expand"
    return None


def _match_elementwise(edge: Stage, msg: Node, gather: str = "sum",
                       tables: tuple[dict, dict, dict] | None = None) -> Any:
    """An :class:`FusedEdgeMatch`, or the reason (a string) the message is not element-wise.

    ``tables``: ``(src, dst, edge)`` leaf tables shared with other messages (the leaves
    they number are added to), so that their expressions index the same term lists."""
    rest = tuple(msg.shape[1:])
    expr_text = format_node(edge, msg.id)
    src: dict[Any, tuple[int, str]]
    dst: dict[tuple, tuple[int, str]]
    ekeys: dict[int, tuple[int, str]]
    src, dst, ekeys = tables if tables is not None else ({}, {}, {})
    memo: dict[int, Any] = {}

    def fail(n: Node, why: str) -> str:
        return f"{why}: {expr_text}"

    def walk(i: int) -> Any:
        if i in memo:
            return memo[i]
        n = edge.nodes[i]
        if n.dtype is not None and n.dtype not in (int, float) and n.dtype != msg.dtype:
            return fail(n, f"{format_node(edge, i)} has dtype {n.dtype}, the message {msg.dtype}")
        res: Any
        if n.op in (Op.SRC, Op.DST):
            lay = _leaf_layout(n, rest, True)
            if lay is None:
                return fail(n, f"{format_node(edge, i)} does not broadcast to the message shape")
            table = src if n.op == Op.SRC else dst
            k = n.attrs["key"] if n.op == Op.SRC else ("term", n.attrs["key"])
            table.setdefault(k, (len(table), lay))
            res = (E.src if n.op == Op.SRC else E.dst)(table[k][0])
        elif n.op == Op.CONST and isinstance(n.attrs["value"], (int, float)) \
                and not isinstance(n.attrs["value"], bool) and math.isfinite(n.attrs["value"]):
            res = E.const(float(n.attrs["value"]))
        elif not n.deps:
            lay = _leaf_layout(n, rest, False)
            if lay is None:
                return fail(n, f"constant {format_node(edge, i)} does not broadcast to the message")
            dst.setdefault(("param", i), (len(dst), lay))
            res = E.dst(dst[("param", i)][0])
        elif n.op in ELEMENTWISE:
            # element-wise work on edge data stays in the kernel too: ``edge.data * w``
            # reads one scalar per edge instead of a precomputed [E, F] term
            args = [walk(a) for a in n.args]
            bad = next((a for a in args if isinstance(a, str)), None)
            if bad is not None:
                return bad
            res = _build(E, n, args)
        elif n.deps <= {"edge"}:
            lay = _leaf_layout(n, rest, True) if n.rowwise else None
            if lay not in ("full", "ones"):
                return fail(n, f"edge term {format_node(edge, i)} does not match the message shape")
            ekeys.setdefault(i, (len(ekeys), lay))
            res = E.edge(ekeys[i][0])
        else:
            return _not_elementwise(edge, n, expr_text, gather, n.id == msg.id)
        memo[i] = res
        return res

    root = walk(msg.id)
    if isinstance(root, str):
        return root
    return FusedEdgeMatch(root, *_leaf_tables(src, dst, ekeys), rest)


def _leaf_tables(src: dict, dst: dict, ekeys: dict) -> tuple[tuple, tuple, tuple]:
    """A match's ``(src, dst, edge)`` leaves from the tables that numbered them."""
    return (
        tuple((k, lay) for k, (_, lay) in sorted(src.items(), key=lambda kv: kv[1][0])),
        tuple((k[0], k[1], lay) for k, (_, lay) in sorted(dst.items(), key=lambda kv: kv[1][0])),
        tuple((i, lay) for i, (_, lay) in sorted(ekeys.items(), key=lambda kv: kv[1][0])),
    )


def _build(E: Any, n: Node, args: list[Any]) -> Any:
    op = n.op
    if op == Op.ADD:
        return E.add(*args)
    if op == Op.SUB:
        return E.sub(*args)
    if op == Op.MUL:
        return E.mul(*args)
    if op == Op.DIV:
        return E.div(*args)
    if op == Op.NEG:
        return E.neg(args[0])
    if op == Op.LEAKY_RELU:
        return E.leaky_relu(args[0], float(n.attrs["slope"]))
    return {Op.SIGMOID: E.sigmoid, Op.TANH: E.tanh, Op.RELU: E.relu, Op.EXP: E.exp,
            Op.LOG: E.log}[op](args[0])


def _not_elementwise(edge: Stage, n: Node, expr_text: str, gather: str = "sum",
                     last: bool = False) -> str:
    """Why the message is not element-wise (the op that blocks fusion, the inputs it
    reads) and the rewrite that would fuse it."""
    names = [f"edge.{d}" if d != "edge" else "edge.data"
             for d in ("src", "dst", "edge") if d in n.deps]
    reads = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    if n.op == Op.OPAQUE:
        t = n.attrs["target"]
        name = t if isinstance(t, str) else getattr(t, "__name__", repr(t))
        what = f"an opaque call ({name})"
    else:
        what = f"a non-element-wise op ({n.op.value})"
    return (f"apply_edge reads {reads} inside {what}: {expr_text}; "
            f"rewrite: {rewrite_hint(edge, n, gather, last)}")


def rewrite_hint(edge: Stage, n: Node, gather: str, last: bool = False) -> str:
    """The rewrite that would let the edge stage fuse, for the op ``n`` that blocks it."""
    both = "src" in n.deps and "dst" in n.deps
    if n.op == Op.LINEAR:
        if last and gather in ("max", "min"):
            return (f"a Linear does not commute with {gather}: end apply_edge at the element-wise "
                    "part (one Linear + activation fuses) and apply the Linear in apply_vertex, "
                    "or gather with sum/mean, after which a final Linear is moved past the gather")
        if both:
            return ("its input reads both ends per edge: write it as a sum or cat of src-only "
                    "and dst-only parts (each Linear is then computed once per vertex), or move "
                    "the Linear to apply_vertex")
        return "compute the Linear on the vertex side (from one endpoint) or in apply_vertex"
    if n.op == Op.OPAQUE:
        return ("express the call with element-wise torch ops (+ - * /, sigmoid, tanh, relu, "
                "leaky_relu, exp, log), or compute it on the vertex side from one endpoint")
    if n.op in (Op.SUM, Op.MEAN, Op.ROWDOT):
        return ("a reduction over features per edge fuses only as a softmax score "
                "c * expr.sum(-1); elsewhere reduce on the vertex side before the edge stage")
    if n.op == Op.CAT:
        return ("feed the concatenation to a Linear (split per block and hoisted) or return "
                "the parts as a dict of messages")
    if n.op in (Op.GATHER, Op.INDEX_SELECT):
        return ("select a per-type vertex term with term[src].gather(1, type.expand(-1, 1, F))"
                ".squeeze(1), the typed g-SpMM pattern")
    return "keep apply_edge to element-wise ops of vertex-side terms, edge data and constants"


# ---------------------------------------------------------------------------- softmax
def _score_weights(program: Program, m: Any) -> Any:
    """``m`` with ``weights`` set when both scores are ``rowdot(value, w)`` of the value
    term itself, contracting its last dim over one head dim (``[N, H, D]``)."""
    if not isinstance(m, SoftmaxMatch) or m.score_src is None or m.score_dst is None:
        return m
    if len(m.heads) > 1 or len(m.dims) != 1:
        return m
    pre = program.pre
    terms = pre.outputs
    value = terms[m.value].id
    weights = []
    for key in (m.score_src, m.score_dst):
        n = pre.nodes[terms[key].id]
        if n.op != Op.ROWDOT or n.args[0] != value:
            return m
        weights.append(n.args[1])
    return dataclasses.replace(m, weights=(weights[0], weights[1]))


def _match_softmax(edge: Stage, score_id: int, value_id: int) -> Any:
    s, v = edge.nodes[score_id], edge.nodes[value_id]
    text = f"score {format_node(edge, score_id)}, value {format_node(edge, value_id)}"
    if v.op != Op.SRC:
        return InterpMatch(f"the softmax value is not a source-side term ({text})")
    if s.shape is None or v.shape is None or not is_float(s.dtype) or s.dtype != v.dtype:
        return InterpMatch(f"score/value shapes or dtypes unknown or mixed ({text})")
    heads = tuple(s.shape[1:])
    if tuple(v.shape[1:1 + len(heads)]) != heads:
        return InterpMatch(f"score {list(s.shape[1:])} does not lead value {list(v.shape[1:])}")
    inner, slope = s, 1.0
    if s.op == Op.LEAKY_RELU:
        inner, slope = edge.nodes[s.args[0]], float(s.attrs["slope"])
    elif s.op == Op.RELU:
        inner, slope = edge.nodes[s.args[0]], 0.0
    parts = [edge.nodes[a] for a in inner.args] if inner.op == Op.ADD else [inner]
    sides: dict[str, Any] = {}
    for p in parts:
        side = {Op.SRC: "src", Op.DST: "dst"}.get(p.op)
        if side is None or side in sides or p.shape != s.shape:
            return _match_score(edge, s, v, heads, text)
        sides[side] = p.attrs["key"]
    return SoftmaxMatch(sides.get("src"), sides.get("dst"), v.attrs["key"], slope, heads,
                        tuple(v.shape[1 + len(heads):]))


def _const_number(n: Node) -> float | None:
    v = n.attrs.get("value") if n.op == Op.CONST else None
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _match_score(edge: Stage, s: Node, v: Node, heads: tuple[int, ...], text: str) -> Any:
    """A :class:`SoftmaxScoreMatch` when the score is ``c * expr.sum(-1)`` with ``expr``
    element-wise per head in vertex-side and parameter terms; else the reason."""
    simple = "the softmax score is neither leaky_relu(src-side term + dst-side term) nor"
    scale = 1.0
    while s.op in (Op.MUL, Op.DIV):
        a, b = (edge.nodes[i] for i in s.args)
        cb, ca = _const_number(b), (_const_number(a) if s.op == Op.MUL else None)
        if cb is not None and (s.op == Op.MUL or cb != 0.0):
            scale, s = (scale * cb if s.op == Op.MUL else scale / cb), a
        elif ca is not None:
            scale, s = scale * ca, b
        else:
            break
    dims = s.attrs.get("dim") if s.op == Op.SUM else None
    dims = dims if isinstance(dims, tuple) else (dims,)
    inner = edge.nodes[s.args[0]] if s.op == Op.SUM else None
    if (inner is None or s.attrs["keepdim"] or inner.shape is None or len(dims) != 1
            or dims[0] not in (-1, len(inner.shape) - 1)):
        return InterpMatch(f"{simple} c * expr.sum(-1) over the feature dim of each head; "
                           f"rewrite the score as one of these to fuse ({text})")
    if len(heads) > 1 or tuple(inner.shape[1:-1]) != heads:
        return InterpMatch(f"the summed score expression {list(inner.shape[1:])} is not "
                           f"[heads, D] for score heads {list(heads)} ({text})")
    fm = _match_elementwise(edge, inner)
    if isinstance(fm, str):
        return InterpMatch(f"{simple} c * expr.sum(-1) with expr element-wise: {fm}")
    if fm.edge:
        return InterpMatch(f"the score expression reads edge data, which edge_score does not "
                           f"take; add it to a vertex-side term to fuse ({text})")
    if all(lay == "ones" for _, lay in fm.src) and all(lay == "ones" for *_, lay in fm.dst):
        return InterpMatch(f"the score expression has no term of the full [heads, D] width "
                           f"({text})")
    return SoftmaxScoreMatch(fm, scale, v.attrs["key"], heads,
                             tuple(v.shape[1 + len(heads):]))
