"""gpu ``edge_score``: plain torch over chunks of edges (no Triton kernel yet).

Each chunk of edges gathers its rows, evaluates the expression with the reference
interpreter (:func:`ngra.kernels.ref.fused_edge.evaluate`) and sums each head's columns;
backward redoes a chunk under autograd and adds its row gradients into the terms'
(``index_add_``). So at most :data:`CHUNK_ELEMENTS` per-edge elements (``[chunk, F]``)
exist at a time instead of the reference's ``[E, F]``, and nothing per edge is saved for
backward; but each chunk's rows are still written to memory, which a generated Triton
kernel (the numba backend's ``score_fwd`` / ``score_bwd``) would keep in registers.
Plain torch: it runs on any device (the test suite checks it on CPU tensors).
"""

from __future__ import annotations

import torch

from ngra.kernels.edge_expr import EdgeExpr
from ngra.kernels.edge_score import EdgeScoreCall
from ngra.kernels.ref.fused_edge import evaluate
from ngra.kernels.ref.util import dst_ids
from ngra.kernels.registry import register

__all__ = ["CHUNK_ELEMENTS", "edge_score_fwd", "edge_score_bwd"]

#: Per-edge elements (edges x F) evaluated at once.
CHUNK_ELEMENTS = 1 << 22


def _spans(num_edges: int, width: int):
    step = max(1, CHUNK_ELEMENTS // max(width, 1))
    for e0 in range(0, num_edges, step):
        yield e0, min(num_edges, e0 + step)


def _chunk(call: EdgeScoreCall, rows: dict, groups: dict, e0: int, e1: int,
           leaf_rows: dict | None = None) -> torch.Tensor:
    n = e1 - e0

    def leaf(x: EdgeExpr) -> torch.Tensor:
        if leaf_rows is not None:
            return leaf_rows[(x.op, x.index)]
        t = groups[x.op][x.index]
        if x.op == "dst" and t.shape[0] == 1:
            return t.expand(n, t.shape[1])
        return t.index_select(0, rows[x.op][e0:e1])

    device = rows["src"].device
    (msg,) = evaluate([call.expr], leaf, call.dtype, device)
    msg = msg.expand(n, call.width)
    return msg.reshape(n, call.heads, call.width // call.heads).sum(-1) * call.scale


def _rows(indptr: torch.Tensor, indices: torch.Tensor) -> dict:
    return {"src": indices.long(), "dst": dst_ids(indptr)}


@register("edge_score_fwd", "gpu")
def edge_score_fwd(indptr, indices, call: EdgeScoreCall, src, dst) -> torch.Tensor:
    """``[E, H]`` scores, a chunk of edges at a time."""
    rows, groups = _rows(indptr, indices), {"src": src, "dst": dst}
    out = torch.empty(indices.numel(), call.heads, dtype=call.dtype, device=indptr.device)
    for e0, e1 in _spans(indices.numel(), call.width):
        out[e0:e1] = _chunk(call, rows, groups, e0, e1)
    return out


@register("edge_score_bwd", "gpu")
def edge_score_bwd(indptr, indices, call: EdgeScoreCall, src, dst, grad, need):
    """Gradients: each chunk again under autograd, its row gradients added into the terms."""
    rows, groups = _rows(indptr, indices), {"src": src, "dst": dst}
    wanted = {"src": need[0], "dst": need[1]}
    out = {k: [torch.zeros_like(t) if wanted[k][i] else None for i, t in enumerate(groups[k])]
           for k in groups}
    keys = [(k, i) for k in ("src", "dst") for i in range(len(groups[k]))]
    for e0, e1 in _spans(indices.numel(), call.width):
        leaf_rows = {}
        for k, i in keys:
            t = groups[k][i]
            r = (t.expand(e1 - e0, t.shape[1]) if k == "dst" and t.shape[0] == 1
                 else t.index_select(0, rows[k][e0:e1]))
            leaf_rows[(k, i)] = r.detach().requires_grad_(bool(wanted[k][i]))
        todo = [ki for ki in keys if wanted[ki[0]][ki[1]]]
        with torch.enable_grad():
            s = _chunk(call, rows, groups, e0, e1, leaf_rows)
            gs = torch.autograd.grad(s, [leaf_rows[ki] for ki in todo], grad[e0:e1],
                                     allow_unused=True)
        for (k, i), g in zip(todo, gs):
            if g is None:
                continue
            t = out[k][i]
            if k == "dst" and t.shape[0] == 1:
                t += g.sum(0, keepdim=True)
            else:
                t.index_add_(0, rows[k][e0:e1], g)
    return out["src"], out["dst"]
