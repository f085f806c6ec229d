"""Readouts against a plain-torch reference (index_add / scatter_reduce), forward and
backward (gradcheck on doubles), with empty graphs in the batch."""

from __future__ import annotations

import pytest
import torch

from ngra.kernels import use_backend
from ngra.models import AttentionPool, MaxPool, MeanPool, SumPool, readout


def reference(x: torch.Tensor, ptr: torch.Tensor, kind: str) -> torch.Tensor:
    """Plain torch: the segment of each row, then index_add (sum, mean) or scatter amax."""
    counts = torch.diff(ptr)
    seg = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    out = x.new_zeros(counts.numel(), x.shape[1])
    if kind == "max":
        idx = seg.view(-1, 1).expand_as(x)
        return out.scatter_reduce(0, idx, x, "amax", include_self=False)
    out = out.index_add(0, seg, x)
    return out / counts.clamp(min=1).view(-1, 1).to(x.dtype) if kind == "mean" else out


def reference_attention(x, ptr, gate):
    counts = torch.diff(ptr)
    seg = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    score = gate(x).view(-1)
    top = torch.full((counts.numel(),), -torch.inf, dtype=x.dtype)
    top = top.scatter_reduce(0, seg, score, "amax")
    w = torch.exp(score - top[seg])
    w = w / torch.zeros_like(top).index_add(0, seg, w)[seg]
    return x.new_zeros(counts.numel(), x.shape[1]).index_add(0, seg, w.view(-1, 1) * x)


PTRS = [torch.tensor([0, 3, 3, 7, 8]), torch.tensor([0, 0]), torch.tensor([0, 5])]


@pytest.mark.parametrize("ptr", PTRS, ids=["mixed-with-empty", "one-empty", "one"])
@pytest.mark.parametrize("kind", ["sum", "mean", "max"])
@pytest.mark.parametrize("backend", ["ref", "cpu", "gpu"])  # gpu: Triton (interpreted on CPU)
def test_readout_matches_reference_and_gradcheck(kind, ptr, backend):
    with use_backend(backend):
        _check_readout(kind, ptr)


def _check_readout(kind, ptr):
    x = torch.randn(int(ptr[-1]), 4, dtype=torch.float64, requires_grad=True)
    out = readout(x, ptr, kind)
    torch.testing.assert_close(out, reference(x, ptr, kind))
    empty = torch.diff(ptr) == 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))  # empty graphs read out 0
    g = torch.randn_like(out)
    (ours,) = torch.autograd.grad(out, x, g)
    (ref,) = torch.autograd.grad(reference(x, ptr, kind), x, g)
    torch.testing.assert_close(ours, ref)
    if x.numel():
        assert torch.autograd.gradcheck(lambda t: readout(t, ptr, kind), (x,))


def test_pool_modules():
    x, ptr = torch.randn(8, 3), PTRS[0]
    for module, kind in ((SumPool(), "sum"), (MeanPool(), "mean"), (MaxPool(), "max")):
        torch.testing.assert_close(module(x, ptr), reference(x, ptr, kind))


def test_attention_pool_matches_reference_and_gradcheck():
    torch.manual_seed(0)
    ptr = PTRS[0]
    pool = AttentionPool(4).double()
    x = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
    out = pool(x, ptr)
    torch.testing.assert_close(out, reference_attention(x, ptr, pool.gate))
    assert torch.equal(out[1], torch.zeros(4, dtype=torch.float64))
    assert torch.autograd.gradcheck(lambda t: pool(t, ptr), (x,))
    params = tuple(p.detach().clone().requires_grad_() for p in pool.gate.parameters())

    def through_gate(w, b):
        return torch.func.functional_call(pool, {"gate.weight": w, "gate.bias": b}, (x, ptr))

    assert torch.autograd.gradcheck(through_gate, params)


def test_bad_arguments_say_what_was_expected():
    x = torch.randn(5, 2)
    with pytest.raises(ValueError, match="ptr\\[-1\\] must equal the number of node rows: x has 5"):
        readout(x, torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="one of \\('sum', 'mean', 'max'\\); got 'min'"):
        readout(x, torch.tensor([0, 5]), "min")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_readouts_of_a_batch_on_cuda_match_cpu():
    from ngra.datasets import GraphDataset, collate

    ds = GraphDataset.from_edges("t", [0, 1, 3], [1, 0, 4], [0, 2, 2, 5], [0, 1, 0],
                                 torch.randn(5, 3))
    batch = collate(ds, [2, 1, 0])
    on_gpu = batch.to("cuda")
    pool = AttentionPool(3)
    for kind in ("sum", "mean", "max"):
        torch.testing.assert_close(readout(on_gpu.x, on_gpu.ptr, kind).cpu(),
                                   readout(batch.x, batch.ptr, kind))
    torch.testing.assert_close(pool.cuda()(on_gpu.x, on_gpu.ptr).cpu(),
                               pool.cpu()(batch.x, batch.ptr))
