"""g-SDDMM: reference == explicit loops; numba == reference (forward and backward); gradcheck."""

from __future__ import annotations

import itertools

import pytest
import torch
from graph_cases import graph_case
from kernel_testing import assert_same, max_degree, run

from ngra.kernels import gsddmm, use_backend

pytestmark = pytest.mark.usefixtures("parallel_kernels")

OPS = ["add", "sub", "mul", "div", "dot"]
TARGETS = ["src", "dst", "edge"]
# name -> (lhs feature shape, rhs feature shape)
SHAPES = {
    "same": ((4,), (4,)),
    "3d": ((2, 3), (2, 3)),
    "bcast_rhs": ((2, 3), (2,)),
    "bcast_lhs": ((2, 1), (2, 3)),
    "outer": ((1, 3), (2, 1)),
    "vector": ((), ()),
}
CASES = ["random", "isolated", "bipartite_narrow", "empty", "multi_edges"]
DTYPE_PAIRS = list(itertools.product([torch.float32, torch.float64], [torch.int32, torch.int64]))


def _rows(target, num_src, num_dst, num_edges):
    return {"src": num_src, "dst": num_dst, "edge": num_edges}[target]


def _operands(op, targets, shapes, num_src, num_dst, num_edges, dtype, gen):
    (lt, rt), (fl, fr) = targets, SHAPES[shapes]
    lhs = torch.randn((_rows(lt, num_src, num_dst, num_edges),) + fl, dtype=dtype, generator=gen)
    rhs = torch.randn((_rows(rt, num_src, num_dst, num_edges),) + fr, dtype=dtype, generator=gen)
    if op == "div":  # keep the divisor away from 0
        rhs = torch.sign(rhs) * (0.5 + rhs.abs())
    return lhs, rhs


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _matrix():
    combos = [(t, "3d") for t in itertools.product(TARGETS, TARGETS)]
    combos += [(("dst", "src"), s) for s in SHAPES if s != "3d"]
    combos += [(("edge", "src"), "bcast_rhs"), (("src", "edge"), "bcast_lhs")]
    # One (float, index) dtype pair per combination, cycling through all four.
    for i, (case, op, (targets, shapes)) in enumerate(itertools.product(CASES, OPS, combos)):
        dtype, index_dtype = DTYPE_PAIRS[i % len(DTYPE_PAIRS)]
        if op == "dot" and shapes == "vector":
            continue  # no feature dim to reduce: an error (see test_errors)
        name = (
            f"{case}-{op}-{targets[0]}_{targets[1]}-{shapes}-{_short(dtype)}-{_short(index_dtype)}"
        )
        yield pytest.param(case, op, targets, shapes, dtype, index_dtype, id=name)


# ---------------------------------------------------------------- reference vs loops
def _apply(op, a, b):
    if op == "dot":
        return (a * b).sum(-1)
    return {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}[op]


@pytest.mark.parametrize(
    "op, shapes", [(o, s) for o in OPS for s in SHAPES if not (o == "dot" and s == "vector")]
)
def test_ref_matches_loops(op, shapes, gen):
    indptr, indices, num_src = graph_case("isolated", gen)
    num_dst, num_edges = indptr.numel() - 1, indices.numel()
    lhs, rhs = _operands(
        op, ("dst", "src"), shapes, num_src, num_dst, num_edges, torch.float64, gen
    )
    with use_backend("ref"):
        out = gsddmm(indptr, indices, lhs, rhs, op=op, lhs_target="dst", rhs_target="src")
    rows = []
    for v in range(num_dst):
        for j in range(int(indptr[v]), int(indptr[v + 1])):
            a, b = lhs[v], rhs[int(indices[j])]
            n = max(a.dim(), b.dim())  # align on the left
            a = a.reshape(a.shape + (1,) * (n - a.dim()))
            b = b.reshape(b.shape + (1,) * (n - b.dim()))
            rows.append(_apply(op, a, b))
    expected = torch.stack(rows)
    torch.testing.assert_close(out, expected.reshape(out.shape))
    assert out.shape[1:] == expected.shape[1:]


def test_dot_drops_last_dim():
    indptr = torch.tensor([0, 1, 2])
    indices = torch.tensor([1, 0])
    q = torch.randn(2, 3, 5)
    with use_backend("ref"):
        assert gsddmm(indptr, indices, q, q, op="dot").shape == (2, 3)
        assert gsddmm(indptr, indices, q[:, 0], q[:, 0], op="dot").shape == (2,)
        assert gsddmm(indptr, indices, q, q[:, :, :1], op="mul").shape == (2, 3, 5)


# ---------------------------------------------------------------- numba vs reference
@pytest.mark.parametrize("case, op, targets, shapes, dtype, index_dtype", list(_matrix()))
def test_cpu_matches_ref(case, op, targets, shapes, dtype, index_dtype, gen):
    indptr, indices, num_src = graph_case(case, gen, index_dtype)
    num_dst, num_edges = indptr.numel() - 1, indices.numel()
    lhs, rhs = _operands(op, targets, shapes, num_src, num_dst, num_edges, dtype, gen)

    def fn(a, b):
        return gsddmm(indptr, indices, a, b, op=op, lhs_target=targets[0], rhs_target=targets[1])

    out_ref, grads_ref, grad_out = run("ref", fn, [lhs, rhs], gen=gen)
    out_cpu, grads_cpu, _ = run("cpu", fn, [lhs, rhs], grad_out)
    terms = max(max_degree(indptr), int(torch.bincount(indices.long()).max()) if num_edges else 0)
    assert_same([out_ref, *grads_ref], [out_cpu, *grads_cpu], dtype, terms)


def test_hub(gen):
    indptr, indices, num_src = graph_case("hub", gen, torch.int32)
    q = torch.randn(indptr.numel() - 1, 2, 4, generator=gen)
    k = torch.randn(num_src, 2, 4, generator=gen)

    def fn(a, b):
        return gsddmm(indptr, indices, a, b, op="dot")

    out_ref, grads_ref, grad_out = run("ref", fn, [q, k], gen=gen)
    out_cpu, grads_cpu, _ = run("cpu", fn, [q, k], grad_out)
    assert_same([out_ref, *grads_ref], [out_cpu, *grads_cpu], torch.float32, max_degree(indptr))


# ---------------------------------------------------------------- gradcheck
@pytest.mark.parametrize("shapes", ["3d", "bcast_rhs", "outer"])
@pytest.mark.parametrize("targets", [("dst", "src"), ("src", "src"), ("edge", "dst")])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_gradcheck(backend, op, targets, shapes, gen):
    indptr, indices, num_src = graph_case("bipartite_narrow", gen)
    num_dst, num_edges = indptr.numel() - 1, indices.numel()
    lhs, rhs = _operands(op, targets, shapes, num_src, num_dst, num_edges, torch.float64, gen)

    def fn(a, b):
        with use_backend(backend):
            return gsddmm(
                indptr, indices, a, b, op=op, lhs_target=targets[0], rhs_target=targets[1]
            )

    inputs = (lhs.requires_grad_(), rhs.requires_grad_())
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, fast_mode=True)
