"""Contract: ``(x * w).sum(-1)`` on the vertex side becomes one ``rowdot(x, w)``.

When ``w`` is the same for every row (parameters and constants only) and the product
feeds nothing but the sum over its last dim, the two ops are one contraction,
:func:`ngra.kernels.rowdot`, which never makes the ``x``-sized product: GAT's hoisted
attention scores ``(lin(x).view(-1, H, D) * a_src).sum(-1)`` made an ``[N, H, D]``
product in forward and two more ``[N, H, D]`` tensors in backward (``g * a_src`` and
``g * h``, the latter only to be summed into ``a_src``'s ``[H, D]`` gradient); rowdot
makes only the input gradient.

Runs on the ``pre`` stage, where hoisting leaves such per-vertex reductions; the edge
stage is the fuse pass's.
"""

from __future__ import annotations

import torch

from ngra.compiler.ir import Node, Op, Program, Stage, format_node
from ngra.compiler.passes import PassNote

__all__ = ["run"]


def _weight_fits(w: Node, x: Node) -> bool:
    """``w`` is row-independent and broadcasts to ``x``'s per-row shape without growing it."""
    if w.deps or w.shape is None or x.rest is None:
        return False
    if x.dtype not in (torch.float32, torch.float64) or w.dtype != x.dtype:
        return False  # x * w would promote, or rowdot would refuse the dtype
    shape = tuple(w.shape)
    if len(shape) == len(x.shape) and shape[0] == 1:
        shape = shape[1:]
    if len(shape) > len(x.rest):
        return False
    tail = x.rest[len(x.rest) - len(shape):]
    return all(s in (1, t) for s, t in zip(shape, tail))


def _match(stage: Stage, n: Node, users: dict[int, list[int]], outs: set[int]) -> tuple | None:
    """``(x, w)`` when ``n`` is ``sum(x * w, -1)`` that rowdot computes, else ``None``."""
    if n.op != Op.SUM or n.attrs["keepdim"] or not n.rowwise:
        return None
    prod = stage.nodes[n.args[0]]
    if prod.op != Op.MUL or prod.shape is None or prod.id in outs or users[prod.id] != [n.id]:
        return None
    dims = n.attrs["dim"]
    dims = dims if isinstance(dims, tuple) else (dims,)
    if len(dims) != 1 or dims[0] not in (-1, len(prod.shape) - 1):
        return None
    for xi, wi in (prod.args, prod.args[::-1]):
        x, w = stage.nodes[xi], stage.nodes[wi]
        if (x.deps and x.rowwise and x.shape is not None and len(x.shape) >= 2
                and tuple(x.shape) == tuple(prod.shape) and _weight_fits(w, x)):
            return x, w
    return None


def run(program: Program) -> PassNote:
    pre = program.pre
    users, outs = pre.users(), set(pre.output_ids())
    details = []
    for n in list(pre.nodes.values()):
        found = _match(pre, n, users, outs)
        if found is None:
            continue
        x, w = found
        before = format_node(pre, n.id)
        n.op, n.args, n.attrs = Op.ROWDOT, (x.id, w.id), {}
        rest = ", ".join(map(str, x.rest))
        details.append(f"{before} -> {format_node(pre, n.id)}  (no [N, {rest}] product in "
                       "forward or backward)")
    if not details:
        return PassNote("contract", False, "no (x * w).sum(-1) with a row-independent w on the "
                        "vertex side")
    pre.prune()
    return PassNote("contract", True, f"{len(details)} product-sum(s) on the vertex side became "
                    "rowdot contractions", details)
