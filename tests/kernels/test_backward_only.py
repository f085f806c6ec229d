"""``backward_only``: sum/mean kernels skip their forward but keep exact gradients."""

from __future__ import annotations

import pytest
import torch
from graph_cases import graph_case

from ngra.kernels import backward_only, forward_skipped, gspmm
from ngra.kernels.edge_expr import E
from ngra.kernels.fused_edge import fused_edge_aggregate


def _grads(fn, leaves, probe):
    out = fn()
    return out, torch.autograd.grad(out, leaves, probe)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("case", ["random", "isolated", "hub"])
def test_gspmm_gradients_match_without_forward(case, reduce, gen):
    indptr, indices, num_src = graph_case(case, gen)
    src = torch.randn(num_src, 3, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(indices.numel(), 3, 1, dtype=torch.float64, generator=gen,
                    requires_grad=True)
    probe = torch.randn(indptr.numel() - 1, 3, 4, dtype=torch.float64, generator=gen)
    fn = lambda: gspmm(indptr, indices, src, w, reduce=reduce)  # noqa: E731
    full, g_full = _grads(fn, [src, w], probe)
    with backward_only():
        skipped, g_skip = _grads(fn, [src, w], probe)
    assert skipped.shape == full.shape and not skipped.any()
    for a, b in zip(g_skip, g_full):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_fused_edge_gradients_match_without_forward(reduce, gen):
    indptr, indices, num_src = graph_case("random", gen)
    nd, ne = indptr.numel() - 1, indices.numel()
    a = torch.randn(num_src, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(nd, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    e = torch.randn(ne, 1, dtype=torch.float64, generator=gen, requires_grad=True)
    expr = (E.src(0) + E.dst(0) * E.edge(0)).sigmoid()
    probe = torch.randn(nd, 5, dtype=torch.float64, generator=gen)
    fn = lambda: fused_edge_aggregate(indptr, indices, expr, [a], [b], [e],  # noqa: E731
                                      reduce=reduce)
    full, g_full = _grads(fn, [a, b, e], probe)
    with backward_only():
        skipped, g_skip = _grads(fn, [a, b, e], probe)
    assert skipped.shape == full.shape and not skipped.any()
    for x, y in zip(g_skip, g_full):
        torch.testing.assert_close(x, y)


def test_extreme_reducers_still_run_forward(gen):
    """max/min backward routes through the forward's argmax: never skipped."""
    indptr, indices, num_src = graph_case("random", gen)
    src = torch.randn(num_src, 4, dtype=torch.float64, generator=gen)
    with backward_only():
        assert forward_skipped("sum") and not forward_skipped("max")
        out = gspmm(indptr, indices, src, reduce="max")
    torch.testing.assert_close(out, gspmm(indptr, indices, src, reduce="max"))
    assert not forward_skipped("sum")
