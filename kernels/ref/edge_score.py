"""Reference ``edge_score``: plain torch, the specification and test oracle.

Forms every per-edge row (``[E, F]``, ``F = H * D``), evaluates the expression with the
reference interpreter (:func:`ngra.kernels.ref.fused_edge.evaluate`), and sums each head's
``D`` columns. The backward is torch autograd through that forward, not the symbolic
derivatives the fused backend uses, so tests compare two independent routes.
"""

from __future__ import annotations

import torch

from ngra.kernels.edge_expr import EdgeExpr
from ngra.kernels.edge_score import EdgeScoreCall
from ngra.kernels.ref.fused_edge import evaluate
from ngra.kernels.ref.util import dst_ids
from ngra.kernels.registry import register

__all__ = ["edge_score_fwd", "edge_score_bwd"]


def _scores(indptr, indices, call: EdgeScoreCall, src, dst) -> torch.Tensor:
    rows = {"src": indices.long(), "dst": dst_ids(indptr)}
    groups = {"src": src, "dst": dst}
    num_edges = indices.numel()

    def leaf(x: EdgeExpr) -> torch.Tensor:
        t = groups[x.op][x.index]
        if x.op == "dst" and t.shape[0] == 1:  # one row every edge reads
            return t.expand(num_edges, t.shape[1])
        return t.index_select(0, rows[x.op])

    (msg,) = evaluate([call.expr], leaf, call.dtype, indptr.device)
    msg = msg.expand(num_edges, call.width)
    return msg.reshape(num_edges, call.heads, call.width // call.heads).sum(-1) * call.scale


@register("edge_score_fwd", "ref")
def edge_score_fwd(indptr, indices, call: EdgeScoreCall, src, dst) -> torch.Tensor:
    """``[E, H]`` scores (see :func:`ngra.kernels.edge_score`)."""
    return _scores(indptr, indices, call, src, dst)


@register("edge_score_bwd", "ref")
def edge_score_bwd(indptr, indices, call: EdgeScoreCall, src, dst, grad, need):
    """Gradients by torch autograd through :func:`_scores`."""
    src_in = [t.detach().requires_grad_(n) for t, n in zip(src, need[0])]
    dst_in = [t.detach().requires_grad_(n) for t, n in zip(dst, need[1])]
    wanted = [t for t in src_in + dst_in if t.requires_grad]
    with torch.enable_grad():
        out = _scores(indptr, indices, call, src_in, dst_in)
        gs = torch.autograd.grad(out, wanted, grad, allow_unused=True) if wanted else ()
    it = iter(gs)
    res = [None if not t.requires_grad else (lambda g, t=t: torch.zeros_like(t) if g is None
                                                else g)(next(it))
           for t in src_in + dst_in]
    ns = len(src)
    return res[:ns], res[ns:]
