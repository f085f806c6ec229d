"""Reorder: transform-then-propagate or propagate-then-transform for a linear on ``acc``.

When Gather is linear (sum/mean), ApplyEdge is linear in one source term (a copy,
or the term scaled by a per-edge scalar that broadcasts over the feature dim), and
ApplyVertex applies a Linear to ``acc`` (and reads ``acc`` nowhere else), then

    gather_e(w_e * x_src) @ W.T + b  ==  gather_e(w_e * (x @ W.T)_src) + b

The pass moves ``x @ W.T`` to the vertex side when ``out_features < in_features``
(the propagation runs on the narrower width; the bias is added after), and leaves
the program as written otherwise. GCN's ``lin(acc)`` is the example.

The Linear may also read ``c * x + acc`` (or ``x + acc``) with ``x`` the propagated
vertex term and ``c`` a parameter scalar: GIN's ``mlp((1 + eps) * x + acc)``. By
linearity that is ``c * (x @ W.T) + gather(x @ W.T) + b``: the vertex stage gets its
own Linear of ``x`` (the same weight, which the plan computes once with the
propagated term's).
"""

from __future__ import annotations

import math
from typing import Any

from ngra.compiler.ir import (
    ELEMENTWISE,
    Node,
    Op,
    Program,
    Ref,
    format_key,
    format_node,
    map_refs,
    remap_args,
)
from ngra.compiler.passes import PassNote
from ngra.compiler.patterns import factor_layout, linear_gather_message, peel_scale

__all__ = ["run"]


def _skip(summary: str) -> PassNote:
    return PassNote("reorder", False, summary)


def run(program: Program) -> PassNote:
    out = linear_gather_message(program)
    if isinstance(out, str):
        return _skip(out)
    vertex = program.vertex
    if vertex is None:
        return _skip("apply_vertex could not be traced")
    edge = program.edge
    core_id, factors = peel_scale(edge, out.id)
    core = edge.nodes[core_id]
    expr = format_node(edge, out.id)
    if core.op != Op.SRC:
        return _skip(f"apply_edge is not a copy or scalar multiple of a source term: {expr}")
    if core.shape is None or len(core.shape) < 2:
        return _skip("the propagated term has no feature dim")
    layout = factor_layout(edge, core, factors)
    if isinstance(layout, str) or layout >= len(core.shape) - 1:
        why = layout if isinstance(layout, str) else "the factor varies along the feature dim"
        return _skip(f"apply_edge is not linear in edge.src with a scalar weight ({why}): {expr}")
    if edge.nodes[out.id].shape != core.shape:
        return _skip("the edge factor changes the message shape")
    accs = [n for n in vertex.nodes.values() if n.op == Op.ACC]
    if len(accs) != 1:
        return _skip("apply_vertex does not read acc exactly once")
    acc = accs[0]
    users = vertex.users()
    lin, self_term = _linear_of_acc(program, acc, users, core.attrs["key"])
    if lin is None:
        used = ", ".join(sorted({vertex.nodes[u].op.value for u in users[acc.id]})) or "nothing"
        return _skip("apply_vertex does not start with a Linear applied to acc or to "
                     f"c * x + acc (acc is used by {used})")
    if "vertex" in program.as_written:
        return _skip(program.as_written["vertex"])
    weight = vertex.nodes[lin.args[1]]
    if weight.op != Op.PARAM or weight.shape is None or len(weight.shape) != 2:
        return _skip("the Linear's weight is not a layer parameter")
    f_out, f_in = weight.shape
    name = lin.attrs["module"] or "linear"
    if f_in != core.shape[-1]:
        return _skip(f"{name} expects width {f_in}, acc has {core.shape[-1]}")
    if f_out >= f_in:
        return PassNote("reorder", False,
                        f"propagate-then-transform: {name} maps {f_in} -> {f_out} features; "
                        f"propagating the input width {f_in} is no wider")
    key = core.attrs["key"]
    new_key = _transform_first(program, core, lin, weight, self_term)
    return PassNote(
        "reorder", True,
        f"transform-then-propagate: {name} ({f_in} -> {f_out}) applied per vertex before "
        f"propagation; propagating width {f_out} instead of {f_in}"
        + ("; the self term x takes the same transform" if self_term else "")
        + ("; bias added after" if len(lin.args) == 3 else ""),
        [f"{format_key(new_key)} = {name}.weight applied to {format_key(key)} "
         f"[N, {f_out}]"],
    )


def _linear_of_acc(program: Program, acc: Node, users: dict[int, list[int]],
                   key: object) -> tuple[Node | None, tuple[int, int | None] | None]:
    """``(lin, None)`` for ``lin(acc)``; ``(lin, (x node, c node or None))`` for
    ``lin(c * x + acc)`` / ``lin(x + acc)`` where ``x`` is the vertex term the edge
    stage propagates (``key``) and ``c`` a parameter scalar; ``(None, None)`` otherwise."""
    vertex = program.vertex
    assert vertex is not None
    outputs = set(vertex.output_ids())

    def sole_user(nid: int, op: Op) -> Node | None:
        us = users[nid]
        n = vertex.nodes[us[0]] if len(us) == 1 and nid not in outputs else None
        return n if n is not None and n.op == op and n.args.count(nid) == 1 else None

    lin = sole_user(acc.id, Op.LINEAR)
    if lin is not None:
        return (lin, None) if lin.args[0] == acc.id else (None, None)
    add = sole_user(acc.id, Op.ADD)
    lin = None if add is None else sole_user(add.id, Op.LINEAR)
    if lin is None or lin.args[0] != add.id:
        return None, None
    other = vertex.nodes[add.args[1] if add.args[0] == acc.id else add.args[0]]
    src = program.pre.nodes[program.pre.outputs[key].id]
    if src.op != Op.VERTEX:
        return None, None

    def is_x(n: Node) -> bool:
        return n.op == Op.VERTEX and n.attrs["key"] == src.attrs["key"]

    if is_x(other):
        return lin, (other.id, None)
    if other.op != Op.MUL or len(users[other.id]) != 1:
        return None, None
    a, b = (vertex.nodes[i] for i in other.args)
    x, c = (a, b) if is_x(a) else (b, a) if is_x(b) else (None, None)
    if x is None or not _parameter_scalar(vertex, c):
        return None, None
    return lin, (x.id, c.id)


def _parameter_scalar(stage: Any, n: Node) -> bool:
    """``n`` is one number made from parameters and constants alone."""
    if n.op == Op.CONST:
        return isinstance(n.attrs["value"], (int, float))
    if n.shape is None or math.prod(n.shape) != 1:
        return False
    return all(stage.nodes[i].op in (Op.PARAM, Op.CONST) or stage.nodes[i].op in ELEMENTWISE
               for i in stage.ancestors([n.id]))


def _transform_first(program: Program, core: Node, lin: Node, weight: Node,
                     self_term: tuple[int, int | None] | None = None) -> tuple:
    pre, edge, vertex = program.pre, program.edge, program.vertex
    assert vertex is not None
    src = pre.outputs[core.attrs["key"]].id
    w = program.new_id()
    pre.add(Node(w, Op.PARAM, (), dict(weight.attrs), name=weight.name))
    t = program.new_id()
    pre.add(Node(t, Op.LINEAR, (src, w), {"module": None}, name=f"{lin.name}_pre"))
    key = ("t", sum(1 for k in pre.outputs if k[0] == "t"))
    pre.outputs[key] = Ref(t)
    program.terms[key] = {"origin": "reorder", "side": "src",
                          "expr": f"{format_node(pre, src)} @ {weight.attrs['path']}.T",
                          "rest": (weight.shape[0],)}
    # the edge stage now reads the transformed term
    core.attrs = {"key": key}
    if self_term is not None:  # lin(c * x + acc) -> c * lin(x) + acc, + bias below
        _transform_self_term(program, lin, weight, *self_term)
    # apply_vertex: lin(acc) -> acc (+ bias)
    if len(lin.args) == 3:
        lin.op, lin.args, lin.attrs = Op.ADD, (lin.args[0], lin.args[2]), {}
    else:
        repl = lin.args[0]
        vertex.nodes.pop(lin.id)
        for n in vertex.nodes.values():
            remap_args(n, {lin.id: repl})
        vertex.outputs = map_refs(vertex.outputs, lambda r: Ref(repl) if r.id == lin.id else r)
    vertex.prune()
    edge.prune()
    program.vertex_rewritten = True
    return key


def _transform_self_term(program: Program, lin: Node, weight: Node, x_id: int,
                         c_id: int | None) -> None:
    """In ``lin(c * x + acc)``, ``x`` becomes ``x @ W.T`` (a Linear of the vertex stage,
    placed before the add so the stage stays in topological order)."""
    vertex = program.vertex
    assert vertex is not None
    x = vertex.nodes[x_id]
    add = vertex.nodes[lin.args[0]]
    scaled = next(i for i in add.args if vertex.nodes[i].op != Op.ACC)
    f_out = weight.shape[0]
    rows = None if x.shape is None else (x.shape[0], f_out)
    w = Node(program.new_id(), Op.PARAM, (), dict(weight.attrs), name=weight.name,
             shape=weight.shape, dtype=weight.dtype)
    xw = Node(program.new_id(), Op.LINEAR, (x_id, w.id), {"module": None},
              name=f"{lin.name}_self", shape=rows, dtype=x.dtype, deps=x.deps, rowwise=True)
    new = [w, xw]
    if c_id is not None:
        c = vertex.nodes[c_id]
        new.append(Node(program.new_id(), Op.MUL, (c_id, xw.id), {}, name=f"{lin.name}_scaled",
                        shape=rows, dtype=x.dtype, deps=x.deps | c.deps, rowwise=True))
    add.args = tuple(new[-1].id if a == scaled else a for a in add.args)
    add.shape = rows
    nodes = {}
    for i, n in vertex.nodes.items():
        if i == add.id:
            nodes.update((m.id, m) for m in new)
        nodes[i] = n
    vertex.nodes = nodes
