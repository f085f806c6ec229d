"""pair_bce == binary cross-entropy of the gathered rows' dot products (plain torch
autograd), forward and backward, on ref and numba, over labeled graph cases, both index
dtypes, positives, negatives and both at once; gradcheck; errors that name the input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graph_cases import square_graph

from ngra.kernels import pair_bce, use_backend

pytestmark = pytest.mark.usefixtures("parallel_kernels")

CASES = ["random", "isolated", "empty", "self_loops", "multi_edges", "skewed"]


def _oracle(z, sets, scale):
    total = z.new_zeros(())
    for (indptr, indices), label in zip(sets, (1, 0)):
        if indptr is None:
            continue
        dst = torch.repeat_interleave(indptr[1:] - indptr[:-1])
        s = (z[indices.long()] * z[dst]).sum(-1)
        y = torch.full_like(s, float(label))
        total = total + F.binary_cross_entropy_with_logits(s, y, reduction="sum")
    return total * scale


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("which", ["pos", "neg", "both"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pair_bce_equals_gathered_rows(backend, case, which, index_dtype, dtype):
    gen = torch.Generator().manual_seed(hash((case, which)) % 2**31)
    n = 70  # > 2 blocks of 32 rows: both threads own sources
    g = square_graph(case, n, gen)
    h = square_graph("random" if case == "empty" else "skewed", n, gen)
    pos = (g.indptr.long(), g.indices.to(index_dtype))
    neg = (h.indptr.long(), h.indices.to(index_dtype))
    sets = [pos if which != "neg" else (None, None), neg if which != "pos" else (None, None)]
    z = torch.randn(n, 6, dtype=dtype, generator=gen) * 2
    scale = 1.0 / max(g.num_edges + h.num_edges, 1)
    w = torch.randn((), dtype=dtype, generator=gen)
    zz = z.clone().requires_grad_()
    with use_backend(backend):
        got = pair_bce(zz, *[None if s[0] is None else s for s in sets], scale=scale)
        (g_got,) = torch.autograd.grad(got * w, zz)
    zo = z.clone().requires_grad_()
    want = _oracle(zo, sets, scale)
    (g_want,) = torch.autograd.grad(want * w, zo)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(g_got, g_want, **tol)


def test_pair_bce_is_stable_for_large_scores_and_gradchecks():
    g = square_graph("random", 70, torch.Generator().manual_seed(0))
    h = square_graph("skewed", 70, torch.Generator().manual_seed(1))
    pos, neg = (g.indptr.long(), g.indices.long()), (h.indptr.long(), h.indices.long())
    z = torch.randn(70, 3, dtype=torch.float64)
    with use_backend("cpu"):
        big = pair_bce(z * 100, None, neg)  # scores ~1e4: no inf/nan
        assert torch.isfinite(big) and float(big) > 0
        zz = z.clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda t: pair_bce(t, pos, neg, scale=0.5), (zz,))


def test_pair_bce_without_pairs_is_zero_and_differentiable():
    z = torch.randn(5, 3, requires_grad=True)
    loss = pair_bce(z)
    loss.backward()
    assert float(loss.detach()) == 0 and torch.equal(z.grad, torch.zeros(5, 3))


def test_pair_bce_errors_name_the_input():
    indptr, indices = torch.tensor([0, 1, 2]), torch.tensor([1, 0])
    z = torch.randn(2, 4)
    with pytest.raises(ValueError, match="neg must be an"):
        pair_bce(z, None, indptr)
    with pytest.raises(ValueError, match=r"pos indptr covers 2 destinations; z has 3 rows"):
        pair_bce(torch.randn(3, 4), (indptr, indices))
    with pytest.raises(ValueError, match=r"z must be \[N, F\]"):
        pair_bce(torch.randn(2, 4, 1), (indptr, indices))
    with pytest.raises(ValueError, match=r"neg indices"):
        pair_bce(z, None, (indptr, torch.tensor([0, 5])))
