"""Small pattern helpers shared by the reorder and fuse passes."""

from __future__ import annotations

from typing import Any

import torch

from ngra.compiler.ir import Node, Op, Program, Ref, Stage

__all__ = ["peel_scale", "factor_layout", "match_typed", "norm_dim", "is_float",
           "linear_gather_message"]


def norm_dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def is_float(dtype: Any) -> bool:
    return dtype in (torch.float32, torch.float64)


def peel_scale(stage: Stage, nid: int) -> tuple[int, list[tuple[int, bool]]]:
    """Split ``msg = core * f1 / f2 * ...`` into ``core`` and src-free factors.

    Returns ``(core id, [(factor id, reciprocal), ...])``; a factor is a
    multiplicand (or divisor) that does not read ``edge.src``.
    """
    n = stage.nodes[nid]
    if n.op == Op.MUL:
        a, b = (stage.nodes[i] for i in n.args)
        if "src" not in a.deps and "src" in b.deps:
            core, fs = peel_scale(stage, b.id)
            return core, [(a.id, False)] + fs
        if "src" not in b.deps and "src" in a.deps:
            core, fs = peel_scale(stage, a.id)
            return core, [(b.id, False)] + fs
    if n.op == Op.DIV:
        a, b = (stage.nodes[i] for i in n.args)
        if "src" not in b.deps and "src" in a.deps:
            core, fs = peel_scale(stage, a.id)
            return core, [(b.id, True)] + fs
    return nid, []


def factor_layout(stage: Stage, core: Node, factors: list[tuple[int, bool]]) -> int | str:
    """How the product of ``factors`` broadcasts over ``core`` ``[E, *S]``.

    Returns ``j`` such that the product is ``[E, *S[:j]]`` broadcast over the
    trailing dims (``j = 0``: one scalar per edge; ``j = len(S)``: full shape), or
    a reason string when the factors do not fit that layout.
    """
    if core.shape is None:
        return "the shape of the scaled term is unknown"
    rest = tuple(core.shape[1:])
    rank = len(rest)
    combined = [1] * rank
    for fid, _ in factors:
        f = stage.nodes[fid]
        if f.shape is None:
            return f"the shape of factor %{fid} is unknown"
        if f.dtype not in (int, float) and f.dtype != core.dtype:
            return f"factor dtype {f.dtype} differs from the message dtype {core.dtype}"
        if f.deps:
            if not f.rowwise or len(f.shape) != rank + 1:
                return (f"factor of shape [E, {', '.join(map(str, f.shape[1:]))}] does not align "
                        f"with the message [E, {', '.join(map(str, rest))}]")
            fr = tuple(f.shape[1:])
        else:
            fr = tuple(f.shape)
            if len(fr) == rank + 1:
                if fr[0] != 1:
                    return f"constant factor of shape {list(fr)} does not broadcast over edges"
                fr = fr[1:]
            if len(fr) > rank:
                return f"constant factor of shape {list(fr)} has more dims than the message"
            fr = (1,) * (rank - len(fr)) + fr
        for i, (a, s) in enumerate(zip(fr, rest)):
            if a == 1:
                continue
            if a != s:
                return f"factor dim {i + 1} ({a}) broadcasts the message dim ({s})"
            combined[i] = s
    j = max((i + 1 for i, c in enumerate(combined) if c != 1), default=0)
    if any(combined[i] != rest[i] for i in range(j)):
        return (f"per-edge factor of shape [E, {', '.join(map(str, combined))}] broadcasts over a "
                "leading feature dim")
    return j


def match_typed(stage: Stage, core_id: int) -> dict | None:
    """``src_term.view(-1, T, F).gather(1, type.view(-1, 1, 1).expand(-1, 1, F)).squeeze(1)``.

    The per-edge selection of a per-type vertex term by an integer edge field
    (GG-NN, R-GCN). Returns ``{"src": key, "types": T, "width": F, "type_node": id}``
    or ``None``.
    """
    n = stage.nodes[core_id]
    g = n
    if n.op in (Op.SQUEEZE, Op.VIEW, Op.RESHAPE, Op.FLATTEN):
        inner = stage.nodes[n.args[0]]
        if inner.op != Op.GATHER or inner.shape is None or len(inner.shape) != 3:
            return None
        f = inner.shape[2]
        at = n.attrs
        ok = ((n.op == Op.SQUEEZE and at["dim"] is not None and norm_dim(at["dim"], 3) == 1)
              or (n.op in (Op.VIEW, Op.RESHAPE) and at["shape"] == (-1, f))
              or (n.op == Op.FLATTEN and norm_dim(at["start"], 3) == 1
                  and norm_dim(at["end"], 3) == 2))
        if not ok:
            return None
        g = inner
    if g.op != Op.GATHER or g.shape is None or len(g.shape) != 3:
        return None
    src, idx = stage.nodes[g.args[0]], stage.nodes[g.args[1]]
    if norm_dim(g.attrs["dim"], 3) != 1 or src.op != Op.SRC or src.shape is None \
            or len(src.shape) != 3 or not is_float(src.dtype):
        return None
    _, t, f = src.shape
    if idx.shape is None or tuple(idx.shape[1:]) != (1, f) or "src" in idx.deps or not idx.rowwise:
        return None
    if idx.op != Op.EXPAND:
        if f != 1:
            return None
        j = idx
    else:
        j = stage.nodes[idx.args[0]]
    if j.shape is None or len(j.shape) < 1 or any(d != 1 for d in j.shape[1:]) \
            or j.dtype not in (torch.int64, torch.int32) or not j.rowwise:
        return None
    return {"src": src.attrs["key"], "types": t, "width": f, "type_node": j.id}


def linear_gather_message(program: Program) -> Ref | str:
    """The one message of a program whose Gather is linear (sum/mean), or why not."""
    if not isinstance(program.gather, str):
        return "a per-field gather (one accumulator per message)"
    if program.gather not in ("sum", "mean"):
        return f"gather '{program.gather}' is not linear (needs sum or mean)"
    out = program.edge.outputs
    if not isinstance(out, Ref):
        return "apply_edge returns several messages"
    return out
