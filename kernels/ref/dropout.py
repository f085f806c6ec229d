"""Reference dropout: the counter-based mask in plain torch (the specification).

Element ``i`` of a flattened tensor is kept when ``mask_hash(i, s1, s2) >= thr``
with ``thr = round(p * 2**32)``: a 32-bit integer hash (two rounds of a
xorshift-multiply mixer) of the element's index and two 32-bit seeds drawn from
torch's generator. Every element's draw depends only on ``(i, s1, s2)``, so any
number of threads produce the same mask, and replaying torch's RNG state
replays the mask.

Attention dropout (:class:`ngra.kernels.dropout.EdgeDropout`) draws weight ``(j, h)``
of an ``H``-head softmax aggregation from the flat index ``counter[j] * H + h``
(:func:`edge_keep_scale`).
"""

from __future__ import annotations

import torch

from ngra.kernels.registry import register

M32 = 0xFFFFFFFF
C1, C2 = 0x7FEB352D, 0x846CA68B


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 ``x`` in ``[0, 2**32)`` without int64 overflow."""
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + ((hi * c) << 16)) & M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, C1)
    x = x ^ (x >> 15)
    x = _mul32(x, C2)
    return x ^ (x >> 16)


def mask_hash(idx: torch.Tensor, s1: int, s2: int) -> torch.Tensor:
    """The 32-bit draw of each flat element index (int64 in, int64 in ``[0, 2**32)`` out)."""
    return _mix32(_mix32((idx + s1) & M32) ^ s2)


def keep_mask(x: torch.Tensor, s1: int, s2: int, thr: int,
              base: torch.Tensor | None = None) -> torch.Tensor:
    """Bool ``[x.shape]``: the elements of ``x`` whose draw is ``>= thr``. Element ``i``
    (flat order) draws from index ``i``; with ``base`` (``[R]``, one per row), element
    ``c`` of row ``r`` draws from ``base[r] + c``."""
    if base is None:
        idx = torch.arange(x.numel(), device=x.device, dtype=torch.int64)
    else:
        row = x.numel() // x.shape[0] if x.shape[0] else 0
        idx = (base.view(-1, 1) + torch.arange(row, device=x.device, dtype=torch.int64)).view(-1)
    return (mask_hash(idx, s1, s2) >= thr).view(x.shape)


def edge_keep_scale(drop, heads: int, dtype: torch.dtype,
                    device: torch.device | None = None) -> torch.Tensor:
    """``[E, heads]`` of ``dtype``: ``1 / (1 - p)`` where ``drop`` (an ``EdgeDropout``)
    keeps weight ``(j, h)``, else 0; draw index ``counter[j] * heads + h``."""
    counter = drop.counters(device)
    idx = counter.long().unsqueeze(1) * heads + torch.arange(heads, device=counter.device)
    return (mask_hash(idx, drop.s1, drop.s2) >= drop.thr).to(dtype) * drop.scale


@register("dropout", "ref")
def dropout(x: torch.Tensor, s1: int, s2: int, thr: int, scale: float,
            base: torch.Tensor | None = None):
    """``x * mask * scale`` for a contiguous ``x``, ``mask`` the elements whose draw is ``>= thr``
    (by flat position, or from ``base``: see :func:`keep_mask`).

    Backward is this function applied to the gradient with the same seeds.
    """
    return x * keep_mask(x, s1, s2, thr, base) * scale


@register("dropout_mask", "ref")
def dropout_mask(x: torch.Tensor, s1: int, s2: int, thr: int, scale: float, out: torch.Tensor,
                 base: torch.Tensor | None = None):
    """:func:`dropout` of a contiguous ``x`` into ``out``, returning the mask for
    :func:`dropout_apply` (here a bool tensor; backends choose their own form)."""
    mask = keep_mask(x, s1, s2, thr, base)
    dropout_apply(x, mask, scale, out)
    return mask


@register("dropout_apply", "ref")
def dropout_apply(x: torch.Tensor, mask, scale: float, out: torch.Tensor) -> torch.Tensor:
    """``x * mask * scale`` into ``out`` with a mask from :func:`dropout_mask` (same shape as ``x``)."""
    return torch.mul(x * mask, scale, out=out)
