"""rowdot == (x * w).sum(-1), forward and backward, over the broadcast shapes it accepts;
gradcheck; errors; and the point of it: the only x-sized tensor it makes is x's gradient."""

from __future__ import annotations

import pytest
import torch

from ngra.kernels import rowdot

SHAPES = [  # (x, w)
    ((7, 3, 5), (3, 5)),      # GAT: [N, H, D] x [H, D]
    ((7, 3, 5), (5,)),        # one weight row for every head
    ((7, 3, 5), (3, 1)),      # one scalar per head
    ((7, 3, 5), (1, 3, 5)),   # a leading 1 broadcasts over rows too
    ((7, 5), (5,)),           # single head
    ((7, 5), (1, 5)),
    ((7, 2, 3, 5), (3, 5)),   # several trailing dims
    ((0, 3, 5), (3, 5)),      # no rows
]


@pytest.mark.parametrize("xs,ws", SHAPES)
def test_matches_the_written_out_form(xs, ws, gen):
    x = torch.randn(xs, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(ws, dtype=torch.float64, generator=gen, requires_grad=True)
    g = torch.randn(xs[:-1], dtype=torch.float64, generator=gen)
    got = rowdot(x, w)
    want = (x * w).sum(-1)
    torch.testing.assert_close(got, want)
    gx, gw = torch.autograd.grad(got, [x, w], g)
    wx, ww = torch.autograd.grad(want, [x, w], g)
    torch.testing.assert_close(gx, wx)
    torch.testing.assert_close(gw, ww)
    assert gx.shape == x.shape and gw.shape == w.shape


@pytest.mark.parametrize("xs,ws", SHAPES[:4])
def test_gradcheck(xs, ws, gen):
    x = torch.randn(xs, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(ws, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(rowdot, (x, w))


def test_float32_and_partial_gradients(gen):
    x = torch.randn(50, 4, 16, generator=gen)
    w = torch.randn(4, 16, generator=gen, requires_grad=True)
    out = rowdot(x, w)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, (x * w).sum(-1), rtol=1e-5, atol=1e-5)
    (gw,) = torch.autograd.grad(out.sum(), [w])
    torch.testing.assert_close(gw, x.sum(0), rtol=1e-5, atol=1e-4)


def test_backward_makes_one_x_sized_tensor():
    """The written-out form makes three [N, H, D] tensors (product, g * w, g * x); rowdot
    makes x's gradient only, and its forward none."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(20000, 4, 16, requires_grad=True)
    w = torch.randn(4, 16, requires_grad=True)
    big = x.numel() * x.element_size()

    def x_sized_allocations(fn) -> int:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        return sum(1 for e in prof.events() if e.self_cpu_memory_usage >= big)

    assert x_sized_allocations(lambda: rowdot(x, w)) == 0
    assert x_sized_allocations(lambda: rowdot(x, w).sum().backward()) == 1
    assert x_sized_allocations(lambda: (x * w).sum(-1).sum().backward()) >= 2  # the control


@pytest.mark.parametrize("x, w, exc, match", [
    (torch.randn(5), torch.randn(5), ValueError, "at least 2 dims"),
    (torch.randn(5, 3, 4), torch.randn(2, 4), ValueError, "does not broadcast"),
    (torch.randn(5, 4), torch.randn(5, 4), ValueError, "same for every row"),
    (torch.randn(5, 3, 4), torch.randn(2, 3, 4), ValueError, "same for every row"),
    (torch.randn(5, 4), torch.randn(4, dtype=torch.float64), TypeError, "dtype"),
    (torch.randn(5, 4), [1.0] * 4, TypeError, "w"),
    (torch.arange(20).view(5, 4), torch.ones(4), TypeError, "x"),
])
def test_errors(x, w, exc, match):
    with pytest.raises(exc, match=match):
        rowdot(x, w)
