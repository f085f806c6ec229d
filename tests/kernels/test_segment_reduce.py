"""Segment reduction: reference == loops; numba == reference (forward, backward); gradcheck."""

from __future__ import annotations

import itertools

import pytest
import torch
from graph_cases import CASES, graph_case
from kernel_testing import assert_same, max_degree, run

from ngra.kernels import segment_reduce, use_backend

pytestmark = pytest.mark.usefixtures("parallel_kernels")

REDUCES = ["sum", "mean", "max", "min"]
SHAPES = {"flat": (), "rows": (3,), "rows_3d": (2, 2)}
DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("reduce", REDUCES)
def test_ref_matches_loops(reduce, gen):
    indptr, indices, _ = graph_case("isolated", gen)
    values = torch.randn(indices.numel(), 3, dtype=torch.float64, generator=gen)
    with use_backend("ref"):
        out = segment_reduce(indptr, values, reduce)
    for s in range(indptr.numel() - 1):
        seg = values[int(indptr[s]) : int(indptr[s + 1])]
        if seg.shape[0] == 0:
            expected = torch.zeros(3, dtype=torch.float64)
        else:
            expected = {
                "sum": seg.sum(0),
                "mean": seg.mean(0),
                "max": seg.max(0).values,
                "min": seg.min(0).values,
            }[reduce]
        torch.testing.assert_close(out[s], expected)


def _matrix():
    """case x reduce x shape; the float dtype alternates."""
    for i, (case, reduce, shape) in enumerate(itertools.product(CASES, REDUCES, SHAPES)):
        dtype = DTYPES[i % 2]
        name = f"{case}-{reduce}-{shape}-{str(dtype).removeprefix('torch.')}"
        yield pytest.param(case, reduce, shape, dtype, id=name)


@pytest.mark.parametrize("case, reduce, shape, dtype", list(_matrix()))
def test_cpu_matches_ref(case, reduce, shape, dtype, gen):
    indptr, indices, _ = graph_case(case, gen)
    values = torch.randn((indices.numel(),) + SHAPES[shape], dtype=dtype, generator=gen)

    def fn(x):
        return segment_reduce(indptr, x, reduce)

    out_ref, grads_ref, grad_out = run("ref", fn, [values], gen=gen)
    out_cpu, grads_cpu, _ = run("cpu", fn, [values], grad_out)
    assert out_cpu.shape == (indptr.numel() - 1,) + values.shape[1:]
    assert_same([out_ref, *grads_ref], [out_cpu, *grads_cpu], dtype, max_degree(indptr))


@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_gradcheck(backend, reduce, gen):
    indptr = torch.tensor([0, 3, 3, 4, 8])
    # Distinct, well separated values: max/min are differentiable there.
    values = (torch.randperm(16, generator=gen).to(torch.float64) / 4).reshape(8, 2)

    def fn(x):
        with use_backend(backend):
            return segment_reduce(indptr, x, reduce)

    assert torch.autograd.gradcheck(fn, (values.requires_grad_(),), fast_mode=True)


@pytest.mark.parametrize("case", ["random", "empty", "isolated", "self_loops", "skewed"])
@pytest.mark.parametrize("reduce", REDUCES)
def test_gpu_matches_ref(case, reduce, gen):
    """The gpu backend (Triton's interpreter on CPU tensors here): the g-SpMM walk with
    each row its own source forward, device-side segment ids backward."""
    indptr, indices, _ = graph_case(case, gen)
    values = torch.randn((indices.numel(), 2, 3), dtype=torch.float64, generator=gen)

    def fn(x):
        return segment_reduce(indptr, x, reduce)

    out_ref, grads_ref, grad_out = run("ref", fn, [values], gen=gen)
    out_gpu, grads_gpu, _ = run("gpu", fn, [values], grad_out)
    assert out_gpu.shape == (indptr.numel() - 1, 2, 3)
    assert_same([out_ref, *grads_ref], [out_gpu, *grads_gpu], torch.float64,
                max_degree(indptr))
