"""CUDA dropout: the reference's counter-based mask, as torch ops on the device."""

from __future__ import annotations

from ngra.kernels.gpu._util import require_cuda
from ngra.kernels.ref import dropout as _ref
from ngra.kernels.registry import register


@register("dropout", "gpu")
def dropout(x, s1, s2, thr, scale, base=None):
    """See :func:`ngra.kernels.ref.dropout.dropout` (same contract and mask)."""
    require_cuda(x)
    return _ref.dropout(x, s1, s2, thr, scale, base)


@register("dropout_mask", "gpu")
def dropout_mask(x, s1, s2, thr, scale, out, base=None):
    """See :func:`ngra.kernels.ref.dropout.dropout_mask`."""
    require_cuda(x)
    return _ref.dropout_mask(x, s1, s2, thr, scale, out, base)


@register("dropout_apply", "gpu")
def dropout_apply(x, mask, scale, out):
    """See :func:`ngra.kernels.ref.dropout.dropout_apply`."""
    require_cuda(x)
    return _ref.dropout_apply(x, mask, scale, out)
