"""fused_edge_aggregate with shared dst rows: a ``[1, F]`` dst term every destination reads.

The compiler hands a layer's bias or a weight that scales edge data to the fused kernel
as such a row. The cpu backend reads it as it is and sums its gradient over
destinations; the reference gets the materialized copy. Both must agree with the
copy given as a full dst term, on every reduce and backward route, forward and backward.
"""

from __future__ import annotations

import pytest
import torch
from graph_cases import graph_case, to_csc
from kernel_testing import assert_same

import ngra.kernels.cpu.fused_edge as cpu_fe
import ngra.kernels.fused_edge as fe
from ngra.kernels import use_backend
from ngra.kernels.edge_expr import E
from ngra.kernels.fused_edge import fused_edge_aggregate

F = 6
# MPNN's message after the compiler's split and hoist: relu(t0[u] + t1[v] + e * w + b)
MPNN = E.relu(E.src(0) + E.dst(0) + E.edge(0) * E.dst(1) + E.dst(2))
# a width-1 shared row and a shared row under a nonlinearity of its own
GATED = E.sigmoid(E.dst(1) * E.src(0)) * E.tanh(E.dst(0) + E.dst(2))


def _inputs(expr, num_src, num_dst, num_edges, gen):
    """Vertex terms, the parameter rows (leaves of shape [F] or [1]) and an edge term."""
    x = torch.randn(num_src, F, dtype=torch.float64, generator=gen)
    d0 = torch.randn(num_dst, F, dtype=torch.float64, generator=gen)
    w = torch.randn(F if expr is MPNN else 1, dtype=torch.float64, generator=gen)
    b = torch.randn(F, dtype=torch.float64, generator=gen)
    e = torch.randn(num_edges, 1, dtype=torch.float64, generator=gen)
    return [x, d0, w, b, e]


def _run(backend, expr, indptr, indices, inputs, reduce, g, copy=False):
    """Output and gradients; with ``copy`` the rows go in as ``[num_dst, F]`` terms."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    x, d0, w, b, e = leaves
    nd = indptr.numel() - 1
    rows = [w.view(1, -1), b.view(1, -1)]
    if copy:
        rows = [r.expand(nd, -1) for r in rows]
    with use_backend(backend):
        out = fused_edge_aggregate(indptr, indices, expr, [x], [d0, *rows], [e], reduce=reduce)
        grads = torch.autograd.grad(out, leaves, g)
    return out.detach(), list(grads)


def _specs(monkeypatch):
    """Every KernelSpec the cpu backend generates while the test runs."""
    seen = []
    real = cpu_fe.kernel_for

    def spy(spec):
        seen.append(spec)
        return real(spec)

    monkeypatch.setattr(cpu_fe, "kernel_for", spy)
    return seen


@pytest.mark.parametrize("expr", [MPNN, GATED], ids=["mpnn", "gated"])
@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("case", ["skewed", "isolated", "bipartite_narrow"])
def test_shared_rows_match_ref(expr, reduce, case, gen, monkeypatch):
    indptr, indices, num_src = graph_case(case, gen, torch.int64)
    nd = indptr.numel() - 1
    inputs = _inputs(expr, num_src, nd, indices.numel(), gen)
    g = torch.randn(nd, F, dtype=torch.float64, generator=gen)
    specs = _specs(monkeypatch)
    out, grads = _run("cpu", expr, indptr, indices, inputs, reduce, g)
    ref_out, ref_grads = _run("ref", expr, indptr, indices, inputs, reduce, g, copy=True)
    assert_same([out] + grads, [ref_out] + ref_grads, torch.float64, terms=indices.numel() + 1)
    ref_out, ref_grads = _run("ref", expr, indptr, indices, inputs, reduce, g)
    assert all(s.shared == (("dst", 1), ("dst", 2)) for s in specs) and specs
    assert grads[2].shape == inputs[2].shape and grads[3].shape == (F,)
    assert_same([out] + grads, [ref_out] + ref_grads, torch.float64, terms=indices.numel() + 1)


@pytest.mark.parametrize("one_pass", [True, False])
@pytest.mark.parametrize("partials", ["never", "always"])
def test_shared_rows_on_two_threads_every_route(one_pass, partials, monkeypatch):
    """Both threads take ranges: each sums its destinations into a row of its own, in
    the one-walk backward and in the dst walk; dst partials skip the shared rows."""
    monkeypatch.setattr(fe, "DST_PARTIALS", partials)
    monkeypatch.setattr(cpu_fe, "ONE_PASS_BACKWARD", one_pass)
    gen = torch.Generator().manual_seed(5)
    n, num_edges = 3000, 60000
    src = torch.randint(0, n, (num_edges,), generator=gen)
    dst = torch.randint(0, n // 3, (num_edges,), generator=gen) * 3
    indptr, indices = to_csc(src, dst, n)
    inputs = _inputs(MPNN, n, n, num_edges, gen)
    g = torch.randn(n, F, dtype=torch.float64, generator=gen)
    specs = _specs(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert cpu_fe.row_threads(indptr.numpy(), 8 * F) == 2
        out, grads = _run("cpu", MPNN, indptr, indices, inputs, "sum", g)
    finally:
        torch.set_num_threads(threads)
    ref_out, ref_grads = _run("ref", MPNN, indptr, indices, inputs, "sum", g)
    assert_same([out] + grads, [ref_out] + ref_grads, torch.float64, terms=num_edges)
    fwd = [s for s in specs if s.kind == "fwd"]
    assert fwd and all(("dst", 1) not in s.grads and ("dst", 2) not in s.grads for s in fwd)
    assert {s.kind for s in specs} >= ({"bwd_all"} if one_pass else {"bwd_dst", "bwd_src"})


def test_shared_rows_save_no_copy_per_destination(gen):
    """What autograd keeps for the parameter rows is their one row, not [num_dst, F]."""
    indptr, indices, num_src = graph_case("skewed", gen, torch.int64)
    nd = indptr.numel() - 1
    x, d0, w, b, e = [t.requires_grad_() for t in _inputs(MPNN, num_src, nd, indices.numel(), gen)]
    saved = []
    with use_backend("cpu"), torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        fused_edge_aggregate(indptr, indices, MPNN, [x], [d0, w.view(1, -1), b.view(1, -1)], [e])
    assert saved.count((1, F)) == 2
    assert saved.count((nd, F)) <= 2  # d0 and, where partials pay, its partial


def test_only_cpu_reads_shared_rows():
    """The reference says nothing of shared rows: it is handed the materialized copy."""
    with use_backend("ref"):
        assert not fe._reads_shared_rows(torch.device("cpu"))
    with use_backend("cpu"):
        assert fe._reads_shared_rows(torch.device("cpu"))


def test_a_dst_term_of_another_row_count_is_refused(gen):
    indptr, indices, num_src = graph_case("skewed", gen, torch.int64)
    x = torch.randn(num_src, F, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"dst_terms\[0\] must have num_dst .* \(or 1, a row"):
        fused_edge_aggregate(indptr, indices, E.src(0) + E.dst(0), [x],
                             [torch.randn(2, F, dtype=torch.float64)])
