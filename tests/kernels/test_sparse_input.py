"""kernels/sparse_input.py: a Linear over mostly-zero inputs equals F.linear, forward and
backward; its forward sums in one fixed order (the same bits at a first call, which scans
the dense tensor, at later calls through a CSR copy, on any thread count, cpu == ref), and
the copy is made only where it is reused."""

import gc

import pytest
import torch
import torch.nn.functional as F

from ngra.kernels import sparse_input, use_backend
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
    outs = []
    for _ in range(2):  # the first call scans x and remembers it; the second reads a CSR copy
        w.grad = None
        if b is not None:
            b.grad = None
        out = linear(x, w, b)
        assert type(out.grad_fn).__name__ == "_NonZeroLinearBackward"
        out.backward(g)
        outs.append(out.detach())
        got = [out.detach(), w.grad] + ([b.grad] if b is not None else [])
        tol = 1e-5 if dtype == torch.float32 else 1e-12
        for a, e in zip(got, want):
            torch.testing.assert_close(a, e, rtol=tol, atol=tol)
    assert torch.equal(outs[0], outs[1])
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


def _order_reference(x, w, b):
    """The fixed order in plain Python: each row from zero, its non-zeros by column."""
    out = torch.zeros(x.shape[0], w.shape[0], dtype=x.dtype)
    for r in range(x.shape[0]):
        for c in x[r].nonzero().flatten().tolist():
            out[r] = out[r] + x[r, c] * w[:, c]
    return out + b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_call_gives_the_same_bits_in_the_documented_order(dtype):
    x = _sparse_x(rows=3000, density=0.02, seed=11, dtype=dtype)
    x[0, x[0] != 0] = -0.0  # a row of negative zeros: skipped, as x.nonzero() skips them
    x[1, 3] = float("nan")  # a NaN is a non-zero
    w, b = _weights(x.shape[1], dtype=dtype)
    outs = []
    for threads in (1, 2, 1, 2):  # a scan, then the CSR copy; the thread count changes nothing
        torch.set_num_threads(threads)
        with torch.no_grad():
            outs.append(linear(x, w, b))
    assert sparse_form(x) is not None
    for out in outs[1:]:
        assert torch.equal(out, outs[0]) or torch.equal(out.nan_to_num(), outs[0].nan_to_num())
    assert outs[0][1].isnan().all() and torch.equal(outs[0][0], b.detach())
    rows = slice(0, 40)  # the Python loop is slow: the first rows
    want = _order_reference(x[rows], w.detach(), b.detach())
    assert torch.equal(outs[0][rows].nan_to_num(), want.nan_to_num())


def test_ref_backend_sums_in_the_same_order():
    x = _sparse_x(seed=13)
    w, b = _weights(x.shape[1])
    with torch.no_grad():
        cpu = [linear(x, w, b) for _ in range(2)]
        with use_backend("ref"):
            x_ref = x.clone()  # a new tensor: its first call scans again
            ref = [linear(x_ref, w, b) for _ in range(2)]
    assert all(torch.equal(cpu[0], t) for t in cpu[1:] + ref)
