"""Edge softmax: reference == per-destination torch.softmax; numba == reference; gradcheck."""

from __future__ import annotations

import pytest
import torch
from graph_cases import CASES, graph_case
from kernel_testing import assert_same, max_degree, run

from ngra.kernels import edge_softmax, use_backend

pytestmark = pytest.mark.usefixtures("parallel_kernels")

SHAPES = {"flat": (), "heads": (3,), "heads_3d": (2, 2)}
DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_ref_matches_per_destination_softmax(shape, gen):
    indptr, indices, _ = graph_case("skewed", gen)
    scores = torch.randn((indices.numel(),) + SHAPES[shape], dtype=torch.float64, generator=gen)
    with use_backend("ref"):
        p = edge_softmax(indptr, scores)
    for v in range(indptr.numel() - 1):
        lo, hi = int(indptr[v]), int(indptr[v + 1])
        if hi > lo:
            torch.testing.assert_close(p[lo:hi], torch.softmax(scores[lo:hi], 0))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("case", list(CASES))
def test_cpu_matches_ref(case, shape, dtype, gen):
    indptr, indices, _ = graph_case(case, gen)
    scores = 3 * torch.randn((indices.numel(),) + SHAPES[shape], dtype=dtype, generator=gen)

    def fn(s):
        return edge_softmax(indptr, s)

    out_ref, grads_ref, grad_out = run("ref", fn, [scores], gen=gen)
    out_cpu, grads_cpu, _ = run("cpu", fn, [scores], grad_out)
    assert_same([out_ref, *grads_ref], [out_cpu, *grads_cpu], dtype, max_degree(indptr))


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_large_scores_stay_finite_and_normalized(backend, gen):
    indptr, indices, _ = graph_case("multi_edges", gen)
    scores = 1000.0 + 50 * torch.randn(indices.numel(), 2, generator=gen)
    with use_backend(backend):
        p = edge_softmax(indptr, scores)
    assert torch.isfinite(p).all()
    deg = indptr[1:] - indptr[:-1]
    sums = torch.zeros(deg.numel(), 2).index_add_(0, torch.repeat_interleave(deg), p)
    torch.testing.assert_close(sums[deg > 0], torch.ones_like(sums[deg > 0]))


@pytest.mark.parametrize("shape", ["flat", "heads"])
@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_gradcheck(backend, shape, gen):
    indptr, indices, _ = graph_case("isolated", gen)
    scores = torch.randn((indices.numel(),) + SHAPES[shape], dtype=torch.float64, generator=gen)

    def fn(s):
        with use_backend(backend):
            return edge_softmax(indptr, s)

    assert torch.autograd.gradcheck(fn, (scores.requires_grad_(),), fast_mode=True)
