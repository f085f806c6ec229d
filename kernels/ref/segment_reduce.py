"""Reference segment reduction over sorted segments (plain torch)."""

from __future__ import annotations

import torch

from ngra.kernels.ref.util import dst_ids, scatter_extreme
from ngra.kernels.registry import register


@register("segment_reduce", "ref")
def segment_reduce(
    indptr: torch.Tensor, values: torch.Tensor, reduce: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``out[s] = reduce(values[indptr[s]:indptr[s+1]])`` for ``values`` [E, F].

    Empty segments give 0. For max/min also returns ``arg`` [S, F] int64, the row
    of the first extreme value (-1 for empty segments).
    """
    num_seg = indptr.numel() - 1
    seg = dst_ids(indptr)
    if reduce in ("sum", "mean"):
        out = values.new_zeros((num_seg,) + values.shape[1:]).index_add_(0, seg, values)
        if reduce == "mean":
            cnt = (indptr[1:] - indptr[:-1]).clamp(min=1).to(values.dtype)
            out = out / cnt.view(-1, 1)
        return out, None
    rows = torch.arange(values.shape[0], device=values.device)
    return scatter_extreme(seg, values, num_seg, reduce, rows)


@register("segment_reduce_backward", "ref")
def segment_reduce_backward(
    indptr: torch.Tensor, grad_out: torch.Tensor, arg: torch.Tensor | None, reduce: str,
    num_rows: int | None = None,
) -> torch.Tensor:
    """Gradient w.r.t. ``values`` [E, F]: copy back (sum), divided by the count
    (mean), or routed to the ``arg`` row (max/min). ``num_rows`` (``E``, when the caller
    knows it) is for backends that would otherwise read it back from the device."""
    seg = dst_ids(indptr)
    if reduce in ("sum", "mean"):
        g = grad_out
        if reduce == "mean":
            cnt = (indptr[1:] - indptr[:-1]).clamp(min=1).to(g.dtype)
            g = g / cnt.view(-1, 1)
        return g.index_select(0, seg)
    out = grad_out.new_zeros((seg.numel(),) + grad_out.shape[1:])
    if seg.numel() == 0:
        return out
    valid = arg >= 0
    return out.scatter_add_(0, arg.clamp(min=0), grad_out * valid)
