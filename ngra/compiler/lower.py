"""Lowering: a compiled program -> the :class:`~ngra.compiler.compiled.CompiledPlan` that
runs it.

The fuse pass has already chosen each edge output's kernel (``Program.lowering``); what is
decided here is how ``pre`` treats the layer input ``x``:

* an input dropout fuses into the Linears of ``x`` (:func:`~ngra.kernels.dropout_linear`,
  one mask, no dropped copy of ``x``) when Linears are its only reads, in pre and in the
  vertex stage; else the note says why not;
* a vertex-stage Linear of ``x`` that shares a pre Linear's parameters is made by pre with
  it (GIN's reordered self term);
* a softmax value made from the plain ``x`` by closed ops can be made again in backward
  (:func:`_value_recipe`).
"""

from __future__ import annotations

from typing import Any

from ngra.compiler.compiled import CompiledPlan, Linears
from ngra.compiler.ir import Op, Program
from ngra.compiler.passes import PassNote
from ngra.compiler.passes.fuse import SoftmaxMatch

__all__ = ["lower"]


def lower(layer: Any, program: Program, notes: list[PassNote]) -> CompiledPlan:
    """The plan for a compiled ``program`` of ``layer``."""
    pre, vertex, note = _dropout_linears(program)
    return CompiledPlan(layer, program, notes, pre, vertex, note,
                        _shares_weights(program, pre, vertex), _value_recipe(program, pre))


def _dropout_linears(program: Program) -> tuple[Linears, Linears, str]:
    """``(pre's, vertex stage's, note)``: the Linears an input dropout fuses into, each as
    ``(linear, weight, bias or None)`` node ids of its stage, when they are the only reads
    of the (single-tensor) layer input; else ``([], [], why not)``."""
    if program.vertex is None:
        return [], [], "ApplyVertex was not traced, so its reads of x are unknown"
    if any(n.op == Op.VERTEX for n in program.edge.nodes.values()):
        return [], [], "the edge stage reads x itself"
    pre = program.pre
    read = {n.attrs["key"] for n in program.edge.nodes.values() if n.op in (Op.SRC, Op.DST)}
    if any(pre.nodes[pre.outputs[k].id].op == Op.VERTEX for k in read):
        return [], [], "the edge stage reads x itself"
    found = []
    for stage in (pre, program.vertex):
        linears, why = _linears_of_x(stage)
        if why:
            return [], [], why
        found.append(linears)
    if not any(found):
        return [], [], "no Linear reads x"
    where = " and ".join(f"{len(lins)} of the {stage} stage" for lins, stage
                         in zip(found, ("pre", "vertex")) if lins)
    return found[0], found[1], f"fused into the Linear(s) of x: {where}"


def _linears_of_x(stage: Any) -> tuple[Linears, str]:
    """``stage``'s Linears of the layer input ``x``, or ``([], why)`` where it reads ``x``
    otherwise."""
    reads = [n for n in stage.nodes.values() if n.op == Op.VERTEX]
    if any(n.attrs["key"] is not None for n in reads):
        return [], "x is a dict of tensors"
    ids = {n.id for n in reads}
    if stage.kind == "vertex" and ids & set(stage.output_ids()):
        return [], "the vertex stage returns x as it is"
    linears = []
    for n in stage.nodes.values():
        used = [i for i, a in enumerate(n.args) if a in ids]
        if not used:
            continue
        if n.op != Op.LINEAR or used != [0]:
            return [], (f"x is read by {n.op.value} in the {stage.kind} stage, not only as "
                        "the input of a Linear")
        linears.append((n.id, n.args[1], n.args[2] if len(n.args) > 2 else None))
    return linears, ""


def _shares_weights(program: Program, pre: list, vertex: list) -> bool:
    """Whether a vertex-stage Linear of x reads the same layer parameters (weight and
    bias) as a pre Linear of x; only PARAM nodes name a parameter."""
    def params(stage: Any, lins: list) -> set:
        def path(i: int | None) -> Any:
            n = None if i is None else stage.nodes[i]
            if n is not None and n.op != Op.PARAM:
                return (stage.kind, i)  # a computed weight: never the other stage's
            return None if n is None else (n.attrs["path"], n.attrs.get("cols"))
        return {(path(w), path(b)) for _, w, b in lins}

    return bool(vertex) and bool(params(program.pre, pre) & params(program.vertex, vertex))


def _value_recipe(program: Program, dropout_linears: list) -> tuple | None:
    """``(value key, value node, its PARAM nodes, reads every dropout Linear)`` when
    the softmax value of a rowdot-scored match (``SoftmaxMatch.weights``) is made in
    pre from the plain ``x`` and parameters by closed ops alone (no opaque call, no
    random op), so that attention_aggregate can make it again in backward; else None."""
    m = program.lowering.get(None)
    if not isinstance(m, SoftmaxMatch) or m.weights is None or "pre" in program.as_written:
        return None
    pre = program.pre
    root = pre.outputs[m.value].id
    nodes = [pre.nodes[i] for i in pre.ancestors([root])]
    if any(n.op == Op.OPAQUE or (n.op == Op.VERTEX and n.attrs["key"] is not None)
           for n in nodes):
        return None
    ids = {n.id for n in nodes}
    return (m.value, root, [n.id for n in nodes if n.op == Op.PARAM],
            all(lin in ids for lin, _, _ in dropout_linears))
