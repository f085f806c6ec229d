"""Sink: a Linear that ends ApplyEdge moves after a linear Gather (propagate, then transform).

When Gather is ``sum`` or ``mean`` and the message is ``m_e @ W.T + b``,

    sum_e (m_e @ W.T + b)  == (sum_e m_e) @ W.T + deg_v * b
    mean_e (m_e @ W.T + b) == (mean_e m_e) @ W.T + [deg_v > 0] * b

so the product runs once per vertex instead of once per edge (``E x f_in x f_out``
multiply-adds become ``N x f_in x f_out``), and the messages are the Linear's input.
The transform is applied to the accumulator before ApplyVertex (``CompiledPlan.post``),
so ApplyVertex sees what it saw before. An MPNN edge network's second layer is the
example: with its first layer split and hoisted, what stays per edge is
``relu(t0[src] + t1[dst] + mlp.0[:, 2F:](edge.data))``, an element-wise expression the
fuse pass lowers to one fused edge kernel.

The pass always fires when it applies: the messages become ``f_in`` wide instead of
``f_out``, and a gather moves ``E x f`` values, far fewer operations than the
``E x f_in x f_out`` product it removes.
"""

from __future__ import annotations

from ngra.compiler.ir import Op, Program, Ref, format_node
from ngra.compiler.passes import PassNote
from ngra.compiler.patterns import linear_gather_message

__all__ = ["run"]


def _skip(summary: str) -> PassNote:
    return PassNote("sink", False, summary)


def run(program: Program) -> PassNote:
    out = linear_gather_message(program)
    if isinstance(out, str):
        return _skip(out)
    edge = program.edge
    lin = edge.nodes[out.id]
    if lin.op != Op.LINEAR:
        return _skip("apply_edge does not end with a Linear")
    x = edge.nodes[lin.args[0]]
    params = [edge.nodes[a] for a in lin.args[1:]]
    if any(p.op != Op.PARAM for p in params):
        return _skip("the final Linear's weight/bias are not layer parameters")
    if not x.deps or x.shape is None or len(x.shape) < 2 or lin.shape is None:
        return _skip("the final Linear's input is not a per-edge feature tensor")
    weight = params[0]
    program.sink = {
        "module": lin.attrs["module"] or "linear",
        "weight": dict(weight.attrs),
        "bias": dict(params[1].attrs) if len(params) == 2 else None,
    }
    expr = format_node(edge, lin.id)
    edge.outputs = Ref(x.id)
    edge.prune()
    f_in, f_out = x.shape[-1], lin.shape[-1]
    bias = ""
    if program.sink["bias"] is not None:
        bias = "; its bias is added deg(v) times" if program.gather == "sum" else \
            "; its bias is added where deg(v) > 0"
    name = program.sink["module"]
    return PassNote(
        "sink", True,
        f"propagate-then-transform: {name} ({f_in} -> {f_out}) applied once per vertex "
        f"after the {program.gather} gather instead of once per edge{bias}",
        [f"message was {expr}; now {format_node(edge, x.id)} [E, {f_in}]"],
    )
