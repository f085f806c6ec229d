"""attention_aggregate: backends == plain torch (rowdot scores + edge softmax + weighted sum),
forward and the gradients of value, w_src and w_dst; the value gradient's reuse of the
value's memory (when, and when not), and recomputing the value instead of saving it.
"""

from __future__ import annotations

import pytest
import torch
from graph_cases import CASES, to_csc
from kernel_testing import assert_as_accurate, assert_same, max_degree
from test_softmax_aggregate import plain_torch

from ngra.kernels import (
    Recompute,
    attention_aggregate,
    dropout_linear,
    keep_value,
    rowdot,
    softmax_aggregate,
)
from ngra.kernels.registry import use_backend

# the 10^5-in-edge hub is left to softmax_aggregate's tests
LIGHT = [c for c in CASES if c != "hub"]
# the gpu backend's Triton kernels in Triton's interpreter (tests/conftest.py); small cases
# by default, the rest as slow tests (the interpreter pays per operation)
GPU_CASES = ("random", "self_loops", "empty")


def _square(name, gen):
    """Case ``name`` over ``max(num_src, num_dst)`` vertices: attention needs sources to
    be destinations (the extra vertices have no in-edges or no out-edges)."""
    src, dst, num_src, num_dst = CASES[name](gen)
    n = max(num_src, num_dst)
    return (*to_csc(src, dst, n), n)


def _oracle(indptr, indices, value, ws, wd, grad, slope=0.2):
    """Plain torch in float64 with autograd: forward and d(value, w_src, w_dst)."""
    leaves = [t.detach().double().requires_grad_() for t in (value, ws, wd)]
    v, a, b = leaves
    out = plain_torch(indptr, indices, (v * a).sum(-1), (v * b).sum(-1), v, slope)
    grads = torch.autograd.grad(out, leaves, grad.double()) if out.numel() else [
        torch.zeros_like(t) for t in leaves]
    return [out.detach(), *grads]


def _run(backend, indptr, indices, value, ws, wd, grad, slope=0.2):
    leaves = [t.detach().clone().requires_grad_() for t in (value, ws, wd)]
    with use_backend(backend):
        out = attention_aggregate(indptr, indices, *leaves, negative_slope=slope)
    grads = torch.autograd.grad(out, leaves, grad) if out.numel() else [
        torch.zeros_like(t) for t in leaves]
    return [out.detach(), *grads]


@pytest.mark.parametrize("case,backend,dtype", [
    pytest.param(case, backend, dtype, marks=pytest.mark.slow if backend == "gpu" and (
        case not in GPU_CASES or dtype == torch.float64) else ())
    for case in LIGHT for backend in ("ref", "cpu", "gpu")
    for dtype in (torch.float64, torch.float32)])
def test_matches_plain_torch(case, backend, dtype, gen, parallel_kernels):
    indptr, indices, n = _square(case, gen)
    heads, dim = 3, 5
    value = torch.randn(n, heads, dim, generator=gen, dtype=torch.float64)
    ws, wd = (torch.randn(heads, dim, generator=gen, dtype=torch.float64) for _ in range(2))
    grad = torch.randn(n, heads, dim, generator=gen, dtype=torch.float64)
    truth = _oracle(indptr, indices, value, ws, wd, grad)
    got = _run(backend, indptr, indices, *(t.to(dtype) for t in (value, ws, wd, grad)))
    if dtype == torch.float64:
        assert_same(got, truth, dtype, terms=n)
    else:
        oracle = _oracle(indptr, indices, value.float(), ws.float(), wd.float(), grad.float())
        oracle32 = [t.float() for t in oracle]
        assert_as_accurate(got, oracle32, truth, dtype, terms=max(n, max_degree(indptr)))


def test_matches_rowdot_and_softmax_aggregate_with_broadcast_weights(gen):
    """Weights that broadcast to [H, D] ([D] and [1, H, D]) get gradients of their own
    shape, as rowdot gives them."""
    indptr, indices, n = _square("random", gen)
    value = torch.randn(n, 2, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    ws = torch.randn(4, generator=gen, dtype=torch.float64, requires_grad=True)
    wd = torch.randn(1, 2, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(n, 2, 4, generator=gen, dtype=torch.float64)
    out = attention_aggregate(indptr, indices, value * 1.0, ws, wd, negative_slope=0.1)
    got = [out, *torch.autograd.grad(out, [value, ws, wd], grad)]
    ref = softmax_aggregate(indptr, indices, rowdot(value, ws), rowdot(value, wd), value,
                            negative_slope=0.1)
    want = [ref, *torch.autograd.grad(ref, [value, ws, wd], grad)]
    assert [t.shape for t in got] == [t.shape for t in want]
    assert_same(got, want, torch.float64, terms=n)


def _layer(gen, n=200, heads=2, dim=8, f_in=6):
    src, dst = (torch.randint(0, n, (6 * n,), generator=gen) for _ in range(2))
    indptr, indices = to_csc(src, dst, n)
    x = torch.randn(n, f_in, generator=gen)
    w = torch.randn(heads * dim, f_in, generator=gen, requires_grad=True)
    ws, wd = (torch.randn(heads, dim, generator=gen, requires_grad=True) for _ in range(2))
    return indptr, indices, x, w, ws, wd, (n, heads, dim)


def test_value_gradient_overwrites_the_value_only_when_nothing_else_holds_it(gen):
    indptr, indices, x, w, ws, wd, shape = _layer(gen)
    seen = []

    def run(keep: bool):
        value = (x @ w.t()).view(shape)
        ptr = value.data_ptr()
        value.register_hook(lambda g: seen.append(g.data_ptr() == ptr))
        before = value.detach().clone()
        out = attention_aggregate(indptr, indices, value, ws, wd)
        kept = value if keep else None
        del value
        grads = torch.autograd.grad((out * out).sum(), [w, ws, wd])
        if kept is not None:
            assert torch.equal(kept, before), "a value the caller holds was overwritten"
        return grads

    reused = run(keep=False)
    kept = run(keep=True)
    assert seen == [True, False]
    assert_same(reused, kept, torch.float32, terms=x.shape[0])


def test_second_backward_raises_after_reuse_and_works_under_keep_value(gen):
    indptr, indices, x, w, ws, wd, shape = _layer(gen)
    loss = attention_aggregate(indptr, indices, (x @ w.t()).view(shape), ws, wd).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="keep_value"):
        loss.backward()
    with keep_value():
        loss = attention_aggregate(indptr, indices, (x @ w.t()).view(shape), ws, wd).sum()
    first = torch.autograd.grad(loss, [w, ws, wd], retain_graph=True)
    second = torch.autograd.grad(loss, [w, ws, wd])
    assert_same(first, second, torch.float32)


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_recompute_matches_saving_the_value_and_keeps_dropout_mask(backend, gen):
    """GAT's dropout(x) W made again in backward: same mask (the RNG state is restored),
    same gradients as saving it, including for x; a second backward recomputes again."""
    indptr, indices, x, w, ws, wd, shape = _layer(gen)
    x = x.double().requires_grad_()
    w, ws, wd = (t.detach().double().requires_grad_() for t in (w, ws, wd))

    def make(x_, w_):
        return dropout_linear(x_, [w_], None, 0.5)[0].view(shape)

    with use_backend(backend):
        torch.manual_seed(3)
        state = torch.get_rng_state()
        out = attention_aggregate(indptr, indices, make(x, w), ws, wd,
                                  recompute=Recompute(make, [x, w], state))
        loss = (out * out).sum()
        got = torch.autograd.grad(loss, [x, w, ws, wd], retain_graph=True)
        again = torch.autograd.grad(loss, [x, w, ws, wd])
        torch.manual_seed(3)
        value = make(x, w)
        ref = softmax_aggregate(indptr, indices, rowdot(value, ws), rowdot(value, wd), value)
        want = torch.autograd.grad((ref * ref).sum(), [x, w, ws, wd])
    assert_same([out, *got], [ref, *want], torch.float64, terms=x.shape[0])
    assert_same(again, got, torch.float64)


def test_recompute_never_overwrites_an_input_it_returns_a_view_of(gen):
    indptr, indices, _, _, ws, wd, shape = _layer(gen)
    value = torch.randn(shape, generator=gen, requires_grad=True)
    before = value.detach().clone()
    out = attention_aggregate(indptr, indices, value, ws, wd,
                              recompute=Recompute(lambda v: v.view(shape), [value]))
    got = torch.autograd.grad((out * out).sum(), [value, ws, wd])
    assert torch.equal(value.detach(), before)
    ref = softmax_aggregate(indptr, indices, rowdot(value, ws), rowdot(value, wd), value)
    assert_same(got, torch.autograd.grad((ref * ref).sum(), [value, ws, wd]), torch.float32,
                terms=shape[0])


def test_recompute_of_another_shape_is_a_clear_error(gen):
    indptr, indices, x, w, ws, wd, shape = _layer(gen)
    out = attention_aggregate(indptr, indices, (x @ w.t()).view(shape), ws, wd,
                              recompute=Recompute(lambda w_: (x @ w_.t()), [w]))
    with pytest.raises(RuntimeError, match="not the forward's value of shape"):
        out.sum().backward()


def test_bad_arguments_say_what_was_expected(gen):
    indptr, indices, n = _square("random", gen)
    value, ws = torch.randn(n, 2, 4), torch.randn(2, 4)
    with pytest.raises(ValueError, match="3-D"):
        attention_aggregate(indptr, indices, value.view(n, 8), ws, ws)
    with pytest.raises(ValueError, match="w_dst of shape"):
        attention_aggregate(indptr, indices, value, ws, torch.randn(3, 4))
    with pytest.raises(TypeError, match="w_src must match"):
        attention_aggregate(indptr, indices, value, ws.double(), ws)
    with pytest.raises(ValueError, match="square graph"):
        attention_aggregate(indptr, indices, torch.randn(n + 1, 2, 4), ws, ws)
    with pytest.raises(ValueError, match="finite"):
        attention_aggregate(indptr, indices, value, ws, ws, negative_slope=float("nan"))
    with pytest.raises(TypeError, match="Recompute"):
        attention_aggregate(indptr, indices, value, ws, ws, recompute=lambda: value)
