"""Reference ``pair_bce``: plain torch over gathered rows (the specification)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ngra.kernels.ref.util import dst_ids
from ngra.kernels.registry import register


@register("pair_bce", "ref")
def pair_bce(indptr: torch.Tensor, indices: torch.Tensor, z: torch.Tensor, label: int,
             scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, coef [P], gdst [N, F])`` (:mod:`ngra.kernels.pair_bce`)."""
    src = indices.long()
    dst = dst_ids(indptr).to(z.device)
    s = (z.index_select(0, src) * z.index_select(0, dst)).sum(-1)
    loss = (F.softplus(-s) if label else F.softplus(s)).sum() * scale
    coef = (torch.sigmoid(s) - label) * scale
    gdst = torch.zeros_like(z).index_add_(0, dst, coef[:, None] * z.index_select(0, src))
    return loss, coef, gdst
