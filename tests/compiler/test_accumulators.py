"""Gather accumulators' tile merges: in place (the ring's walk) == out of place."""

from __future__ import annotations

import pytest
import torch

from ngra.compiler.gather import make_accumulator


def _softmax_part(gen: torch.Generator, rows: int, heads: int, width: int):
    m = torch.randn(rows, heads, generator=gen)
    s = torch.rand(rows, heads, generator=gen) + 0.1
    o = torch.randn(rows, heads, width, generator=gen)
    return m, s, o


def _clone(state):
    return tuple(t.clone() for t in state) if isinstance(state, tuple) else state.clone()


@pytest.mark.parametrize("name", ["sum", "softmax"])
def test_in_place_merge_and_finalize_equal_out_of_place(name):
    gen = torch.Generator().manual_seed(0)
    acc = make_accumulator(name)
    make = ((lambda: torch.randn(5, 4, generator=gen)) if name == "sum" else
            (lambda: _softmax_part(gen, 5, 2, 3)))
    parts = [make() for _ in range(3)]
    want, got = None, None
    for p in parts:
        want = acc.combine(want, _clone(p))
        got = acc.combine(got, _clone(p), in_place=True)
    deg = torch.tensor([1, 2, 0, 3, 1])
    torch.testing.assert_close(acc.finalize(got, deg, in_place=True), acc.finalize(want, deg))


@pytest.mark.parametrize("name", ["sum", "softmax"])
def test_in_place_merge_of_a_broadcast_zero_partial(name):
    """An empty tile's partial can be an expanded zero: merging it or into it in place
    must not write through the broadcast."""
    acc = make_accumulator(name)
    gen = torch.Generator().manual_seed(1)
    if name == "sum":
        zero, full = torch.zeros(()).expand(5, 4), torch.randn(5, 4, generator=gen)
    else:
        z = torch.zeros(())
        zero = (z.expand(5, 2), z.expand(5, 2), z.expand(5, 2, 3))
        full = _softmax_part(gen, 5, 2, 3)
    for a, b in ((zero, full), (full, zero)):
        want = acc.combine(_clone(a) if a is full else a, _clone(b) if b is full else b)
        got = acc.combine(_clone(a) if a is full else a, _clone(b) if b is full else b,
                          in_place=True)
        for x, y in zip(got if name == "softmax" else [got], want if name == "softmax" else [want]):
            torch.testing.assert_close(x, y)


def test_in_place_finalize_leaves_an_autograd_graph_alone():
    """Under autograd (chunked streaming's forward), in_place falls back to out of place:
    the state stays intact and gradients flow."""
    acc = make_accumulator("softmax")
    m, s, o = _softmax_part(torch.Generator().manual_seed(2), 4, 2, 3)
    o = o.requires_grad_()
    out = acc.finalize((m, s, o * 1), torch.ones(4), in_place=True)
    out.sum().backward()
    torch.testing.assert_close(o.grad, (1 / s).unsqueeze(-1).expand_as(o))
