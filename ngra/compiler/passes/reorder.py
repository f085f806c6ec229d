"""Reorder: transform-then-propagate or propagate-then-transform for a linear on ``acc``.

When Gather is linear (sum/mean), ApplyEdge is linear in one source term (a copy,
or the term scaled by a per-edge scalar that broadcasts over the feature dim), and
ApplyVertex applies a Linear to ``acc`` (and reads ``acc`` nowhere else), then

    gather_e(w_e * x_src) @ W.T + b  ==  gather_e(w_e * (x @ W.T)_src) + b

The pass moves ``x @ W.T`` to the vertex side when ``out_features < in_features``
(the propagation runs on the narrower width; the bias is added after), and leaves
the program as written otherwise. GCN's ``lin(acc)`` is the example.
"""

from __future__ import annotations

from ngra.compiler.ir import Node, Op, Program, Ref, format_key, format_node, map_refs, remap_args
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
    users = vertex.users()[acc.id]
    lin = vertex.nodes[users[0]] if len(users) == 1 else None
    if lin is None or lin.op != Op.LINEAR or lin.args[0] != acc.id or acc.id in lin.args[1:] \
            or acc.id in vertex.output_ids():
        used = ", ".join(sorted({vertex.nodes[u].op.value for u in users})) or "nothing"
        return _skip("apply_vertex does not start with a Linear applied to acc "
                     f"(acc is used by {used})")
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
    new_key = _transform_first(program, core, lin, weight)
    return PassNote(
        "reorder", True,
        f"transform-then-propagate: {name} ({f_in} -> {f_out}) applied per vertex before "
        f"propagation; propagating width {f_out} instead of {f_in}"
        + ("; bias added after" if len(lin.args) == 3 else ""),
        [f"{format_key(new_key)} = {name}.weight applied to {format_key(key)} "
         f"[N, {f_out}]"],
    )


def _transform_first(program: Program, core: Node, lin: Node, weight: Node) -> tuple:
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
