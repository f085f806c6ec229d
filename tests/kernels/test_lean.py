"""ngra.kernels.lean: broadcast_shape == torch.broadcast_shapes and vjp ==
torch.autograd.grad (the same gradients, the same errors), and the point of them: a fresh
process that broadcasts and back-propagates through them never imports sympy (issue 41)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ngra.kernels.lean import broadcast_shape, vjp

BROADCASTS = [((3, 1), (4,)), ((2, 3), (3,)), ((), (5, 2)), ((1,), (0,)), ((0,), (1,)),
              ((2, 1, 4), (3, 1), ()), ((5,),), ((7, 1, 5), (1, 3, 1), (3, 5)), ()]


@pytest.mark.parametrize("shapes", BROADCASTS)
def test_broadcast_shape_is_torch_s(shapes):
    got = broadcast_shape(*shapes)
    assert isinstance(got, torch.Size) and got == torch.broadcast_shapes(*shapes)


@pytest.mark.parametrize("shapes", [((2, 3), (4,)), ((2, 1), (3, 4), (5, 1))])
def test_broadcast_shape_refuses_what_torch_refuses(shapes):
    with pytest.raises(RuntimeError):
        torch.broadcast_shapes(*shapes)
    with pytest.raises(RuntimeError, match="do not broadcast"):
        broadcast_shape(*shapes)


def _graph(gen):
    a = torch.randn(4, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(3, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    unused = torch.randn(2, requires_grad=True)
    y = (a @ b).tanh()
    return a, b, unused, [y, y.sum(0)]


def test_vjp_is_torch_s_gradient(gen):
    a, b, unused, outs = _graph(gen)
    gs = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs]
    want = torch.autograd.grad(outs, [a, b, unused], gs, allow_unused=True, retain_graph=True)
    got = vjp(outs, [a, b, unused], gs, allow_unused=True)
    assert got[2] is None and want[2] is None
    torch.testing.assert_close(got[:2], want[:2], rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        vjp(outs, [a], gs)  # the graph was freed, as torch.autograd.grad frees it


def test_vjp_single_tensors_create_graph_and_fallbacks(gen):
    a, b, _, (y, _) = _graph(gen)
    g = torch.randn(y.shape, dtype=y.dtype, generator=gen)
    (ga,) = vjp(y, a, g, create_graph=True)
    assert isinstance(ga, torch.Tensor) and ga.requires_grad  # differentiable again
    torch.testing.assert_close(ga, torch.autograd.grad(y, a, g, retain_graph=True)[0])
    # shapes that torch.autograd.grad refuses go to it, and it says why
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        vjp(y, a, g[:1])
    with pytest.raises(RuntimeError, match="allow_unused"):
        vjp(y, [a, torch.zeros(1, requires_grad=True)], g)
    # a None gradient (a scalar output) is torch's case too
    s = (a * a).sum()
    torch.testing.assert_close(vjp([s], [a], [None])[0], 2 * a.detach())


@pytest.mark.timeout(120)
def test_neither_imports_sympy():
    code = """
import sys, torch
from ngra.kernels.lean import broadcast_shape, vjp
x = torch.randn(5, 3, requires_grad=True)
y = x * 2
vjp([y], [x], [torch.ones(broadcast_shape(y.shape, (3,)))])
print("sympy" in sys.modules, "torch.fx.experimental.symbolic_shapes" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=100, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "False"]
    # the check sees sympy when torch's own functions run
    out = subprocess.run([sys.executable, "-c", code.replace("vjp([y]", "torch.autograd.grad([y]")],
                         capture_output=True, text=True, timeout=100, check=False)
    assert out.stdout.split() == ["True", "True"], out.stderr[-2000:]
