"""pair_bce == binary cross-entropy of the gathered rows' dot products (plain torch
autograd), forward and backward, on ref and numba, over labeled graph cases, both index
dtypes, both labels; gradcheck; errors that name the input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graph_cases import square_graph

from ngra.kernels import pair_bce, use_backend

pytestmark = pytest.mark.usefixtures("parallel_kernels")

CASES = ["random", "isolated", "empty", "self_loops", "multi_edges", "skewed"]


def _oracle(z, indptr, indices, label, scale):
    dst = torch.repeat_interleave(indptr[1:] - indptr[:-1])
    s = (z[indices.long()] * z[dst]).sum(-1)
    y = torch.full_like(s, float(label))
    return F.binary_cross_entropy_with_logits(s, y, reduction="sum") * scale


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("label", [0, 1])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pair_bce_equals_gathered_rows(backend, case, label, index_dtype, dtype):
    gen = torch.Generator().manual_seed(hash((case, label)) % 2**31)
    g = square_graph(case, 40, gen)
    indptr, indices = g.indptr.long(), g.indices.to(index_dtype)
    z = torch.randn(40, 6, dtype=dtype, generator=gen) * 2
    scale = 1.0 / max(indices.numel(), 1)
    w = torch.randn((), dtype=dtype, generator=gen)
    zz = z.clone().requires_grad_()
    with use_backend(backend):
        got = pair_bce(indptr, indices, zz, label=label, scale=scale)
        (g_got,) = torch.autograd.grad(got * w, zz)
    zo = z.clone().requires_grad_()
    want = _oracle(zo, indptr, indices, label, scale)
    (g_want,) = torch.autograd.grad(want * w, zo)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(g_got, g_want, **tol)


def test_pair_bce_is_stable_for_large_scores_and_gradchecks():
    g = square_graph("random", 30, torch.Generator().manual_seed(0))
    indptr, indices = g.indptr.long(), g.indices.long()
    z = torch.randn(30, 3, dtype=torch.float64)
    with use_backend("cpu"):
        big = pair_bce(indptr, indices, z * 100, label=0)  # scores ~1e4: no inf/nan
        assert torch.isfinite(big) and float(big) > 0
        zz = z.clone().requires_grad_()
        assert torch.autograd.gradcheck(
            lambda t: pair_bce(indptr, indices, t, label=1, scale=0.5), (zz,))


def test_pair_bce_errors_name_the_input():
    indptr, indices = torch.tensor([0, 1, 2]), torch.tensor([1, 0])
    z = torch.randn(2, 4)
    with pytest.raises(ValueError, match="label must be 0 or 1"):
        pair_bce(indptr, indices, z, label=2)
    with pytest.raises(ValueError, match=r"2 destinations; z has 3 rows"):
        pair_bce(indptr, indices, torch.randn(3, 4), label=1)
    with pytest.raises(ValueError, match=r"z must be \[N, F\]"):
        pair_bce(indptr, indices, torch.randn(2, 4, 1), label=1)
