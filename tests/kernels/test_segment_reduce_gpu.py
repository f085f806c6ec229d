"""Segment reduction on a real CUDA device: equal to the reference, and no host waits.

The interpreter tests (``test_segment_reduce.py``) check the values on CPU tensors; here
the compiled kernel runs, forward and backward, under ``torch.cuda.set_sync_debug_mode``
("error"), which raises on any operation that makes the host wait for the device (the
reference's ``repeat_interleave`` reads its output size back), after one call that
validates the offsets and autotunes (both read from the device once).
"""

from __future__ import annotations

import pytest
import torch

from ngra.kernels import segment_reduce, use_backend

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
def test_matches_ref_without_host_waits(reduce):
    gen = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 40, (200,), generator=gen)
    counts[::17] = 0  # empty segments
    indptr = torch.zeros(201, dtype=torch.int64)
    torch.cumsum(counts, 0, out=indptr[1:])
    values = torch.randn(int(indptr[-1]), 3, 5, generator=gen, dtype=torch.float64)
    grad = torch.randn(200, 3, 5, generator=gen, dtype=torch.float64)
    x = values.clone().requires_grad_()
    with use_backend("ref"):
        ref = segment_reduce(indptr, x, reduce)
    ref.backward(grad)
    ip, xd = indptr.cuda(), values.cuda().requires_grad_()
    g = grad.cuda()
    with use_backend("gpu"):  # once first: the offsets' validation (cached for this tensor)
        segment_reduce(ip, xd, reduce).backward(g)  # and Triton's autotuning read back
    xd.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with use_backend("gpu"):
            out = segment_reduce(ip, xd, reduce)
            out.backward(g)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(xd.grad.cpu(), x.grad, rtol=1e-9, atol=1e-10)
