"""fused_edge_aggregate_multi: several outputs, each with its own expression and reducer,
from one walk. numba == reference (every output and every term gradient) over the
labeled graph cases in float64 and float32; each output == the one-output
``fused_edge_aggregate`` of its expression; one walk forward and one backward;
gradcheck; ties; argument errors.

The reference (``kernels/ref``) is plain torch: every output's ``[E, F]`` messages
reduced by ``index_add`` / ``scatter_reduce``, backward by torch autograd.
"""

from __future__ import annotations

import pytest
import torch
from graph_cases import CASES, SMALL_CASES, graph_case, to_csc
from kernel_testing import assert_as_accurate, assert_same, max_degree

import ngra.kernels.cpu.fused_edge as cpu_fe
from ngra.kernels import use_backend
from ngra.kernels.edge_expr import E
from ngra.kernels.fused_edge import fused_edge_aggregate, fused_edge_aggregate_multi

F = 5

# PNA's aggregators of one message h = a[v] + b[u] * w_e, with a shared bias row
# c (a [1, F] dst term every destination reads) and a width-1 edge weight.
H = E.dst(0) + E.src(0) * E.edge(0) + E.dst(1)
PNA = [(H, "mean"), (H * H, "mean"), (H, "max"), (H, "min")]
# ... and a sum of another function of the same terms, and a max with ties (relu of a
# term that is negative on many edges: many equal zeros per destination).
MIXED = PNA + [(E.sigmoid(H) * E.src(0), "sum"), (E.relu(E.src(0) - 0.5), "max")]
DTYPES = [(torch.float64, torch.int64), (torch.float32, torch.int32)]


def _inputs(indptr, indices, num_src, dtype, gen):
    nd, ne = indptr.numel() - 1, indices.numel()
    return [torch.randn(num_src, F, dtype=dtype, generator=gen),   # src0: b
            torch.randn(nd, F, dtype=dtype, generator=gen),        # dst0: a
            torch.randn(1, F, dtype=dtype, generator=gen),         # dst1: c, a shared row
            torch.randn(ne, 1, dtype=dtype, generator=gen)]        # edge0: w


def _call(indptr, indices, outputs):
    def fn(b, a, c, w):
        return fused_edge_aggregate_multi(indptr, indices, outputs, [b], [a, c], [w])
    return fn


def _run(backend, fn, inputs, grads=None, gen=None):
    """``(outputs, term gradients, output gradients used)`` of ``fn`` on ``backend``."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    with use_backend(backend):
        outs = fn(*leaves)
        if grads is None:
            grads = [torch.randn(o.shape, dtype=o.dtype, generator=gen) for o in outs]
        torch.autograd.backward(outs, grads)
    return [o.detach() for o in outs], [x.grad for x in leaves], grads


def _compare(case, outputs, dtype, index_dtype, gen):
    indptr, indices, num_src = graph_case(case, gen, index_dtype)
    inputs = _inputs(indptr, indices, num_src, dtype, gen)
    fn = _call(indptr, indices, outputs)
    out_ref, g_ref, grads = _run("ref", fn, inputs, gen=gen)
    out_cpu, g_cpu, _ = _run("cpu", fn, inputs, grads)
    assert [o.shape for o in out_cpu] == [(indptr.numel() - 1, F)] * len(outputs)
    terms = max_degree(indptr) + 1
    if dtype == torch.float64:
        assert_same(out_cpu + g_cpu, out_ref + g_ref, dtype, terms=terms)
        return
    # float32: as test_fused_edge's _compare, each held to float64 truth
    out64, g64, _ = _run("ref", fn, [x.double() for x in inputs], [g.double() for g in grads])
    assert_as_accurate(out_cpu + g_cpu, out_ref + g_ref, out64 + g64, dtype, terms=terms)


# ---------------------------------------------------------------- numba == reference
@pytest.mark.parametrize("dtype,index_dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_pna_outputs_match_ref(case, dtype, index_dtype, gen):
    _compare(case, PNA, dtype, index_dtype, gen)


@pytest.mark.parametrize("case", ["random", "multi_edges", "skewed", "bipartite_narrow"])
def test_mixed_reducers_and_ties_match_ref(case, gen):
    _compare(case, MIXED, torch.float64, torch.int64, gen)


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_each_output_equals_its_one_output_kernel(backend, gen):
    """Output ``j`` == ``fused_edge_aggregate(expr_j, reduce=r_j)``, value and gradients."""
    indptr, indices, num_src = graph_case("skewed", gen)
    inputs = _inputs(indptr, indices, num_src, torch.float64, gen)
    outs, g_multi, grads = _run(backend, _call(indptr, indices, MIXED), inputs, gen=gen)
    sums = [torch.zeros_like(x) for x in inputs]
    for (expr, reduce), out, g in zip(MIXED, outs, grads):

        def one(b, a, c, w, expr=expr, reduce=reduce):
            return [fused_edge_aggregate(indptr, indices, expr, [b], [a, c], [w],
                                         reduce=reduce)]

        (single,), g_one, _ = _run(backend, one, inputs, [g])
        assert_same([out], [single], torch.float64, terms=max_degree(indptr))
        for s, x in zip(sums, g_one):
            s += x
    assert_same(g_multi, sums, torch.float64, terms=len(MIXED) * max_degree(indptr))


def test_gradcheck(gen):
    for case in SMALL_CASES[:4]:
        indptr, indices, num_src = graph_case(case, gen)
        inputs = [x.requires_grad_() for x in _inputs(indptr, indices, num_src, torch.float64,
                                                      gen)]
        with use_backend("cpu"):
            assert torch.autograd.gradcheck(_call(indptr, indices, MIXED[:5]), inputs)


# ---------------------------------------------------------------- one walk
def _kinds(monkeypatch):
    calls = []
    real = cpu_fe.kernel_for
    monkeypatch.setattr(cpu_fe, "kernel_for", lambda spec: calls.append(
        (spec.kind, len(spec.roots()))) or real(spec))
    return calls


@pytest.mark.parametrize("one_pass", [True, False])
def test_one_walk_forward_and_backward_on_two_threads(one_pass, monkeypatch):
    """Every output from one forward kernel and one backward walk (``bwd_all``; or, where
    the one-walk backward does not pay, the dst walk and the src walk: still one each for
    all outputs), on a graph where both threads take ranges; the two backward forms agree."""
    gen = torch.Generator().manual_seed(5)
    n, num_edges = 3000, 60000
    src = torch.randint(0, n, (num_edges,), generator=gen)
    dst = torch.randint(0, n // 3, (num_edges,), generator=gen) * 3
    indptr, indices = to_csc(src, dst, n)
    inputs = _inputs(indptr, indices, n, torch.float64, gen)
    grads = [torch.randn(n, F, dtype=torch.float64, generator=gen) for _ in PNA]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert cpu_fe.row_threads(indptr.numpy(), 8 * F) == 2
        monkeypatch.setattr(cpu_fe, "ONE_PASS_BACKWARD", one_pass)
        calls = _kinds(monkeypatch)
        _, g_cpu, _ = _run("cpu", _call(indptr, indices, PNA), inputs, grads)
    finally:
        torch.set_num_threads(threads)
    walks = [("bwd_all", 4)] if one_pass else [("bwd_dst", 4), ("bwd_src", 4)]
    assert calls == [("fwd", 4)] + walks
    _, g_ref, _ = _run("ref", _call(indptr, indices, PNA), inputs, grads)
    assert_same(g_cpu, g_ref, torch.float64, terms=num_edges)


def test_ties_go_to_the_first_edge(gen):
    """A max/min output whose every in-edge ties (a constant message) sends its gradient
    to the first in-edge only, as the one-output kernels do."""
    indptr, indices, num_src = graph_case("multi_edges", gen)
    ne = indices.numel()
    w = torch.randn(ne, 1, dtype=torch.float64, generator=gen)
    b = torch.randn(num_src, 1, dtype=torch.float64, generator=gen)
    outputs = [(E.edge(0) * 0.0 + 1.0, "max"), (E.edge(0) * 0.0 - 1.0, "min"),
               (E.edge(0) * E.src(0), "sum")]
    grads = {}
    for backend in ("ref", "cpu"):
        leaf = w.clone().requires_grad_()
        with use_backend(backend):
            outs = fused_edge_aggregate_multi(indptr, indices, outputs, [b], [], [leaf])
            grads[backend] = torch.autograd.grad(outs[0].sum() + outs[1].sum(), leaf)[0]
    assert_same([grads["cpu"]], [grads["ref"]], torch.float64)


# ---------------------------------------------------------------- errors
def test_argument_errors():
    indptr, indices = torch.tensor([0, 1, 2]), torch.tensor([1, 0])
    x = torch.randn(2, F)
    with pytest.raises(TypeError, match="non-empty list of"):
        fused_edge_aggregate_multi(indptr, indices, [], [x])
    with pytest.raises(TypeError, match="non-empty list of"):
        fused_edge_aggregate_multi(indptr, indices, E.src(0), [x])
    with pytest.raises(TypeError, match=r"outputs\[0\] must be an \(expr, reduce\) pair"):
        fused_edge_aggregate_multi(indptr, indices, [E.src(0)], [x])
    with pytest.raises(ValueError, match="softmax"):
        fused_edge_aggregate_multi(indptr, indices, [(E.src(0), "softmax")], [x])
    with pytest.raises(ValueError, match=r"reads dst0 \(dst_terms\[0\]\)"):
        fused_edge_aggregate_multi(indptr, indices, [(E.src(0), "sum"), (E.dst(0), "max")],
                                   [x])
