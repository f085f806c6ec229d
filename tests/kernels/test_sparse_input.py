"""kernels/sparse_input.py: a Linear over mostly-zero inputs through a CSR copy equals
F.linear, forward and backward, and the copy is made only where it is reused."""

import gc

import pytest
import torch
import torch.nn.functional as F

from ngra.kernels import sparse_input
from ngra.kernels.sparse_input import MAX_DENSITY, MIN_BYTES, linear, sparse_form


def _sparse_x(rows=600, cols=700, density=0.01, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(rows, cols, generator=gen, dtype=dtype)
    return x * (torch.rand(rows, cols, generator=gen, dtype=dtype) < density)


def _weights(cols, out=24, dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out, cols, generator=gen, dtype=dtype, requires_grad=True)
    b = torch.randn(out, generator=gen, dtype=dtype, requires_grad=True)
    return w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_bias", [True, False])
def test_sparse_linear_equals_f_linear_forward_and_backward(dtype, with_bias):
    x = _sparse_x(dtype=dtype)
    assert x.numel() * x.element_size() >= MIN_BYTES
    w, b = _weights(x.shape[1], dtype=dtype)
    b = b if with_bias else None
    g = torch.randn(x.shape[0], w.shape[0], dtype=dtype)
    F.linear(x, w, b).backward(g)
    want = [F.linear(x, w, b).detach(), w.grad.clone()]
    want += [b.grad.clone()] if b is not None else []
    for call in range(2):  # the first call runs dense and remembers x; the second is sparse
        w.grad = None
        if b is not None:
            b.grad = None
        out = linear(x, w, b)
        assert (type(out.grad_fn).__name__ == "_SparseLinearBackward") == (call == 1)
        out.backward(g)
        got = [out.detach(), w.grad] + ([b.grad] if b is not None else [])
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e, rtol=tol, atol=tol)
    assert sparse_form(x) is not None


def test_the_copy_is_made_at_the_second_use_and_follows_changes():
    x = _sparse_x(seed=3)
    assert sparse_form(x) is None  # first sighting: dense
    csr, csr_t = sparse_form(x)
    assert torch.equal(csr.to_dense(), x) and torch.equal(csr_t.to_dense(), x.t())
    assert sparse_form(x)[0] is csr  # reused
    x[0, :5] = 2.0  # an in-place change: a new version
    w, _ = _weights(x.shape[1])
    assert sparse_form(x) is None  # seen again from scratch
    torch.testing.assert_close(linear(x, w), F.linear(x, w))
    torch.testing.assert_close(linear(x, w), F.linear(x, w))
    assert torch.equal(sparse_form(x)[0].to_dense(), x)


def test_dense_small_grad_requiring_or_mismatched_inputs_stay_dense():
    dense = torch.rand(600, 700) + 0.5
    for _ in range(3):
        assert sparse_form(dense) is None
    assert (dense != 0).float().mean() > MAX_DENSITY
    w, b = _weights(700)
    small = _sparse_x(rows=10, cols=700)
    needs = _sparse_x().requires_grad_()
    other = _sparse_x(dtype=torch.float64)
    for x in (small, needs):
        for _ in range(2):
            torch.testing.assert_close(linear(x, w, b), F.linear(x, w, b))
    assert not sparse_input._candidate(small, w)
    assert not sparse_input._candidate(needs, w)
    assert not sparse_input._candidate(other, w)
    out = linear(needs, w, b)
    out.sum().backward()  # the gradient reaches x on the dense path
    assert needs.grad is not None


def test_a_dead_tensor_leaves_no_entry():
    x = _sparse_x(seed=5)
    sparse_form(x)
    sparse_form(x)
    key = id(x)
    assert key in sparse_input._forms
    del x
    gc.collect()
    assert key not in sparse_input._forms


def test_a_dense_tensor_read_twice_is_judged_by_a_sample(monkeypatch):
    """An activation read by two Linears is new every forward: its second read must not
    count every entry (a strided sample shows it dense)."""
    sizes = []
    real = torch.count_nonzero
    monkeypatch.setattr(torch, "count_nonzero",
                        lambda t, *a: sizes.append(t.numel()) or real(t, *a))
    w, b = _weights(700)
    for _ in range(3):  # three forwards, each with a fresh activation read twice
        h = torch.rand(600, 700)
        linear(h, w, b)
        linear(h, w, b)
    assert sizes and max(sizes) <= 2 * sparse_input._SAMPLE
    x = _sparse_x(seed=7)
    sizes.clear()
    linear(x, w, b)
    linear(x, w, b)  # mostly zero: the sample passes, then the whole is counted once
    assert sizes == [sizes[0], x.numel()]
