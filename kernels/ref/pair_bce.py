"""Reference ``pair_bce``: plain torch over gathered rows (the specification)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ngra.kernels.ref.util import dst_ids
from ngra.kernels.registry import register


@register("pair_bce", "ref")
def pair_bce(z: torch.Tensor, pos_indptr: torch.Tensor, pos_indices: torch.Tensor,
             neg_indptr: torch.Tensor, neg_indices: torch.Tensor, scale: float,
             grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(loss, d loss / d z or None)`` (:mod:`ngra.kernels.pair_bce`)."""
    loss = z.new_zeros(())
    gz = torch.zeros_like(z) if grad else None
    for indptr, indices, label in ((pos_indptr, pos_indices, 1), (neg_indptr, neg_indices, 0)):
        src = indices.long()
        dst = dst_ids(indptr).to(z.device)
        zs, zd = z.index_select(0, src), z.index_select(0, dst)
        s = (zs * zd).sum(-1)
        loss = loss + (F.softplus(-s) if label else F.softplus(s)).sum() * scale
        if grad:
            coef = ((torch.sigmoid(s) - label) * scale)[:, None]
            gz.index_add_(0, dst, coef * zs).index_add_(0, src, coef * zd)
    return loss, gz
