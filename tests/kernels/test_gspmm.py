"""g-SpMM: reference == explicit loops; numba == reference (forward and backward); gradcheck."""

from __future__ import annotations

import itertools

import pytest
import torch
from graph_cases import CASES, graph_case, to_csc
from kernel_testing import assert_same, max_degree, run

from ngra.kernels import gspmm, transpose_csc, use_backend

pytestmark = pytest.mark.usefixtures("parallel_kernels")

REDUCES = ["sum", "mean", "max", "min"]
# name -> (src feature shape, edge feature shape or None)
MODES = {
    "copy": ((6,), None),
    "copy_3d": ((2, 3), None),
    "u_mul_e_scalar": ((5,), ()),
    "u_mul_e_heads": ((2, 4), (2,)),
    "u_mul_e_full": ((2, 3), (2, 3)),
}
DTYPES = [torch.float32, torch.float64]
INDEX_DTYPES = [torch.int32, torch.int64]


def _feats(mode, num_src, num_edges, dtype, gen):
    fshape, eshape = MODES[mode]
    src = torch.randn((num_src,) + fshape, dtype=dtype, generator=gen)
    edge = (
        None if eshape is None else torch.randn((num_edges,) + eshape, dtype=dtype, generator=gen)
    )
    return src, edge


# ---------------------------------------------------------------- reference vs loops
def _loop_gspmm(indptr, indices, src, edge, reduce):
    """out[v] = reduce over in-edges, written as plain Python loops."""
    num_dst = indptr.numel() - 1
    out = torch.zeros((num_dst,) + src.shape[1:], dtype=src.dtype)
    for v in range(num_dst):
        msgs = []
        for j in range(int(indptr[v]), int(indptr[v + 1])):
            m = src[int(indices[j])]
            if edge is not None:
                w = edge[j]
                m = m * w.reshape(w.shape + (1,) * (m.dim() - w.dim()))
            msgs.append(m)
        if msgs:
            stack = torch.stack(msgs)
            out[v] = {
                "sum": stack.sum(0),
                "mean": stack.mean(0),
                "max": stack.max(0).values,
                "min": stack.min(0).values,
            }[reduce]
    return out


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("reduce", REDUCES)
def test_ref_matches_loops(reduce, mode, gen):
    indptr, indices, num_src = graph_case("isolated", gen)
    src, edge = _feats(mode, num_src, indices.numel(), torch.float64, gen)
    with use_backend("ref"):
        out = gspmm(indptr, indices, src, edge, reduce=reduce)
    torch.testing.assert_close(out, _loop_gspmm(indptr, indices, src, edge, reduce))


def test_ref_max_gradient_goes_to_first_extreme_edge():
    # dst 0 <- src 0 (value 1), src 1 (value 3), src 2 (value 3): the tie goes to src 1.
    indptr = torch.tensor([0, 3, 3])
    indices = torch.tensor([0, 1, 2])
    for backend in ("ref", "cpu"):
        x = torch.tensor([[1.0], [3.0], [3.0]], requires_grad=True)
        with use_backend(backend):
            out = gspmm(indptr, indices, x, reduce="max")
        out.sum().backward()
        assert out.tolist() == [[3.0], [0.0]]
        assert x.grad.flatten().tolist() == [0.0, 1.0, 0.0], backend


# ---------------------------------------------------------------- numba vs reference
# The 10^5-edge hub is slow on the reference: two modes only.
HUB_MODES = ("copy", "u_mul_e_heads")


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _matrix():
    """case x reduce x mode x float dtype; the index dtype alternates, so every
    (float, index) dtype pair runs on every case."""
    combos = itertools.product(CASES, REDUCES, MODES)
    for i, (case, reduce, mode) in enumerate(combos):
        if case == "hub" and mode not in HUB_MODES:
            continue
        for dtype, index_dtype in zip(DTYPES, INDEX_DTYPES[i % 2 :] + INDEX_DTYPES[: i % 2]):
            name = f"{case}-{reduce}-{mode}-{_short(dtype)}-{_short(index_dtype)}"
            yield pytest.param(case, reduce, mode, dtype, index_dtype, id=name)


@pytest.mark.parametrize("case, reduce, mode, dtype, index_dtype", list(_matrix()))
def test_cpu_matches_ref(case, reduce, mode, dtype, index_dtype, gen):
    indptr, indices, num_src = graph_case(case, gen, index_dtype)
    src, edge = _feats(mode, num_src, indices.numel(), dtype, gen)

    def fn(x, w):
        return gspmm(indptr, indices, x, w, reduce=reduce)

    out_ref, grads_ref, grad_out = run("ref", fn, [src, edge], gen=gen)
    out_cpu, grads_cpu, _ = run("cpu", fn, [src, edge], grad_out)
    assert out_cpu.shape == (indptr.numel() - 1,) + src.shape[1:]
    assert torch.isfinite(out_cpu).all()
    assert_same([out_ref, *grads_ref], [out_cpu, *grads_cpu], dtype, max_degree(indptr))


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_rev_argument_gives_same_gradients(backend, gen):
    indptr, indices, num_src = graph_case("bipartite_wide", gen)
    src, edge = _feats("u_mul_e_heads", num_src, indices.numel(), torch.float64, gen)
    rev = transpose_csc(indptr, indices, num_src)

    def fn_rev(x, w):
        return gspmm(indptr, indices, x, w, reduce="mean", rev=rev)

    def fn(x, w):
        return gspmm(indptr, indices, x, w, reduce="mean")

    out_a, grads_a, grad_out = run(backend, fn_rev, [src, edge], gen=gen)
    out_b, grads_b, _ = run(backend, fn, [src, edge], grad_out)
    assert_same([out_a, *grads_a], [out_b, *grads_b], torch.float64)


def test_graph_csr_is_a_valid_rev(gen):
    import ngra

    src_ids, dst_ids = torch.randint(0, 15, (2, 60), generator=gen)
    g = ngra.Graph.from_edge_index(torch.stack([src_ids, dst_ids]), num_nodes=15)
    x = torch.randn(15, 4, dtype=torch.float64, generator=gen)
    out_a, grads_a, grad_out = run(
        "cpu", lambda t: gspmm(g.indptr, g.indices, t, rev=g.csr()), [x], gen=gen
    )
    out_b, grads_b, _ = run("ref", lambda t: gspmm(g.indptr, g.indices, t), [x], grad_out)
    assert_same([out_a, *grads_a], [out_b, *grads_b], torch.float64)


def test_noncontiguous_inputs(gen):
    indptr, indices, num_src = graph_case("random", gen)
    base = torch.randn(6, num_src, dtype=torch.float64, generator=gen)
    x = base.t()  # [num_src, 6], not contiguous
    idx = torch.stack([indices, indices], 1)[:, 0]  # strided view
    w = torch.randn(indices.numel(), 2, dtype=torch.float64, generator=gen)[:, 1]
    with use_backend("cpu"):
        out = gspmm(indptr, idx, x, w)
    with use_backend("ref"):
        ref = gspmm(indptr, indices.contiguous(), x.contiguous(), w.contiguous())
    torch.testing.assert_close(out, ref)


def test_zero_in_degree_gives_zero_not_inf():
    indptr = torch.tensor([0, 0, 2, 2])
    indices = torch.tensor([0, 1])
    x = torch.tensor([[-1.0, 2.0], [3.0, -4.0]])
    for backend in ("ref", "cpu"):
        for reduce in REDUCES:
            with use_backend(backend):
                out = gspmm(indptr, indices, x, reduce=reduce)
            assert out[0].tolist() == [0.0, 0.0] and out[2].tolist() == [0.0, 0.0]


# ---------------------------------------------------------------- gradcheck
def _gradcheck_graph(gen):
    """7 sources, 6 destinations (2 and 5 without in-edges), no multi-edges."""
    src, dst = [], []
    for v in (0, 1, 3, 4):
        k = int(torch.randint(1, 5, (1,), generator=gen))
        chosen = torch.randperm(7, generator=gen)[:k]
        src += chosen.tolist()
        dst += [v] * k
    indptr, indices = to_csc(torch.tensor(src), torch.tensor(dst), 6)
    return indptr, indices, 7


def _no_near_ties(indptr, indices, src, edge, gap=1e-3):
    """True when no destination has two messages closer than ``gap`` (per feature)."""
    # One destination per edge: gspmm then returns each edge's message.
    per_edge = torch.arange(indices.numel() + 1)
    with use_backend("ref"):
        msg = gspmm(per_edge, indices, src, edge).reshape(indices.numel(), -1)
    for v in range(indptr.numel() - 1):
        vals = msg[int(indptr[v]) : int(indptr[v + 1])]
        if vals.shape[0] > 1:
            s = vals.sort(0).values
            if bool((s[1:] - s[:-1] < gap).any()):
                return False
    return True


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("reduce", REDUCES)
@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_gradcheck(backend, reduce, mode, gen):
    indptr, indices, num_src = _gradcheck_graph(gen)
    for _ in range(20):
        src, edge = _feats(mode, num_src, indices.numel(), torch.float64, gen)
        if reduce in ("sum", "mean") or _no_near_ties(indptr, indices, src, edge):
            break
    inputs = (src.requires_grad_(),) + ((edge.requires_grad_(),) if edge is not None else ())

    def fn(*args):
        with use_backend(backend):
            return gspmm(indptr, indices, *args, reduce=reduce)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, fast_mode=True)


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_gradcheck_empty_graph(backend):
    indptr = torch.zeros(4, dtype=torch.int64)
    indices = torch.empty(0, dtype=torch.int64)
    x = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    w = torch.randn(0, dtype=torch.float64, requires_grad=True)

    def fn(a, b):
        with use_backend(backend):
            return gspmm(indptr, indices, a, b, reduce="max")

    assert torch.autograd.gradcheck(fn, (x, w))


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_factor_scaled_sum_matches_per_edge_weights(case, reduce, gen):
    """``scale=(s_src, s_dst)`` (weights as per-vertex factors, GCN's normalization) on
    the CPU kernel == the reference with the per-edge weights ``s_src[u] * s_dst[v]``,
    forward and backward, on every labeled case (degrees below and above the kernel's
    four-edge step)."""
    indptr, indices, num_src = graph_case(case, gen)
    num_dst = indptr.numel() - 1
    x = torch.randn(num_src, 7, dtype=torch.float64, generator=gen)
    s_src = torch.rand(num_src, dtype=torch.float64, generator=gen) + 0.5
    s_dst = torch.rand(num_dst, dtype=torch.float64, generator=gen) + 0.5
    dst = torch.repeat_interleave(torch.arange(num_dst), torch.diff(indptr))
    w = s_src[indices] * s_dst[dst]
    grad = torch.randn(num_dst, 7, dtype=torch.float64, generator=gen)
    got = run("cpu", lambda a: gspmm(indptr, indices, a, scale=(s_src, s_dst), reduce=reduce),
              [x], grad)
    want = run("ref", lambda a, e: gspmm(indptr, indices, a, e, reduce=reduce), [x, w], grad)
    assert_same([got[0], got[1][0]], [want[0], want[1][0]], torch.float64)


def _deferred_rev(indptr, indices, num_src):
    """A DeferredReverse over this CSC, and a list that records each time it is made."""
    from ngra.graph import CSR, DeferredReverse

    made = []

    def make():
        made.append(True)
        return CSR(*transpose_csc(indptr, indices, num_src))

    return DeferredReverse(make, lambda: None), made


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("scaled", [False, True], ids=["copy", "scaled"])
@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_csc_walk_backward_matches_the_reverse_and_makes_none(case, reduce, scaled, backend,
                                                              gen):
    """Under ``prefer_csc_walk`` (a memory budget) the sum/mean g-SpMM's source gradient is
    computed from the CSC itself: the same as the reverse CSR's (the reference), for copy and
    factor-scaled messages, int32 and int64 ids, several threads; the deferred reverse it
    was given is never made, and without the preference it is."""
    from ngra.kernels.transpose import prefer_csc_walk

    index_dtype = INDEX_DTYPES[sorted(CASES).index(case) % 2]
    indptr, indices, num_src = graph_case(case, gen, index_dtype)
    num_dst = indptr.numel() - 1
    x = torch.randn(num_src, 2, 3, dtype=torch.float64, generator=gen)
    scale = ((torch.rand(num_src, dtype=torch.float64, generator=gen) + 0.5,
              torch.rand(num_dst, dtype=torch.float64, generator=gen) + 0.5) if scaled else None)
    rev, made = _deferred_rev(indptr, indices, num_src)

    def fn(a):
        return gspmm(indptr, indices, a, reduce=reduce, rev=rev, scale=scale)

    want = run("ref", lambda a: gspmm(indptr, indices, a, reduce=reduce, scale=scale), [x],
               gen=gen)
    with prefer_csc_walk():
        got = run(backend, fn, [x], want[2])
    assert not made
    assert_same([got[0], got[1][0]], [want[0], want[1][0]], torch.float64)
    run(backend, fn, [x], want[2])  # no preference: the reverse is made and used
    assert made


def test_csc_walk_is_recorded_at_forward_and_needs_no_reverse_argument(gen):
    """The preference is read when forward runs (a budget's block may close before
    ``backward``), and with ``rev=None`` the walk builds no cached transpose either."""
    from ngra.kernels import transpose as tr
    from ngra.kernels.transpose import prefer_csc_walk

    indptr, indices, num_src = graph_case("hub", gen)
    x = torch.randn(num_src, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    calls = []
    real = tr.lookup

    def spy(op, device="cpu"):
        calls.append(op)
        return real(op, device)

    with use_backend("cpu"):
        with prefer_csc_walk():
            out = gspmm(indptr, indices, x)
        tr.lookup = spy
        try:
            out.sum().backward()
        finally:
            tr.lookup = real
    assert "transpose_csc" not in calls
    dst = torch.repeat_interleave(torch.arange(indptr.numel() - 1), torch.diff(indptr))
    want = torch.zeros(num_src, dtype=torch.float64).index_add_(
        0, indices.long(), torch.ones(dst.numel(), dtype=torch.float64))
    torch.testing.assert_close(x.grad, want.view(-1, 1).expand(-1, 4))
