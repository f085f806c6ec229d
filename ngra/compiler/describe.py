"""Explain text: the lines ``ngra.explain`` prints for a plan.

The generic plan says why it runs and what it materializes; a compiled plan lists the
passes' notes, then per stage what runs (the terms pre makes with their shapes, the
kernel each edge output runs, the gather, the sink, the vertex stage) and where an input
dropout goes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ngra.compiler.ir import Program, format_key, format_node, iter_refs
from ngra.compiler.passes import PassNote
from ngra.compiler.passes.fuse import (
    FusedEdgeMatch,
    GspmmMatch,
    SoftmaxMatch,
    SoftmaxScoreMatch,
    describe_match,
)

if TYPE_CHECKING:
    from ngra.compiler.compiled import CompiledPlan
    from ngra.compiler.generic import GenericPlan

__all__ = ["compiled_lines", "generic_lines"]


def generic_lines(plan: GenericPlan, notes: Sequence[PassNote] = ()) -> list[str]:
    """The explain lines of the generic plan, with the passes' ``notes`` (why nothing
    was fused)."""
    name = type(plan.layer).__name__
    lines = [
        f"plan: generic UDF executor ({plan.reason})",
        "  scatter: gather edge.src/edge.dst rows per edge ([E, F] per tile, or per chunk of "
        "edges on the whole graph: see chunks)",
        f"  apply_edge: {name}.apply_edge on each tile's edges",
        f"  gather: {plan.accumulator.name} via segment_reduce",
        f"  apply_vertex: {name}.apply_vertex",
    ]
    if notes:
        lines += ["passes:"] + [ln for note in notes for ln in note.lines()]
    return lines


def compiled_lines(plan: CompiledPlan) -> list[str]:
    """The explain lines of a compiled plan: the passes' notes, then each stage."""
    p = plan.program
    kinds = ", ".join(plan.edge_kinds)
    lines = [f"plan: compiled ({kinds})", "passes:"]
    for note in plan.notes:
        lines += note.lines()
    lines.append("stages:")
    pre_terms = [k for k, info in p.terms.items() if info.get("origin") != "input"
                 and k in p.pre.outputs]
    if pre_terms:
        parts = []
        for k in pre_terms:
            info = p.terms[k]
            node = p.pre.nodes[p.pre.outputs[k].id]
            rest = node.rest if node.shape is not None else info.get("rest")
            shape = "?" if rest is None else ", ".join(["N", *map(str, rest)])
            parts.append(f"{format_key(k)} = {format_node(p.pre, node.id)} [{shape}]")
        lines.append("  pre     (per vertex) " + "; ".join(parts))
    else:
        lines.append("  pre     (per vertex) nothing: the edge stage reads the vertex data")
    for key, m in p.lowering.items():
        who = "" if key is None else f"[{key!r}] "
        gather = plan.gather if isinstance(plan.gather, str) else plan.gather[key]
        if isinstance(m, FusedEdgeMatch) and m.group:
            kernel = _multi_line(p, m, key, plan.gather)
        else:
            kernel = _kernel_line(p, m, gather, plan._value_recipe is not None)
        lines.append(f"  edge    (per tile)   {who}{kernel}")
    mean = " (partial sums per tile; divided by the in-degree at the end)"
    if isinstance(plan.gather, str):
        lines.append(f"  gather  {plan.gather}" + (mean if plan.gather == "mean" else ""))
    else:
        lines.append("  gather  per field: " + ", ".join(f"{k!r} {g}" for k, g
                                                         in plan.gather.items()))
    if p.sink is not None:
        lines.append(f"  sink    (per vertex) {p.sink['module']} applied to the gathered "
                     "messages (moved from the end of ApplyEdge)")
    if p.vertex_rewritten:
        out = ", ".join(format_node(p.vertex, r.id) for r in _refs(p.vertex.outputs))
        lines.append(f"  vertex  apply_vertex rewritten: {out}")
    else:
        lines.append(f"  vertex  {p.layer_name}.apply_vertex as written")
    how = ("inside pre, dropout_linear (no dropped copy of x)"
           if plan.dropout_linears or plan.vertex_dropout_linears
           else "applied to x before pre")
    lines.append(f"input dropout (layer(..., dropout=p)): {how}: {plan.dropout_note}")
    return lines



def _refs(struct: Any) -> list:
    return list(iter_refs(struct))


def _kernel_line(p: Program, m: Any, gather: str, remade: bool = False) -> str:
    reduce = "sum" if gather in ("sum", "mean") else gather
    if isinstance(m, GspmmMatch):
        ef = "edge_feat=" + ("[E]" if m.edge_dims == 0 else
                             "[E, " + ", ".join(map(str, m.feat[:m.edge_dims])) + "]") \
            if m.factors else "no edge_feat"
        if m.typed:
            return (f"gspmm over N*{m.typed['types']} virtual sources (typed), {ef}, "
                    f"reduce={reduce} -> [N_dst, {', '.join(map(str, m.out))}]")
        return (f"gspmm({format_key(m.src)}, {ef}, reduce={reduce}) -> "
                f"[N_dst, {', '.join(map(str, m.out))}]")
    if isinstance(m, SoftmaxMatch):
        line = (f"softmax_aggregate(score_src={_k(m.score_src)}, score_dst={_k(m.score_dst)}, "
                f"value={format_key(m.value)}, negative_slope={m.slope:g}) -> "
                f"[N_dst, {', '.join(map(str, m.heads + m.dims))}]; no [E, H, D] tensor")
        if m.weights is not None:
            line += ("; whole graph: attention_aggregate(value, w_src, w_dst), the scores' "
                     "rowdots inside")
            if remade:
                line += ", the value made again from x in backward instead of saved"
        return line
    if isinstance(m, SoftmaxScoreMatch):
        sm = m.score
        src = ", ".join(format_key(k) for k, _ in sm.src)
        dst = ", ".join(format_key(k) if kind == "term" else "param row" for kind, k, _ in sm.dst)
        heads = math.prod(m.heads) if m.heads else 1
        return (f"edge_score({sm.expr}; src=[{src}], dst=[{dst}], heads={heads}, "
                f"scale={m.scale:g}) -> [E, {heads}]; edge_softmax; gspmm({format_key(m.value)}, "
                f"edge_feat=[E, {heads}]) -> [N_dst, {', '.join(map(str, m.heads + m.dims))}]; "
                "no [E, H, D] tensor")
    if isinstance(m, FusedEdgeMatch):
        src = ", ".join(format_key(k) for k, _ in m.src)
        dst = ", ".join(format_key(k) if kind == "term" else "param row" for kind, k, _ in m.dst)
        return (f"fused_edge_aggregate({m.expr}; src=[{src}], dst=[{dst}], "
                f"edge={len(m.edge)} term(s), reduce={reduce}) -> "
                f"[N_dst, {', '.join(map(str, m.out))}]; no [E, F] tensor")
    return f"interpreted edge stage + segment_reduce ({describe_match(p, m)})"


def _multi_line(p: Program, m: FusedEdgeMatch, key: Any, gather: dict) -> str:
    """The stage line of a field in a ``fused_edge_aggregate_multi`` group: the whole call
    on its first field, a pointer to it on the others."""
    if key != m.group[0]:
        return f"in the fused_edge_aggregate_multi walk of [{m.group[0]!r}]"
    outs = "; ".join(f"{k!r}: {gather[k]} of {p.lowering[k].expr}" for k in m.group)
    src = ", ".join(format_key(k) for k, _ in m.src)
    dst = ", ".join(format_key(k) if kind == "term" else "param row" for kind, k, _ in m.dst)
    shape = ", ".join(map(str, m.out))
    return (f"fused_edge_aggregate_multi({outs}; src=[{src}], dst=[{dst}], edge={len(m.edge)} "
            f"term(s)) -> {len(m.group)} x [N_dst, {shape}] from one walk over each "
            "destination's in-edges, forward and backward; no [E, F] tensor (on a GPU: one "
            "fused_edge_aggregate per field, no Triton multi-output kernel)")


def _k(key: Any) -> str:
    return "0" if key is None else format_key(key)

