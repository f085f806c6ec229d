"""CUDA segment reduction without a host round trip.

Forward is the g-SpMM walk with each row its own source (:func:`ngra.kernels.gpu.gspmm.
segment_rows`: one program per (segment, column block), no ``[E]`` segment ids, no
atomics); backward copies each segment's gradient to its rows (sum, mean) or routes it
to the arg-extreme row (max, min) with torch's kernels, the segment ids made on the
device with the row count the forward saw (``num_rows``), so nothing reads a size back
from the device (the reference's ``repeat_interleave`` does, and waits for it).
"""

from __future__ import annotations

import torch

from ngra.kernels.gpu.gspmm import segment_rows
from ngra.kernels.gpu.util import require_cuda
from ngra.kernels.registry import register


@register("segment_reduce", "gpu")
def segment_reduce(indptr, values, reduce):
    """See :func:`ngra.kernels.ref.segment_reduce.segment_reduce`."""
    require_cuda(indptr, values)
    return segment_rows(indptr, values.contiguous(), reduce)


@register("segment_reduce_backward", "gpu")
def segment_reduce_backward(indptr, grad_out, arg, reduce, num_rows=None):
    """See :func:`ngra.kernels.ref.segment_reduce.segment_reduce_backward`."""
    require_cuda(indptr, grad_out, arg)
    counts = indptr[1:] - indptr[:-1]
    if reduce in ("sum", "mean"):
        g = grad_out
        if reduce == "mean":
            g = g / counts.clamp(min=1).to(g.dtype).view(-1, 1)
        seg = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device),
                                      counts, output_size=num_rows)
        return g.index_select(0, seg)
    rows = int(indptr[-1]) if num_rows is None else num_rows
    out = grad_out.new_zeros((rows,) + tuple(grad_out.shape[1:]))
    if rows == 0:
        return out
    valid = arg >= 0
    return out.scatter_add_(0, arg.clamp(min=0), grad_out * valid)
