"""Attention dropout inside softmax_aggregate and attention_aggregate (EdgeDropout).

The oracle drops the weights of a plain-torch edge softmax with the mask
``EdgeDropout.factors`` materializes, and autograd differentiates it; every backend
(ref, numba cpu with each backward variant, the gpu torch code on CPU tensors) must
agree, forward and backward, on the labeled graph cases. The mask itself is checked
for its statistics over a large graph, its dependence on the edge counter only, and
that nothing ``[E, H]`` is saved for backward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import pytest
import torch
from graph_cases import CASES, graph_case, to_csc
from kernel_testing import assert_same

import ngra.kernels.cpu.softmax_aggregate as cpu_impl
import ngra.kernels.gpu.softmax_aggregate as gpu_impl
from ngra.kernels import (
    EdgeDropout,
    Recompute,
    attention_aggregate,
    keep_value,
    softmax_aggregate,
    softmax_aggregate_backward,
    transpose_csc,
    use_backend,
)
from ngra.kernels.ref.dropout import mask_hash

LIGHT = [name for name in CASES if name != "hub"]
# the gpu backend's Triton kernels run in Triton's interpreter here (tests/conftest.py):
# small cases by default, the others as slow tests (the interpreter pays per operation)
GPU_CASES = ("random", "self_loops", "empty", "isolated")


def _drop(num_edges, gen, p=0.5):
    """An EdgeDropout whose counters are a random permutation (as graph.perm can be)."""
    counter = torch.randperm(num_edges, generator=gen)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
        return EdgeDropout.draw(p, counter)


def _inputs(num_src, num_dst, heads, dim, gen, dtype=torch.float64):
    """``(score_src, score_dst, value, grad_out)``."""
    return [torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)
            for s in ((num_src, heads), (num_dst, heads), (num_src, heads, dim),
                      (num_dst, heads, dim))]


def dropped_softmax_sum(indptr, indices, score_src, score_dst, value, drop, slope=0.2):
    """Plain torch: edge softmax, the weights times the mask's factors, weighted sum."""
    num_dst = indptr.numel() - 1
    dst = torch.repeat_interleave(torch.arange(num_dst), (indptr[1:] - indptr[:-1]).long())
    src = indices.long()
    e = torch.nn.functional.leaky_relu(score_src[src] + score_dst[dst], slope)
    heads = e.shape[1]
    m = torch.full((num_dst, heads), -torch.inf, dtype=e.dtype).scatter_reduce(
        0, dst[:, None].expand(-1, heads), e, "amax")
    p = torch.exp(e - m[dst])
    alpha = p / torch.zeros(num_dst, heads, dtype=e.dtype).index_add(0, dst, p)[dst]
    alpha = alpha * drop.factors(heads, alpha.dtype)
    out = torch.zeros((num_dst,) + tuple(value.shape[1:]), dtype=value.dtype)
    return out.index_add(0, dst, alpha[..., None] * value[src])


def _grads(out, leaves, grad):
    if not out.numel():
        return [out.detach(), *(torch.zeros_like(t) for t in leaves)]
    return [out.detach(), *torch.autograd.grad(out, leaves, grad.to(out.dtype))]


def _oracle(indptr, indices, ss, sd, val, grad, drop):
    """:func:`dropped_softmax_sum` in float64 and its autograd gradients."""
    leaves = [t.detach().double().requires_grad_() for t in (ss, sd, val)]
    return _grads(dropped_softmax_sum(indptr, indices, *leaves, drop), leaves, grad)


def _run(backend, indptr, indices, ss, sd, val, grad, drop, **kw):
    """``[out, d ss, d sd, d val]`` from one backend (``kw``: backward options of the
    direct calls, ``cpu-direct`` / ``gpu-direct``)."""
    if backend in ("gpu-direct", "cpu-direct"):
        impl = gpu_impl if backend == "gpu-direct" else cpu_impl
        fwd = impl.forward if backend == "gpu-direct" else impl.softmax_aggregate_fwd
        bwd = impl.backward if backend == "gpu-direct" else impl.softmax_aggregate_bwd
        out, lse = fwd(indptr, indices, ss, sd, val, 0.2, drop)
        rev = transpose_csc(indptr, indices, ss.shape[0])
        given = kw.pop("given_out", True)
        return [out, *bwd(indptr, indices, rev, ss, sd, val, out if given else None, lse, grad,
                          0.2, drop=drop, **kw)]
    rev = None
    if kw.pop("reverse", False):  # the counters in CSR order made once, as the runtime does
        rev = transpose_csc(indptr, indices, ss.shape[0])
        drop = dataclasses.replace(drop, reverse=(rev[2], drop.counter[rev[2]]))
    leaves = [t.detach().clone().requires_grad_() for t in (ss, sd, val)]
    with use_backend(backend):
        out = softmax_aggregate(indptr, indices, *leaves, dropout=drop, rev=rev)
    return [out.detach(), *torch.autograd.grad(out, leaves, grad)]


VARIANTS = [("ref", {}), ("cpu", {}), ("cpu", {"reverse": True}),
            ("cpu-direct", {"edge_buffer": True}), ("cpu-direct", {"edge_buffer": False}),
            ("cpu-direct", {"given_out": False}), ("gpu", {}), ("gpu", {"reverse": True}),
            ("gpu-direct", {"given_out": False})]


def _gpu_slow(backend, case, big=False):
    """The interpreter's cases beyond the small ones are slow tests."""
    return pytest.mark.slow if backend.startswith("gpu") and (big or case not in GPU_CASES) \
        else ()


@pytest.mark.parametrize("case,heads,dim,backend,kw", [
    pytest.param(case, heads, dim, backend, kw, marks=_gpu_slow(backend, case, heads == 4))
    for case in LIGHT for heads, dim in ((1, 3), (4, 8)) for backend, kw in VARIANTS])
def test_softmax_aggregate_matches_oracle(case, heads, dim, backend, kw, gen, parallel_kernels):
    indptr, indices, num_src = graph_case(case, gen, torch.int32 if heads == 1 else torch.int64)
    ss, sd, val, grad = _inputs(num_src, indptr.numel() - 1, heads, dim, gen)
    drop = _drop(indices.numel(), gen)
    got = _run(backend, indptr, indices, ss, sd, val, grad, drop, **dict(kw))
    assert_same(got, _oracle(indptr, indices, ss, sd, val, grad, drop), torch.float64,
                terms=indices.numel())


@pytest.mark.parametrize("backend", ["ref", "cpu", pytest.param("gpu", marks=pytest.mark.slow)])
def test_float32_and_hub(backend, gen):
    """float32 kernels against the float64 oracle, on the 10^5-in-edge hub."""
    indptr, indices, num_src = graph_case("hub", gen)
    ss, sd, val, grad = _inputs(num_src, indptr.numel() - 1, 2, 4, gen, torch.float32)
    drop = _drop(indices.numel(), gen, p=0.3)
    got = _run(backend, indptr, indices, ss, sd, val, grad, drop)
    want = _oracle(indptr, indices, ss, sd, val, grad, drop)
    for a, b in zip(got, want):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_no_dropout_path_is_unchanged(backend, gen):
    """A dropout that keeps everything (p = 0: threshold 0, scale 1) runs the dropout
    code and gives today's results bit for bit; ``draw(0)`` gives no dropout at all."""
    indptr, indices, num_src = graph_case("skewed", gen)
    ss, sd, val, grad = _inputs(num_src, indptr.numel() - 1, 3, 5, gen, torch.float32)
    keep_all = EdgeDropout(0.0, torch.randperm(indices.numel(), generator=gen), 1, 2)
    assert EdgeDropout.draw(0.0, keep_all.counter) is None
    with_drop = _run(backend, indptr, indices, ss, sd, val, grad, keep_all)
    without = _run(backend, indptr, indices, ss, sd, val, grad, None)
    for a, b in zip(with_drop, without):
        assert torch.equal(a, b)


@pytest.mark.parametrize("backend", ["ref", "cpu"])
@pytest.mark.parametrize("case", ["random", "skewed", "isolated", "multi_edges"])
def test_backward_splits_over_edge_subsets(case, backend, gen):
    """The chunked executor's per-tile rule holds with dropout: given the whole
    (dropped) output and lse, the backward on two edge subsets, each with its share of
    the counters (``take``), sums to the whole backward."""
    indptr, indices, num_src = graph_case(case, gen)
    ss, sd, val, grad = _inputs(num_src, indptr.numel() - 1, 3, 4, gen)
    drop = _drop(indices.numel(), gen)
    with use_backend(backend):
        out, lse = softmax_aggregate(indptr, indices, ss, sd, val, return_lse=True,
                                     dropout=drop)
        whole = softmax_aggregate_backward(indptr, indices, ss, sd, val, out, lse, grad,
                                           dropout=drop)
        keep = torch.rand(indices.numel(), generator=gen) < 0.5
        halves = []
        for k in (keep, ~keep):
            counts = torch.zeros(indptr.numel() - 1, dtype=torch.int64)
            dst = torch.repeat_interleave(torch.arange(counts.numel()), indptr[1:] - indptr[:-1])
            counts.index_add_(0, dst[k], torch.ones(int(k.sum()), dtype=torch.int64))
            sub = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
            ids = k.nonzero().flatten()
            halves.append(softmax_aggregate_backward(sub, indices[k], ss, sd, val, out, lse,
                                                     grad, dropout=drop.take(ids)))
    want = _oracle(indptr, indices, ss, sd, val, grad, drop)
    torch.testing.assert_close(out, want[0])
    for i, (w, a, b) in enumerate(zip(whole, *halves)):
        torch.testing.assert_close(w, want[i + 1], msg=f"gradient {i} of the whole")
        torch.testing.assert_close(a + b, w, msg=f"gradient {i}: halves vs whole")


# ---------------------------------------------------------------- attention_aggregate
def _square(name, gen):
    src, dst, num_src, num_dst = CASES[name](gen)
    n = max(num_src, num_dst)
    return (*to_csc(src, dst, n), n)


@pytest.mark.parametrize("case,backend", [
    pytest.param(case, backend, marks=_gpu_slow(backend, case))
    for case in LIGHT for backend in ("ref", "cpu", "gpu")])
def test_attention_aggregate_matches_oracle(case, backend, gen, parallel_kernels):
    indptr, indices, n = _square(case, gen)
    heads, dim = 3, 4
    value = torch.randn(n, heads, dim, generator=gen, dtype=torch.float64)
    ws, wd = (torch.randn(heads, dim, generator=gen, dtype=torch.float64) for _ in range(2))
    grad = torch.randn(n, heads, dim, generator=gen, dtype=torch.float64)
    drop = _drop(indices.numel(), gen, p=0.4)
    leaves = [t.clone().requires_grad_() for t in (value, ws, wd)]
    v, a, b = leaves
    want = _grads(dropped_softmax_sum(indptr, indices, (v * a).sum(-1), (v * b).sum(-1), v,
                                      drop), leaves, grad)
    got_leaves = [t.clone().requires_grad_() for t in (value, ws, wd)]
    with use_backend(backend):
        out = attention_aggregate(indptr, indices, *got_leaves, dropout=drop)
    got = _grads(out, got_leaves, grad)
    assert_same(got, want, torch.float64, terms=n)


def test_attention_aggregate_recompute_and_in_place(gen):
    """With a Recompute (the value made again in backward) and with the value gradient
    written over the value, the dropped gradients are the same."""
    indptr, indices, n = _square("skewed", gen)
    x = torch.randn(n, 6, generator=gen, dtype=torch.float64)
    w = torch.randn(6, 8, generator=gen, dtype=torch.float64)
    ws, wd = (torch.randn(2, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    grad = torch.randn(n, 2, 4, generator=gen, dtype=torch.float64)
    drop = _drop(indices.numel(), gen)
    results = []
    for mode in ("kept", "in place", "recompute"):
        xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
        rc = (Recompute(lambda a, b: (a @ b).view(n, 2, 4), [xl, wl]) if mode == "recompute"
              else None)
        with keep_value() if mode == "kept" else contextlib.nullcontext():
            out = attention_aggregate(indptr, indices, (xl @ wl).view(n, 2, 4), ws, wd,
                                      recompute=rc, dropout=drop)
        results.append(_grads(out, [xl, wl], grad))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend,kw", [
    pytest.param(backend, kw, marks=_gpu_slow(backend, "random"))
    for backend, kw in VARIANTS if not kw.get("reverse")])
def test_identity_counter_reads_positions(backend, kw, gen):
    """``counter=None`` (a graph already in the caller's edge order): the kernels hash
    each edge's CSC position and pass B the reverse CSR's ``perm``, without an ``[E]``
    array; the same results, bit for bit, as the explicit counters 0 .. E-1 in either
    integer width."""
    indptr, indices, num_src = graph_case("skewed", gen)
    ss, sd, val, grad = _inputs(num_src, indptr.numel() - 1, 3, 4, gen)
    e = indices.numel()
    ident = EdgeDropout(0.5, None, 11, 12, num_edges=e)
    got = _run(backend, indptr, indices, ss, sd, val, grad, ident, **dict(kw))
    for dtype in (torch.int32, torch.int64):
        explicit = EdgeDropout(0.5, torch.arange(e, dtype=dtype), 11, 12)
        want = _run(backend, indptr, indices, ss, sd, val, grad, explicit, **dict(kw))
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    assert_same(got, _oracle(indptr, indices, ss, sd, val, grad, ident), torch.float64,
                terms=e)


def test_identity_counter_subsets_and_checks(gen):
    """A tile of the identity holds its edges' positions as counters; the reverse walk's
    counters are its ``rev_perm``; a size mismatch is named."""
    ident = EdgeDropout.draw(0.5, None, num_edges=100)
    assert ident.counter is None and ident.size == 100
    ids = torch.tensor([3, 7, 50], dtype=torch.int32)
    assert ident.take(ids).counter is ids
    rev = torch.randperm(100)
    assert ident.reverse_counter(rev) is rev
    assert torch.equal(ident.factors(2, torch.float64),
                       EdgeDropout(0.5, torch.arange(100), ident.s1, ident.s2).factors(
                           2, torch.float64))
    with pytest.raises(TypeError, match="needs num_edges"):
        EdgeDropout.draw(0.5, None)
    indptr, indices, num_src = graph_case("random", gen)
    ss, sd, val, _ = _inputs(num_src, indptr.numel() - 1, 2, 3, gen)
    with pytest.raises(ValueError, match="one counter per edge"):
        softmax_aggregate(indptr, indices, ss, sd, val,
                          dropout=EdgeDropout(0.5, None, 1, 2, num_edges=indices.numel() + 1))


# ---------------------------------------------------------------- the mask itself
def test_mask_is_a_function_of_the_counter(gen):
    """Weight (j, h)'s flag is the dropout hash of counter[j] * H + h: the same edge
    keeps its flags wherever it sits, and a head's flags differ from another's."""
    drop = _drop(5000, gen)
    f = drop.factors(3, torch.float64)
    idx = drop.counter[:, None] * 3 + torch.arange(3)
    want = (mask_hash(idx, drop.s1, drop.s2) >= drop.thr).double() * 2.0
    assert torch.equal(f, want)
    order = torch.randperm(5000, generator=gen)
    assert torch.equal(drop.take(order).factors(3, torch.float64), f[order])
    # counters in a reverse walk's order: kept for that rev_perm tensor, else gathered
    cached = dataclasses.replace(drop, reverse=(order, drop.counter[order] + 0))
    assert cached.reverse_counter(order) is cached.reverse[1]
    assert torch.equal(cached.reverse_counter(order.clone()), drop.counter[order])
    assert cached.take(order).reverse is None
    agree = (f[:, 0] == f[:, 1]).double().mean()
    assert 0.4 < agree < 0.6  # independent heads agree about half the time at p = 0.5


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_kept_fraction_and_scale_match_p(backend, gen):
    """A graph whose every destination has one in-edge: out = factor * value, so the
    kernel's output shows each weight's factor. Over 2^19 (ref: 2^17) edges x 4 heads the
    kept fraction lies within 5.5 standard deviations of 1 - p (a false alarm has
    probability < 4e-8), every kept weight is scaled by exactly 1 / (1 - p) (float64),
    and the value gradient carries the same factors."""
    p, heads, n = 0.6, 4, 1 << (19 if backend == "cpu" else 17)
    indptr = torch.arange(n + 1, dtype=torch.int64)
    indices = torch.randint(0, n, (n,), generator=gen)
    ss = torch.randn(n, heads, generator=gen, dtype=torch.float64)
    val = torch.ones(n, heads, 1, dtype=torch.float64, requires_grad=True)
    drop = _drop(n, gen, p)
    with use_backend(backend):
        out = softmax_aggregate(indptr, indices, ss, ss, val, dropout=drop)
    (g_val,) = torch.autograd.grad(out, val, torch.ones_like(out))
    f = out.flatten()
    kept = f != 0
    frac, draws = float(kept.double().mean()), f.numel()
    assert abs(frac - (1 - p)) <= 5.5 * math.sqrt(p * (1 - p) / draws), frac
    assert torch.equal(f[kept], torch.full_like(f[kept], 1 / (1 - p)))
    assert torch.equal(f, drop.factors(heads, torch.float64).flatten())
    # d value[u] = sum over u's out-edges of the dropped weights
    want = torch.zeros(n, heads, dtype=torch.float64).index_add_(0, indices, out[:, :, 0])
    torch.testing.assert_close(g_val[:, :, 0], want)


def test_nothing_edge_sized_is_saved(gen):
    """Between forward and backward the op holds its inputs, lse and the counter the
    caller gave (the same tensor, not a copy): no [E, H] mask or weights."""
    indptr, indices, num_src = graph_case("skewed", gen)
    num_edges = indices.numel()
    ss, sd, val, _ = _inputs(num_src, indptr.numel() - 1, 3, 2, gen)
    drop = _drop(num_edges, gen)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        softmax_aggregate(indptr, indices, *(t.requires_grad_() for t in (ss, sd, val)),
                          dropout=drop)
    assert not any(t.shape[:1] == (num_edges,) and t.dim() == 2 for t in saved)


def test_bad_dropout_arguments(gen):
    indptr, indices, num_src = graph_case("random", gen)
    ss, sd, val, _ = _inputs(num_src, indptr.numel() - 1, 2, 2, gen)
    for p in (1.0, -0.1, 1.5, "0.5", True):
        with pytest.raises(ValueError, match=r"probability must be a number in \[0, 1\)"):
            EdgeDropout.draw(p, torch.arange(indices.numel()))
    with pytest.raises(TypeError, match="1-D int32/int64"):
        EdgeDropout.draw(0.5, torch.arange(indices.numel()).double())
    short = EdgeDropout.draw(0.5, torch.arange(indices.numel() - 1))
    with pytest.raises(ValueError, match="one counter per edge"):
        softmax_aggregate(indptr, indices, ss, sd, val, dropout=short)
    with pytest.raises(TypeError, match="EdgeDropout or None"):
        softmax_aggregate(indptr, indices, ss, sd, val, dropout=0.5)
    with pytest.raises(ValueError, match="one counter per edge"):
        attention_aggregate(*to_csc(torch.tensor([0, 1]), torch.tensor([1, 0]), 2),
                            torch.zeros(2, 1, 2), torch.zeros(1, 2), torch.zeros(1, 2),
                            dropout=short)
