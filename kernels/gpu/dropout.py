"""Triton dropout: the reference's counter-based mask hashed in registers, nothing stored.

One program per ``ELEMS_PER_PROGRAM`` elements of the flattened tensor computes each element's
32-bit draw (``ref.dropout.mask_hash``: two xorshift-multiply rounds on uint32, whose
multiplies wrap as the reference's ``mod 2**32``) from its flat index, or from
``base[row] + column`` under :func:`ngra.kernels.dropout.dropout_rows`, and writes
``x * scale`` where the draw is ``>= thr``, else 0. The only memory touched is ``x``
and the output: the reference's formulation (kept by this backend before) made about
seven ``int64`` tensors of ``x``'s size per call, four of them alive at once, which on
a GCN's ``[N, 64]`` float32 input is 8x the input at the step's peak.

The mask handed from ``dropout_mask`` to ``dropout_apply`` (this backend's form, see
:func:`ngra.kernels.ref.dropout.dropout_mask`) is the seeds themselves: applying it
hashes again, so a ``dropout_linear`` forward keeps no per-element mask for its backward.
Seeds are Python ints or 0-dim int64 device tensors (:func:`ngra.kernels.dropout.
seed_device`); the kernel loads them, with the threshold, from one ``[3]`` int64 tensor
(an int argument of value 1 would be specialized to a constant).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ngra.kernels.gpu.util import require_cuda
from ngra.kernels.registry import register

__all__ = ["SeedMask", "mix32"]

#: Elements per program.
ELEMS_PER_PROGRAM = 1024


@triton.jit
def mix32(x):
    """The dropout hash's mixing round on uint32 (wrapping multiplies)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _dropout(x, out, base, seeds, scale, n, row, HAS_BASE: tl.constexpr,
             BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    if HAS_BASE:
        r = i // row
        idx = tl.load(base + r, mask=m, other=0) + (i - r * row)
    else:
        idx = i
    h = mix32((idx + tl.load(seeds)).to(tl.uint32))  # the low 32 bits: (i + s1) mod 2**32
    h = mix32(h ^ tl.load(seeds + 1).to(tl.uint32))
    keep = h.to(tl.int64) >= tl.load(seeds + 2)
    v = tl.load(x + i, mask=m, other=0.0)
    tl.store(out + i, tl.where(keep, v * tl.load(scale), 0.0), mask=m)


class SeedMask(NamedTuple):
    """This backend's dropout mask: what draws it again. ``seeds``: ``[3]`` int64
    ``(s1, s2, thr)`` on the data's device; ``base``: ``[R]`` row bases or ``None``."""

    seeds: torch.Tensor
    base: torch.Tensor | None


def _seeds(x: torch.Tensor, s1, s2, thr: int) -> torch.Tensor:
    if isinstance(s1, torch.Tensor):  # drawn on the device: no host copy
        return torch.stack([s1.reshape(()), torch.as_tensor(s2).to(s1).reshape(()),
                            s1.new_full((), thr)])
    return torch.tensor([s1, s2, thr], dtype=torch.int64, device=x.device)


def _launch(x: torch.Tensor, mask: SeedMask, scale: float, out: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    if n == 0:
        return out
    row = n // x.shape[0] if mask.base is not None else 1
    base = mask.base if mask.base is not None else mask.seeds
    _dropout[(triton.cdiv(n, ELEMS_PER_PROGRAM),)](
        x, out, base, mask.seeds, x.new_full((1,), scale), n, row,
        HAS_BASE=mask.base is not None, BLOCK=ELEMS_PER_PROGRAM)
    return out


@register("dropout", "gpu")
def dropout(x, s1, s2, thr, scale, base=None):
    """See :func:`ngra.kernels.ref.dropout.dropout` (same contract and mask)."""
    require_cuda(x, base)
    return _launch(x, SeedMask(_seeds(x, s1, s2, thr), base), scale, torch.empty_like(x))


@register("dropout_mask", "gpu")
def dropout_mask(x, s1, s2, thr, scale, out, base=None):
    """See :func:`ngra.kernels.ref.dropout.dropout_mask`; the mask is a :class:`SeedMask`."""
    require_cuda(x, out, base)
    mask = SeedMask(_seeds(x, s1, s2, thr), base)
    _launch(x, mask, scale, out)
    return mask


@register("dropout_apply", "gpu")
def dropout_apply(x, mask, scale, out):
    """See :func:`ngra.kernels.ref.dropout.dropout_apply`: draws ``mask`` (a
    :class:`SeedMask`) again."""
    require_cuda(x, out)
    return _launch(x, mask, scale, out)
