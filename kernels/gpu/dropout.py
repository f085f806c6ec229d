"""CUDA dropout: the reference's counter-based mask, as torch ops on the device."""

from __future__ import annotations

from ngra.kernels.gpu._util import require_cuda
from ngra.kernels.ref import dropout as _ref
from ngra.kernels.registry import register


@register("dropout", "gpu")
def dropout(x, s1, s2, thr, scale):
    """See :func:`ngra.kernels.ref.dropout.dropout` (same contract and mask)."""
    require_cuda(x)
    return _ref.dropout(x, s1, s2, thr, scale)
