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

A Linear over a sum or difference whose parts read different sides is distributed the
same way: ``lin(a - b) == a @ W.T - b @ W.T + bias``. EdgeConv's
``mlp(cat([edge.dst, edge.src - edge.dst]))`` is the example: after the split its second
block is ``linear(edge.src - edge.dst, W_2)``, which reads both sides; distributed, it is
``t[src] - t'[dst]`` after hoisting, and the message fuses.
"""

from __future__ import annotations

from collections.abc import Callable

from ngra.compiler.ir import Node, Op, Program, Ref, Stage, format_node, map_refs, remap_args
from ngra.compiler.passes import PassNote

__all__ = ["run"]

_ONE_SIDE = (frozenset({"src"}), frozenset({"dst"}))


def run(program: Program) -> PassNote:
    edge = program.edge
    found = {n.id for n in edge.nodes.values() if _splittable(edge, n)}
    details: list[str] = []
    if found:
        _split(program, edge, found, details)
    spread = 0
    for _ in range(4):  # nested sums: a + b - c
        more = {n.id for n in edge.nodes.values() if _distributable(edge, n)}
        if not more:
            break
        spread += len(more)
        _rewrite(program, edge, more, details, _distribute, lambda n: "one linear per part")
    if not found and not spread:
        return PassNote("split", False, "no linear over cat([...], -1) with a part that reads "
                        "only edge.src or only edge.dst, nor over a sum of such parts")
    what = []
    if found:
        what.append(f"{len(found)} linear(s) over a concatenation split by input block")
    if spread:
        what.append(f"{spread} linear(s) over a sum of src-side and dst-side parts distributed")
    return PassNote("split", True, "; ".join(what) + " (so the src-only and dst-only parts "
                    "can be hoisted)", details)


def _rewrite(program: Program, edge: Stage, found: set[int], details: list[str],
             expand: Callable, what: Callable[[Node], str]) -> None:
    """Replace each node of ``found`` by ``expand(program, edge, node, nodes)``."""
    remap: dict[int, int] = {}
    nodes: dict[int, Node] = {}
    for nid, n in edge.nodes.items():
        remap_args(n, remap)
        nodes[nid] = n
        if nid in found:
            before = format_node(edge, nid)
            remap[nid] = expand(program, edge, n, nodes)
            details.append(f"{before}  ->  {what(n)}")
    edge.nodes = nodes
    edge.outputs = map_refs(edge.outputs, lambda r: Ref(remap.get(r.id, r.id)))
    edge.prune()


def _distributable(edge: Stage, n: Node) -> bool:
    if n.op != Op.LINEAR:
        return False
    x = edge.nodes[n.args[0]]
    if x.op not in (Op.ADD, Op.SUB) or x.shape is None or x.deps in _ONE_SIDE:
        return False
    parts = [edge.nodes[a] for a in x.args]
    if any(p.shape is None or tuple(p.shape) != tuple(x.shape) for p in parts):
        return False  # a broadcast part would change the product's shape
    return any(p.deps in _ONE_SIDE for p in parts)


def _distribute(program: Program, edge: Stage, lin: Node, nodes: dict[int, Node]) -> int:
    """``lin(a +- b, W, bias)`` -> ``lin(a, W) +- lin(b, W) + bias`` in ``nodes``; the id
    of the result."""
    x = edge.nodes[lin.args[0]]

    def add(op: Op, args: tuple, attrs: dict, name: str) -> int:
        nid = program.new_id()
        nodes[nid] = Node(nid, op, args, attrs, name=name)
        return nid

    a, b = (add(Op.LINEAR, (p, lin.args[1]), {"module": None}, f"{lin.name}_{i}")
            for i, p in enumerate(x.args))
    total = add(x.op, (a, b), {}, f"{lin.name}_parts")
    for bias in lin.args[2:]:
        total = add(Op.ADD, (total, bias), {}, f"{lin.name}_bias")
    return total


def _split(program: Program, edge: Stage, found: set[int], details: list[str]) -> None:
    _rewrite(program, edge, found, details, _expand,
             lambda n: f"{len(edge.nodes[n.args[0]].args)} linears over column blocks of "
             "the weight")


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
