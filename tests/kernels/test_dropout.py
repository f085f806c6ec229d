"""Dropout: numba == reference mask, F.dropout's distribution, replayable, clear errors."""

from __future__ import annotations


import pytest
import torch

from ngra.kernels import dropout, use_backend

pytestmark = pytest.mark.usefixtures("parallel_kernels")


def _run(backend: str, x: torch.Tensor, p: float, seed: int = 0):
    x = x.detach().requires_grad_()
    torch.manual_seed(seed)
    with use_backend(backend):
        y = dropout(x, p)
    g = torch.randn_like(y)
    y.backward(g)
    return y.detach(), x.grad, g


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(0,), (7,), (300, 5), (70_000, 3), (4, 3, 50_000)])
def test_cpu_matches_reference(dtype, shape):
    x = torch.randn(shape, dtype=dtype)
    y_ref, gx_ref, _ = _run("ref", x, 0.3)
    y_cpu, gx_cpu, _ = _run("cpu", x, 0.3)
    assert torch.equal(y_cpu, y_ref) and torch.equal(gx_cpu, gx_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(0,), (7,), (300, 5), (3, 1000)])
def test_gpu_matches_reference(dtype, shape):
    """The Triton kernel (in the interpreter without CUDA) hashes the reference's mask."""
    x = torch.randn(shape, dtype=dtype)
    y_ref, gx_ref, _ = _run("ref", x, 0.3)
    y_gpu, gx_gpu, _ = _run("gpu", x, 0.3)
    assert torch.equal(y_gpu, y_ref) and torch.equal(gx_gpu, gx_ref)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_distribution_and_scaling(p):
    x = torch.rand(1_000_000) + 0.5  # no zeros: kept <=> nonzero
    y, gx, g = _run("cpu", x, p, seed=int(p * 10))
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.003
    torch.testing.assert_close(y[kept], x[kept] / (1 - p))
    torch.testing.assert_close(gx, torch.where(kept, g / (1 - p), torch.zeros_like(g)))
    # neighbouring elements draw independently (the hash mixes consecutive indices)
    a, b = kept[:-1].float(), kept[1:].float()
    corr = ((a - a.mean()) * (b - b.mean())).mean() / (a.std() * b.std())
    assert abs(corr.item()) < 0.01


def test_replayable_and_thread_independent():
    x = torch.randn(200_000)
    first = _run("cpu", x, 0.5, seed=3)[0]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = _run("cpu", x, 0.5, seed=3)[0]
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(first, single)
    torch.manual_seed(3)
    state = torch.get_rng_state()
    a = dropout(x, 0.5)
    b = dropout(x, 0.5)  # the generator moved on: a new mask
    torch.set_rng_state(state)
    assert torch.equal(dropout(x, 0.5), a) and not torch.equal(a, b)


def test_identity_cases_and_p_one():
    x = torch.randn(10, 4, requires_grad=True)
    assert dropout(x, 0.0) is x and dropout(x, 0.7, training=False) is x
    y = dropout(x, 1.0)
    y.sum().backward()
    assert not y.any() and not x.grad.any()


def test_gradcheck():
    x = torch.randn(40, 3, dtype=torch.float64, requires_grad=True)

    def fn(t):
        torch.manual_seed(0)
        return dropout(t, 0.4)

    assert torch.autograd.gradcheck(fn, (x,))


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan"), "0.5", True])
def test_bad_probability_is_a_clear_error(p):
    with pytest.raises(ValueError, match="dropout probability must be a number in"):
        dropout(torch.randn(3), p)


def test_bad_input_is_a_clear_error():
    with pytest.raises(TypeError, match="float32 or float64"):
        dropout(torch.arange(5), 0.5)


# ------------------------------------------------------------- no mask is stored
def test_backward_regenerates_the_mask_from_the_seeds():
    x = torch.rand(70_000, 3) + 0.5
    y, gx, g = _run("cpu", x, 0.4, seed=5)
    assert torch.equal(gx != 0, y != 0)  # the same elements, from the seeds alone
    torch.testing.assert_close(gx, torch.where(y != 0, g / 0.6, torch.zeros_like(g)))
