"""softmax_aggregate: fused backends == reference == plain torch == PyG GATConv.

The oracle is written here in a few lines of torch with autograd (edge softmax,
then a weighted sum), independent of the backends' hand-written backwards.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from graph_cases import CASES, graph_case, to_csc

# Importing the backend modules registers them even before the backend packages do.
import ngra.kernels.cpu.softmax_aggregate as cpu_impl
import ngra.kernels.gpu.softmax_aggregate as gpu_impl
import ngra.kernels.ref.softmax_aggregate as ref_impl  # noqa: F401
from ngra.kernels import edge_softmax, gspmm, transpose_csc
from ngra.kernels.registry import use_backend
from ngra.kernels.softmax_aggregate import softmax_aggregate, softmax_aggregate_backward

BACKENDS = ("ref", "cpu")
# The gpu backend's Triton kernels, on CPU tensors in Triton's interpreter (tests/conftest.py
# sets TRITON_INTERPRET=1 without CUDA). The interpreter pays per operation: its large
# parameter products are slow tests, a few small cases run by default.
GPU_ON_CPU = "gpu"
SLOW_GPU = pytest.mark.slow
# The 10^5-in-edge hub runs in its own tests, out of the full parameter product.
LIGHT_CASES = [name for name in CASES if name != "hub"]


def _tiny_mixed():
    """Small enough for gradcheck and holds a bit of everything: bipartite (5 -> 4), a
    self-loop (0 -> 0), a multi-edge (2 -> 1 twice), an isolated destination (3)."""
    src, dst = torch.tensor([0, 1, 2, 2, 4, 3, 1]), torch.tensor([0, 0, 1, 1, 1, 2, 2])
    indptr, indices = to_csc(src, dst, 4)
    return indptr, indices, 5


def _inputs(num_src, num_dst, heads, dim, dtype, gen, scale=1.0):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    ss = (randn(num_src, heads) * scale).to(dtype)
    sd = (randn(num_dst, heads) * scale).to(dtype)
    return ss, sd, randn(num_src, heads, dim).to(dtype), randn(num_dst, heads, dim).to(dtype)


def plain_torch(indptr, indices, score_src, score_dst, value, negative_slope=0.2):
    """Edge softmax, then a weighted sum: the textbook composition (autograd does backward)."""
    num_dst = indptr.numel() - 1
    dst = torch.repeat_interleave(torch.arange(num_dst), (indptr[1:] - indptr[:-1]).long())
    src = indices.long()
    e = F.leaky_relu(score_src[src] + score_dst[dst], negative_slope)  # [E, H]
    heads = e.shape[1]
    e_max = torch.full((num_dst, heads), -torch.inf, dtype=e.dtype).scatter_reduce(
        0, dst[:, None].expand(-1, heads), e, "amax")
    p = torch.exp(e - e_max[dst])
    alpha = p / torch.zeros(num_dst, heads, dtype=e.dtype).index_add(0, dst, p)[dst]
    out = torch.zeros((num_dst,) + value.shape[1:], dtype=value.dtype)
    return out.index_add(0, dst, alpha[..., None] * value[src])


def _oracle(indptr, indices, ss, sd, val, grad, negative_slope=0.2):
    """Forward and the three gradients of :func:`plain_torch` in float64."""
    leaves = [t.detach().double().requires_grad_() for t in (ss, sd, val)]
    out = plain_torch(indptr, indices, *leaves, negative_slope)
    grads = torch.autograd.grad(out, leaves, grad.double()) if out.numel() else [
        torch.zeros_like(t) for t in leaves]
    return [out.detach(), *grads]


def _run(backend, indptr, indices, ss, sd, val, grad, **kw):
    leaves = [t.detach().clone().requires_grad_() for t in (ss, sd, val)]
    with use_backend(backend):
        out = softmax_aggregate(indptr, indices, *leaves, **kw)
    # backward runs outside the block: the backend chosen at forward time must be kept
    grads = torch.autograd.grad(out, leaves, grad)
    return [out.detach(), *grads]


def _close(got, want, dtype, what, scale=1.0):
    names = ("out", "d score_src", "d score_dst", "d value")
    if dtype == torch.float64:
        tol = {"rtol": 1e-9, "atol": 1e-9}
    else:
        tol = {"rtol": 2e-4, "atol": 2e-4 * scale}
    for name, a, b in zip(names, got, want):
        assert a.dtype == dtype, f"{what}: {name} has dtype {a.dtype}, expected {dtype}"
        assert not torch.isnan(a).any(), f"{what}: NaN in {name}"
        torch.testing.assert_close(a.double(), b, **tol, msg=lambda m, name=name: f"{what}: {name}: {m}")


def _check_case(backend, indptr, indices, num_src, heads, dim, dtype, gen, scale=1.0, what=""):
    ss, sd, val, grad = _inputs(num_src, indptr.numel() - 1, heads, dim, dtype, gen, scale)
    got = _run(backend, indptr, indices, ss, sd, val, grad)
    _close(got, _oracle(indptr, indices, ss, sd, val, grad), dtype, f"{backend}/{what}",
           scale=1.0 if scale == 1.0 else 10.0)


# ------------------------------------------------------------------------------- oracle tests
# The numba kernels compile per index dtype.
BACKEND_INDEX = [("cpu", torch.int32), ("cpu", torch.int64), ("ref", torch.int32),
                 ("ref", torch.int64),
                 pytest.param(GPU_ON_CPU, torch.int32, marks=SLOW_GPU),
                 pytest.param(GPU_ON_CPU, torch.int64, marks=SLOW_GPU)]


@pytest.mark.parametrize("backend,index_dtype", BACKEND_INDEX)
@pytest.mark.parametrize("heads,dim", [(1, 1), (1, 8), (4, 1), (4, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", LIGHT_CASES)
def test_matches_oracle(case, dtype, heads, dim, backend, index_dtype, gen):
    indptr, indices, num_src = graph_case(case, gen, index_dtype)
    _check_case(backend, indptr, indices, num_src, heads, dim, dtype, gen, what=case)


@pytest.mark.parametrize("backend,index_dtype", [("cpu", torch.int32), ("cpu", torch.int64),
                                                  ("ref", torch.int64),
                                                  pytest.param(GPU_ON_CPU, torch.int64,
                                                               marks=SLOW_GPU)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_hub_destination(dtype, backend, index_dtype, gen):
    """One destination with 10^5 in-edges: many chunks and running-max updates."""
    indptr, indices, num_src = graph_case("hub", gen, index_dtype)
    _check_case(backend, indptr, indices, num_src, 4, 8, dtype, gen, what="hub")


@pytest.mark.parametrize("backend", BACKENDS + (pytest.param(GPU_ON_CPU, marks=SLOW_GPU),))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["multi_edges", "hub"])
def test_large_scores_are_stable(case, dtype, backend, gen):
    """Scores around +-1000: exp would overflow without the running max. (float32
    scores of that size carry rounding ~1e-4, and alpha is the exp of it.)"""
    indptr, indices, num_src = graph_case(case, gen)
    _check_case(backend, indptr, indices, num_src, 4, 8, dtype, gen, scale=1000.0, what=case)


@pytest.mark.parametrize("backend", ("cpu", pytest.param(GPU_ON_CPU, marks=SLOW_GPU)))
def test_running_max_rescales(backend, gen):
    """Scores rising along the edge order make the running max grow on every chunk."""
    num = 1000
    indptr, indices = to_csc(torch.arange(num), torch.zeros(num, dtype=torch.long), 2)
    _, sd, val, grad = _inputs(num, 2, 2, 3, torch.float64, gen)
    ss = torch.linspace(-30.0, 30.0, num, dtype=torch.float64)[:, None].repeat(1, 2)
    ss[:, 1] = ss[:, 1].flip(0)  # the second head falls instead
    got = _run(backend, indptr, indices, ss, sd, val, grad)
    _close(got, _oracle(indptr, indices, ss, sd, val, grad), torch.float64, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["skewed", "bipartite_wide", "isolated"])
def test_equals_edge_softmax_then_gspmm(case, backend, gen):
    """The fused op == ngra's unfused kernels: edge_softmax, then a u_mul_e g-SpMM."""
    indptr, indices, num_src = graph_case(case, gen)
    num_dst = indptr.numel() - 1
    ss, sd, val, grad = _inputs(num_src, num_dst, 3, 4, torch.float64, gen)
    dst = torch.repeat_interleave(torch.arange(num_dst), indptr[1:] - indptr[:-1])

    def unfused(a, b, v):
        alpha = edge_softmax(indptr, F.leaky_relu(a[indices] + b[dst], 0.2))  # [E, H]
        return gspmm(indptr, indices, v, alpha)

    want = _run(backend, indptr, indices, ss, sd, val, grad)
    leaves = [t.clone().requires_grad_() for t in (ss, sd, val)]
    with use_backend(backend):
        out = unfused(*leaves)
    got = [out.detach(), *torch.autograd.grad(out, leaves, grad)]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS + (GPU_ON_CPU,))
def test_zero_in_degree_gives_zero_not_nan(backend, gen):
    indptr, indices, num_src = graph_case("isolated", gen)  # odd destinations: no in-edges
    ss, sd, val, grad = _inputs(num_src, indptr.numel() - 1, 2, 4, torch.float32, gen)
    out, g_ss, g_sd, g_val = _run(backend, indptr, indices, ss, sd, val, grad)
    assert torch.equal(out[1::2], torch.zeros_like(out[1::2]))
    assert torch.equal(g_sd[1::2], torch.zeros_like(g_sd[1::2]))
    assert all(torch.isfinite(t).all() for t in (out, g_ss, g_sd, g_val))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck(backend, gen):
    indptr, indices, num_src = _tiny_mixed()
    ss, sd, val, _ = _inputs(num_src, 4, 2, 2, torch.float64, gen)
    # keep |raw score| away from 0, where leaky_relu has a kink
    ss = ss + torch.where(ss >= 0, 0.3, -0.3)

    def fn(a, b, v):
        with use_backend(backend):
            return softmax_aggregate(indptr, indices, a, b, v, negative_slope=0.1)

    leaves = [t.clone().requires_grad_() for t in (ss, sd * 0.01, val)]
    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("edge_buffer", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_backward_variants_agree(edge_buffer, dtype, gen):
    """The two backward strategies (re-gather value rows / [E, H] edge buffer) agree."""
    indptr, indices, num_src = graph_case("skewed", gen)
    ss, sd, val, grad = _inputs(num_src, indptr.numel() - 1, 4, 8, dtype, gen)
    out, lse = cpu_impl.softmax_aggregate_fwd(indptr, indices, ss, sd, val, 0.2)
    grads = cpu_impl.softmax_aggregate_bwd(indptr, indices, transpose_csc(indptr, indices, num_src),
                                           ss, sd, val, out, lse, grad, 0.2, edge_buffer=edge_buffer)
    _close([out, *grads], _oracle(indptr, indices, ss, sd, val, grad), dtype,
           f"edge_buffer={edge_buffer}")


@pytest.mark.parametrize("impl,case", [
    pytest.param(impl, case, marks=SLOW_GPU if impl == GPU_ON_CPU and case in (
        "skewed", "bipartite_wide") else ())
    for impl in ("ref", "cpu", GPU_ON_CPU)
    for case in ("skewed", "isolated", "multi_edges", "empty", "bipartite_wide")])
def test_backward_without_out_sums_delta_from_edges(impl, case, gen):
    """Autograd saves no output: every backend's out=None backward (g . out from the
    edges) == its backward given the output (cpu: with and without the edge buffer)."""
    indptr, indices, num_src = graph_case(case, gen)
    ss, sd, val, grad = _inputs(num_src, indptr.numel() - 1, 3, 8, torch.float64, gen)
    mod = {"ref": ref_impl, "cpu": cpu_impl, GPU_ON_CPU: gpu_impl}[impl]
    fwd = cpu_impl.softmax_aggregate_fwd
    out, lse = fwd(indptr, indices, ss, sd, val, 0.2)
    rev = transpose_csc(indptr, indices, num_src)
    bwd = mod.softmax_aggregate_bwd
    without = bwd(indptr, indices, rev, ss, sd, val, None, lse, grad, 0.2)
    variants = [{}] if impl != "cpu" else [{"edge_buffer": False}, {"edge_buffer": True}]
    for kw in variants:
        given = bwd(indptr, indices, rev, ss, sd, val, out, lse, grad, 0.2, **kw)
        for a, b in zip(without, given):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_rev_argument_forms(gen):
    """rev as a tuple, as Graph.csr(), or absent: same results."""
    from ngra import Graph

    src, dst, num_src, _ = CASES["skewed"](gen)
    graph = Graph.from_edge_index(torch.stack([src, dst]), num_nodes=num_src)
    ss, sd, val, grad = _inputs(num_src, num_src, 2, 4, torch.float64, gen)
    results = [
        _run("cpu", graph.indptr, graph.indices, ss, sd, val, grad, rev=rev)
        for rev in (None, graph.csr(), transpose_csc(graph.indptr, graph.indices, num_src))
    ]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("backend", BACKENDS + (pytest.param(GPU_ON_CPU, marks=SLOW_GPU),))
def test_negative_slope_is_used(backend, gen):
    indptr, indices, num_src = graph_case("skewed", gen)
    ss, sd, val, grad = _inputs(num_src, indptr.numel() - 1, 2, 4, torch.float64, gen)
    got = _run(backend, indptr, indices, ss, sd, val, grad, negative_slope=0.5)
    _close(got, _oracle(indptr, indices, ss, sd, val, grad, 0.5), torch.float64, backend)


def test_only_requested_gradients():
    indptr, indices, num_src = _tiny_mixed()
    ss, sd, val, grad = _inputs(num_src, 4, 2, 2, torch.float64, torch.Generator().manual_seed(0))
    val.requires_grad_()
    out = softmax_aggregate(indptr, indices, ss, sd, val)
    out.backward(grad)
    assert val.grad is not None and ss.grad is None and sd.grad is None


def test_gpu_backend_refuses_cpu_tensors(monkeypatch):
    import ngra.kernels.gpu.util as gpu_util

    monkeypatch.setattr(gpu_util, "INTERPRET", False)  # as outside Triton's interpreter
    args = _good()
    with use_backend("gpu"), pytest.raises(RuntimeError, match="needs CUDA tensors"):
        softmax_aggregate(*args.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(gen):
    indptr, indices, num_src = graph_case("skewed", gen)
    ss, sd, val, grad = _inputs(num_src, indptr.numel() - 1, 4, 8, torch.float32, gen)
    want = _run("cpu", indptr, indices, ss, sd, val, grad)
    cuda = [t.cuda() for t in (indptr, indices, ss, sd, val, grad)]
    leaves = [t.requires_grad_() for t in cuda[2:5]]
    out = softmax_aggregate(cuda[0], cuda[1], *leaves)
    got = [out.detach(), *torch.autograd.grad(out, leaves, cuda[5])]
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------- PyG GATConv oracle
@pytest.mark.baselines
def test_matches_pyg_gatconv(gen):
    pyg_conv = pytest.importorskip("torch_geometric.nn.conv.gat_conv")
    from ngra import Graph

    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    num_nodes, f_in, heads, f_out = 30, 6, 3, 5
    edge_index = torch.randint(0, num_nodes, (2, 150))
    conv = pyg_conv.GATConv(f_in, f_out, heads=heads, add_self_loops=False, bias=False).double()
    x = torch.randn(num_nodes, f_in, dtype=torch.float64, requires_grad=True)
    want = conv(x, edge_index)
    (want_gx,) = torch.autograd.grad(want, x, torch.ones_like(want))

    graph = Graph.from_edge_index(edge_index, num_nodes=num_nodes)
    h = conv.lin(x).view(-1, heads, f_out)  # GAT's projection, shared by both sides
    score_src = (h * conv.att_src).sum(-1)
    score_dst = (h * conv.att_dst).sum(-1)
    got = softmax_aggregate(graph.indptr, graph.indices, score_src, score_dst, h,
                            negative_slope=conv.negative_slope).flatten(1)
    (got_gx,) = torch.autograd.grad(got, x, torch.ones_like(got))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_gx, want_gx)


# ---------------------------------------------------------------------------- argument errors
def _good():
    indptr, indices = to_csc(torch.tensor([0, 1, 2, 6, 6, 3]), torch.tensor([0, 0, 1, 3, 3, 3]), 4)
    ss, sd, val, _ = _inputs(7, 4, 2, 3, torch.float32, torch.Generator().manual_seed(0))
    return {"indptr": indptr, "indices": indices, "score_src": ss, "score_dst": sd, "value": val}


def _call(**over):
    args = _good()
    kw = {k: over.pop(k) for k in ("negative_slope", "rev") if k in over}
    args.update(over)
    return softmax_aggregate(args["indptr"], args["indices"], args["score_src"],
                             args["score_dst"], args["value"], **kw)


@pytest.mark.parametrize("over,exc,match", [
    ({"indptr": [0, 1]}, TypeError, "indptr must be a torch.Tensor"),
    ({"indices": torch.zeros(6)}, TypeError, "indices must hold integer ids"),
    ({"indptr": torch.zeros(0, dtype=torch.long)}, ValueError, "indptr must have"),
    ({"indptr": torch.tensor([1, 2, 3, 3, 6])}, ValueError, "indptr\\[0\\] must be 0"),
    ({"indptr": torch.tensor([0, 2, 3, 3, 5])}, ValueError, "indptr\\[-1\\] must equal"),
    ({"indptr": torch.tensor([0, 3, 2, 3, 6])}, ValueError, "non-decreasing"),
    ({"indices": torch.full((6,), 7)}, ValueError, "indices must lie in \\[0, 7\\)"),
    ({"indices": torch.full((6,), -1)}, ValueError, "indices must lie in"),
    ({"score_src": torch.zeros(7, 2, dtype=torch.float16)}, TypeError, "float32 or float64"),
    ({"score_dst": torch.zeros(4, 2, dtype=torch.float64)}, TypeError, "share one dtype"),
    ({"score_src": torch.zeros(7)}, ValueError, "2-D"),
    ({"value": torch.zeros(7, 6)}, ValueError, "3-D"),
    ({"score_dst": torch.zeros(5, 2)}, ValueError, "num_dst"),
    ({"value": torch.zeros(6, 2, 3)}, ValueError, "one row per source"),
    ({"value": torch.zeros(7, 3, 3)}, ValueError, "head counts differ"),
    ({"negative_slope": True}, TypeError, "negative_slope"),
    ({"negative_slope": "0.2"}, TypeError, "negative_slope"),
    ({"negative_slope": float("nan")}, ValueError, "finite"),
    ({"rev": (torch.zeros(3),)}, TypeError, "rev must be"),
    ({"rev": (torch.zeros(3, dtype=torch.long), torch.zeros(6, dtype=torch.long),
               torch.zeros(6, dtype=torch.long))}, ValueError, "rev_indptr"),
])
def test_bad_arguments(over, exc, match):
    with pytest.raises(exc, match=match):
        _call(**over)


def test_rev_must_match_graph():
    args = _good()
    rev = transpose_csc(args["indptr"], args["indices"], 7)
    _call(rev=rev)  # fine
    with pytest.raises(ValueError, match="rev_indptr\\[-1\\] must equal"):
        _call(rev=(rev[0], rev[1][:-1], rev[2]))
    with pytest.raises(ValueError, match="rev_indices must lie in \\[0, 4\\)"):
        _call(rev=(rev[0], rev[1] + 4, rev[2]))
    with pytest.raises(ValueError, match="num_src \\+ 1"):
        _call(rev=transpose_csc(args["indptr"], args["indices"], 8))


# ------------------------------------------------------------------- split backward (chunking)
def _edge_subset(indptr, indices, keep):
    """The CSC of the edges where ``keep`` holds (destinations kept, sources kept)."""
    counts = torch.zeros(indptr.numel() - 1, dtype=torch.int64)
    dst = torch.repeat_interleave(torch.arange(counts.numel()), indptr[1:] - indptr[:-1])
    counts.index_add_(0, dst[keep], torch.ones(int(keep.sum()), dtype=torch.int64))
    sub = torch.zeros_like(indptr)
    torch.cumsum(counts, 0, out=sub[1:])
    return sub, indices[keep]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", ["random", "skewed", "isolated", "bipartite_wide"])
def test_backward_splits_over_edge_subsets(case, backend, gen):
    """Given the whole aggregation's lse and output, the backward on two halves of the
    edges sums to the whole backward (the chunked executor's per-tile rule)."""
    indptr, indices, num_src = graph_case(case, gen)
    ss, sd, val, grad = _inputs(num_src, indptr.numel() - 1, 3, 4, torch.float64, gen)
    with use_backend(backend):
        out, lse = softmax_aggregate(indptr, indices, ss, sd, val, return_lse=True)
        assert lse.dtype == torch.float64 and not lse.requires_grad
        whole = softmax_aggregate_backward(indptr, indices, ss, sd, val, out, lse, grad)
        keep = torch.rand(indices.numel(), generator=gen) < 0.5
        halves = [softmax_aggregate_backward(*_edge_subset(indptr, indices, k), ss, sd, val,
                                             out, lse, grad) for k in (keep, ~keep)]
    ref = _oracle(indptr, indices, ss, sd, val, grad)
    torch.testing.assert_close(out, ref[0])
    for i, (w, a, b) in enumerate(zip(whole, *halves)):
        torch.testing.assert_close(w, ref[i + 1], msg=f"gradient {i} of the whole")
        torch.testing.assert_close(a + b, w, msg=f"gradient {i}: halves vs whole")
    empty = (indptr[1:] == indptr[:-1])
    assert torch.isneginf(lse[empty]).all() and torch.isfinite(lse[~empty]).all()


def test_backward_checks_shapes(gen):
    indptr, indices, num_src = _tiny_mixed()
    ss, sd, val, grad = _inputs(num_src, 4, 2, 3, torch.float64, gen)
    out, lse = softmax_aggregate(indptr, indices, ss, sd, val, return_lse=True)
    with pytest.raises(ValueError, match=r"grad_out must be \[num_dst, H, D\] = \[4, 2, 3\]"):
        softmax_aggregate_backward(indptr, indices, ss, sd, val, out, lse, grad[:3])
    with pytest.raises(ValueError, match=r"lse must be \[num_dst, H\]"):
        softmax_aggregate_backward(indptr, indices, ss, sd, val, out, lse[:, :1], grad)
