"""``rowdot``: ``(x * w).sum(-1)`` for a per-row tensor ``x`` and a row-independent ``w``,
with no ``x``-sized temporary.

GAT's attention scores are the example: ``(h * a_src).sum(-1)`` with ``h`` ``[N, H, D]``
and ``a_src`` ``[H, D]``. Written out, torch makes the ``[N, H, D]`` product in forward
and, in backward, both ``g * a_src`` (the input gradient, which is wanted) and
``g * h`` (summed over rows into the weight gradient, which is ``[H, D]``). Here the
forward and the weight gradient are matrix products that read ``x`` in place; the only
``x``-sized tensor made is the input gradient. The compiler's ``contract`` pass lowers
the written-out form to this op.

Plain torch (no backend kernels): it runs on any device ``x`` and ``w`` share.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.checks import check_feat
from ngra.kernels.lean import broadcast_shape

__all__ = ["check_row_weight", "rowdot"]


def rowdot(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``(x * w).sum(-1)``, where ``w`` is the same for every row of ``x``.

    Args:
        x: ``[N, *S, D]`` float tensor (at least 2-D).
        w: float tensor of ``x``'s dtype and device that broadcasts to ``[*S, D]``
            (at most ``x.dim() - 1`` dims, or ``x.dim()`` with a leading 1), e.g.
            ``[H, D]``, ``[D]``, ``[H, 1]`` or ``[1, H, D]``.

    Returns:
        ``[N, *S]``, differentiable in ``x`` and ``w``.

    Raises:
        TypeError: non-tensors, non-float or mixed dtypes.
        ValueError: ``x`` below 2-D, or ``w`` not broadcastable to ``x.shape[1:]``.
    """
    x = check_feat(x, "x")
    if x.dim() < 2:
        raise ValueError(f"x must be [N, ..., D] with at least 2 dims; got shape {list(x.shape)}.")
    return _RowDot.apply(x, check_row_weight(x, w, "w"))


def check_row_weight(x: torch.Tensor, w: torch.Tensor, name: str) -> torch.Tensor:
    """``w`` checked to be one weight for every row of ``x`` (as :func:`rowdot` takes it),
    with a leading row dim of 1 dropped."""
    w = check_feat(w, name)
    if w.dtype != x.dtype or w.device != x.device:
        raise TypeError(f"{name} must match x's dtype and device ({x.dtype}, {x.device}); got "
                        f"{w.dtype} on {w.device}.")
    if w.dim() == x.dim() and w.shape[0] == 1:
        w = w.squeeze(0)  # a leading row dim of 1 broadcasts over rows too
    if w.dim() > x.dim() - 1:
        raise ValueError(f"{name} must be the same for every row: at most {x.dim() - 1} dims (or "
                         f"a leading 1) for x of shape {list(x.shape)}; got shape "
                         f"{list(w.shape)}.")
    try:
        fits = broadcast_shape(w.shape, x.shape[1:]) == x.shape[1:]
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"{name} of shape {list(w.shape)} does not broadcast to x's per-row "
                         f"shape {list(x.shape[1:])}.")
    return w


class _RowDot(torch.autograd.Function):
    """Forward and both gradients as GEMMs over ``x`` viewed ``[N, H * D]`` against the
    block-diagonal ``[H, H * D]`` of the weight rows: ``H`` times the multiply-adds of
    the element-wise form (``H`` is a head count, a handful), no copy of ``x``."""

    @staticmethod
    def forward(ctx, x, w):  # type: ignore[override]
        n, d = x.shape[0], x.shape[-1]
        heads = math.prod(x.shape[1:-1])
        xs = x.contiguous().view(n, heads * d)                   # [N, H * D]
        blocks = torch.block_diag(*w.expand(x.shape[1:]).reshape(heads, d))  # [H, H * D]
        ctx.save_for_backward(xs, blocks)
        ctx.w_shape, ctx.x_shape = w.shape, x.shape
        return (xs @ blocks.t()).view(x.shape[:-1])

    @staticmethod
    @once_differentiable
    def backward(ctx, g):  # type: ignore[override]
        xs, blocks = ctx.saved_tensors
        n, heads = xs.shape[0], blocks.shape[0]
        gs = g.reshape(n, heads)
        gx = gw = None
        if ctx.needs_input_grad[0]:
            # written into a base tensor, not returned as a view of the product: autograd
            # then adds the other gradients of x into it in place
            gx = xs.new_empty(ctx.x_shape)
            torch.mm(gs, blocks, out=gx.view(n, blocks.shape[1]))
        if ctx.needs_input_grad[1]:
            full = (gs.t() @ xs).view(heads, heads, -1)            # [H, H, D]; row h, block h
            gw = full.diagonal(dim1=0, dim2=1).t().reshape(ctx.x_shape[1:])
            gw = gw.sum_to_size(ctx.w_shape)
        return gx, gw
