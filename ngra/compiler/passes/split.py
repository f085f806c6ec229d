"""Split: a Linear over ``cat([...], -1)`` becomes a sum of Linears, one per part.

``cat([a, b, c], -1) @ W.T + bias == a @ W[:, A].T + b @ W[:, B].T + c @ W[:, C].T + bias``
for the column blocks ``A, B, C`` of ``W``. The split matters when a part reads only
``edge.src`` or only ``edge.dst``: the hoist pass that runs next then computes that
part's product once per vertex instead of once per edge. An MPNN edge network's
``mlp(cat([edge.src, edge.dst, edge.data], -1))`` is the example: its first layer
becomes ``t0[src] + t1[dst] + edge.data * W[:, 2F] + b``, so per edge only the
edge-data block (and the layers after the first) runs, and no ``[E, 2F + D]``
concatenation is written. A width-1 block is written as that outer product
(element-wise, so it can fuse) rather than a Linear.
"""

from __future__ import annotations

from ngra.compiler.ir import Node, Op, Program, Ref, Stage, format_node, map_refs, remap_args
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
        remap_args(n, remap)
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
    if n.op != Op.LINEAR:
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
    """Add the per-block products and their sum to ``nodes``; returns the sum's id.

    A block of width 1 (a scalar edge feature) is an outer product, written as
    ``part * W[:, j]`` (element-wise, so it fuses) instead of a Linear.
    """
    cat = edge.nodes[lin.args[0]]
    w = edge.nodes[lin.args[1]]
    bias = list(lin.args[2:])

    def add(op: Op, args: tuple, attrs: dict, name: str) -> int:
        nid = program.new_id()
        nodes[nid] = Node(nid, op, args, attrs, name=name)
        return nid

    start, total = 0, None
    for i, part_id in enumerate(cat.args):
        width = edge.nodes[part_id].shape[-1]
        block = add(Op.PARAM, (), {**w.attrs, "cols": (start, start + width)},
                    f"{w.name}_{i}")
        start += width
        if width == 1 and edge.nodes[part_id].deps not in _ONE_SIDE:
            row = add(Op.VIEW, (block,), {"shape": (-1,)}, f"{w.name}_{i}_row")
            term = add(Op.MUL, (part_id, row), {}, f"{lin.name}_{i}")
        else:
            term = add(Op.LINEAR, (part_id, block), {"module": None}, f"{lin.name}_{i}")
        total = term if total is None else add(Op.ADD, (total, term), {}, f"{lin.name}_sum")
    for b in bias:  # once, after the blocks
        total = add(Op.ADD, (total, b), {}, f"{lin.name}_bias")
    return total
