"""Split: a Linear over ``cat([...], -1)`` becomes a sum of Linears, one per part.

``cat([a, b, c], -1) @ W.T + bias == a @ W[:, A].T + b @ W[:, B].T + c @ W[:, C].T + bias``
for the column blocks ``A, B, C`` of ``W``. The split matters when a part reads only
``edge.src`` or only ``edge.dst``: the hoist pass that runs next then computes that
part's product once per vertex instead of once per edge. An MPNN edge network's
``mlp(cat([edge.src, edge.dst, edge.data], -1))`` is the example: its first layer
becomes ``t0[src] + t1[dst] + mlp.0[:, 2F:](edge.data)``, so per edge only the
edge-data block (and the layers after the first) runs, and no ``[E, 2F + D]``
concatenation is written.
"""

from __future__ import annotations

from ngra.compiler.ir import Node, Op, Program, Ref, Stage, format_node, map_refs
from ngra.compiler.passes import PassNote

__all__ = ["run"]

_ONE_SIDE = (frozenset({"src"}), frozenset({"dst"}))


def run(program: Program) -> PassNote:
    edge = program.edge
    found = {n.id for n in edge.nodes.values() if _splittable(edge, n)}
    if not found:
        return PassNote("split", False, "no linear over cat([...], -1) with a part that reads "
                        "only edge.src or only edge.dst")
    details = []
    remap: dict[int, int] = {}
    nodes: dict[int, Node] = {}
    for nid, n in edge.nodes.items():
        if remap and any(a in remap for a in n.args):
            n.args = tuple(remap.get(a, a) for a in n.args)
            if n.op == Op.OPAQUE:
                n.attrs["template"] = map_refs(n.attrs["template"],
                                               lambda r: Ref(remap.get(r.id, r.id)))
        nodes[nid] = n
        if nid in found:
            before = format_node(edge, nid)
            remap[nid] = _expand(program, edge, n, nodes)
            details.append(f"{before}  ->  {len(edge.nodes[n.args[0]].args)} linears "
                           "over column blocks of the weight")
    edge.nodes = nodes
    edge.outputs = map_refs(edge.outputs, lambda r: Ref(remap.get(r.id, r.id)))
    edge.prune()
    return PassNote("split", True, f"{len(found)} linear(s) over a concatenation split by "
                    "input block (so the src-only and dst-only blocks can be hoisted)", details)


def _splittable(edge: Stage, n: Node) -> bool:
    if n.op != Op.LINEAR or "cols" in n.attrs:
        return False
    cat = edge.nodes[n.args[0]]
    if cat.op != Op.CAT or cat.shape is None or len(cat.args) < 2:
        return False
    parts = [edge.nodes[a] for a in cat.args]
    rank = len(cat.shape)
    if cat.attrs["dim"] not in (-1, rank - 1) or rank < 2:
        return False
    if any(p.shape is None or len(p.shape) != rank for p in parts):
        return False
    return any(p.deps in _ONE_SIDE for p in parts)


def _expand(program: Program, edge: Stage, lin: Node, nodes: dict[int, Node]) -> int:
    """Add the per-block linears and their sum to ``nodes``; returns the sum's id."""
    cat = edge.nodes[lin.args[0]]
    x, w, *bias = lin.args
    start, total = 0, None
    for i, part_id in enumerate(cat.args):
        width = edge.nodes[part_id].shape[-1]
        attrs = {"module": lin.attrs["module"], "cols": (start, start + width)}
        args = (part_id, w, *bias) if i == 0 else (part_id, w)
        start += width
        nid = program.new_id()
        nodes[nid] = Node(nid, Op.LINEAR, args, attrs, name=f"{lin.name}_{i}")
        if total is not None:
            sid = program.new_id()
            nodes[sid] = Node(sid, Op.ADD, (total, nid), {}, name=f"{lin.name}_sum")
            nid = sid
        total = nid
    return total
