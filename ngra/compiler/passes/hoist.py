"""Hoist: src-only / dst-only ApplyEdge work moves to the vertex side (NeuGraph's edge-to-vertex).

A sub-expression of ``apply_edge`` that reads only ``edge.src`` (and parameters),
and is row-wise, has the same value on an edge as on its source vertex. It is
computed once per vertex in the ``pre`` stage (``[N, ...]``) and the edge stage
reads the result at the edge's source row, instead of computing it once per edge
(``[E, ...]``). Likewise for ``edge.dst``. The pass hoists the maximal such
subtrees (e.g. ``w_c(edge.src)`` and ``w_h(edge.dst)`` of G-GCN; ``lin(edge.src)``
and the score dot-products of GAT; the per-type linear of GG-NN/R-GCN). Hoisted
subtrees are merged by common-subexpression elimination on the vertex side, so
GAT's ``lin(edge.src)`` and ``lin(edge.dst)`` become one ``lin(x)``.
"""

from __future__ import annotations

from typing import Any

from ngra.compiler.ir import (
    LEAVES, Node, Op, Program, Ref, Stage, format_key, format_node, map_refs, remap_args,
)
from ngra.compiler.passes import PassNote

__all__ = ["run"]


def _side(n: Node) -> str | None:
    if n.op in LEAVES or not n.rowwise:
        return None
    if n.deps == frozenset({"src"}):
        return "src"
    if n.deps == frozenset({"dst"}):
        return "dst"
    return None


def run(program: Program) -> PassNote:
    edge, pre = program.edge, program.pre
    users = edge.users()
    outs = set(edge.output_ids())
    maximal = []
    for n in edge.nodes.values():
        side = _side(n)
        if side is None:
            continue
        if n.id in outs or any(_side(edge.nodes[u]) != side for u in users[n.id]):
            maximal.append((n, side))
    skipped = _not_rowwise(edge)
    if not maximal:
        details = [f"kept per edge (not row-wise): {s}" for s in skipped]
        return PassNote("hoist", False, "no sub-expression of apply_edge reads only edge.src or "
                        "only edge.dst (beyond reading them)", details)

    cse = _CSE(program)
    replace: dict[int, tuple[Op, Any]] = {}
    details = []
    for n, side in maximal:
        pre_id = cse.copy(edge, n.id)
        key = next((k for k, r in pre.outputs.items() if r.id == pre_id), None)
        if key is None:
            key = ("t", sum(1 for k in pre.outputs if k[0] == "t"))
            pre.outputs[key] = Ref(pre_id)
            program.terms[key] = {"origin": "hoist", "side": side,
                                  "expr": format_node(edge, n.id), "rest": n.rest}
        else:
            program.terms[key].setdefault("sides", set()).add(side)
        replace[n.id] = (Op.SRC if side == "src" else Op.DST, key)
        shape = "?" if n.rest is None else ", ".join(["N", *map(str, n.rest)])
        details.append(f"{format_key(key)} = {format_node(edge, n.id)}  [{shape}]  "
                       f"({side}-only; read per edge as {format_key(key)}[{side}])")
    _rewrite(program, replace)
    details += [f"computed once per vertex: {a} and {b} are the same {c}"
                for a, b, c in cse.merged]
    details += [f"kept per edge (not row-wise): {s}" for s in skipped]
    return PassNote(
        "hoist", True,
        f"{len(maximal)} sub-expression(s) moved from ApplyEdge to the vertex side "
        "(computed once per vertex, not once per edge)", details,
    )


def _not_rowwise(edge: Stage) -> list[str]:
    out = []
    for n in edge.nodes.values():
        one_side = n.deps in (frozenset({"src"}), frozenset({"dst"}))
        if n.op not in LEAVES and not n.rowwise and one_side:
            out.append(format_node(edge, n.id))
    return out


class _CSE:
    """Copies edge-stage subtrees into ``pre``, merging structurally equal nodes."""

    def __init__(self, program: Program) -> None:
        self.p = program
        self.table: dict[Any, int] = {}
        self.origin: dict[int, tuple[Stage, int]] = {}
        self.merged: list[tuple[str, str, str]] = []
        for n in program.pre.nodes.values():
            self.table.setdefault(_key(n, n.args), n.id)

    def copy(self, edge: Stage, nid: int) -> int:
        n = edge.nodes[nid]
        if n.op in (Op.SRC, Op.DST):
            return self.p.pre.outputs[n.attrs["key"]].id
        args = tuple(self.copy(edge, a) for a in n.args)
        key = _key(n, args)
        if key in self.table:
            hit = self.table[key]
            first = self.origin.get(hit)
            if first is not None and first[1] != nid and n.op in (Op.LINEAR, Op.OPAQUE):
                a, b = format_node(first[0], first[1]), format_node(edge, nid)
                if a != b:
                    self.merged.append((a, b, format_node(self.p.pre, hit)))
            return hit
        new = self.p.new_id()
        attrs = dict(n.attrs)
        if n.op == Op.OPAQUE:
            mapping = dict(zip(n.args, args))
            attrs["template"] = map_refs(n.attrs["template"], lambda r: Ref(mapping[r.id]))
        self.p.pre.add(Node(new, n.op, args, attrs, name=n.name))
        self.table[key] = new
        self.origin[new] = (edge, nid)
        return new


def _freeze(v: Any) -> Any:
    if isinstance(v, dict):
        return ("dict", tuple((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(_freeze(x) for x in v))
    if isinstance(v, slice):
        return ("slice", _freeze(v.start), _freeze(v.stop), _freeze(v.step))
    try:
        hash(v)
    except TypeError:
        return ("id", id(v))
    if hasattr(v, "shape"):  # tensors hash by identity; keep them distinct by identity too
        return ("id", id(v))
    return v


def _key(n: Node, args: tuple[int, ...]) -> Any:
    if n.op == Op.OPAQUE:
        # only calls known to be pure may be merged; the template's refs are positions in args
        if n.attrs["rowwise_ok"] is False or n.attrs["random"] or n.attrs["inplace"]:
            return ("unique", n.id)
        attrs = {k: v for k, v in n.attrs.items() if k != "template"}
        mapping = dict(zip(n.args, args))
        tmpl = map_refs(n.attrs["template"], lambda r: ("ref", mapping[r.id]))
        return (n.op, args, _freeze(attrs), _freeze(tmpl))
    return (n.op, args, _freeze(n.attrs))


def _rewrite(program: Program, replace: dict[int, tuple[Op, Any]]) -> None:
    """Replace hoisted edge nodes by SRC/DST reads of their terms."""
    edge = program.edge
    inputs: dict[tuple[Op, Any], int] = {
        (n.op, n.attrs["key"]): n.id for n in edge.nodes.values() if n.op in (Op.SRC, Op.DST)
    }
    remap: dict[int, int] = {}
    nodes: dict[int, Node] = {}
    for nid, n in edge.nodes.items():
        if nid in replace:
            op, key = replace[nid]
            if (op, key) not in inputs:
                new = program.new_id()
                inputs[(op, key)] = new
                nodes[new] = Node(new, op, (), {"key": key}, name=f"{op.value}_{format_key(key)}")
            remap[nid] = inputs[(op, key)]
            continue
        remap_args(n, remap)
        nodes[nid] = n
    edge.nodes = nodes
    edge.outputs = map_refs(edge.outputs, lambda r: Ref(remap.get(r.id, r.id)))
    edge.prune()
