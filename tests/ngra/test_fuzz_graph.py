"""Fuzzing battery for the Graph constructors: generated edge indices, CSC arrays, weights
and node counts of any dtype and shape. Each gives a valid Graph (its invariants and
round trip checked) or a ValueError / TypeError with a message."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("hypothesis")
import scipy.sparse as sp
from fuzzing import documented_errors
from hypothesis import given
from hypothesis import strategies as st

from ngra import Graph

pytestmark = pytest.mark.timeout(240)

_DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.float32,
           torch.bool, torch.float64]


def _check_graph(g: Graph) -> None:
    n, e = g.num_nodes, g.num_edges
    assert g.indptr.shape == (n + 1,) and int(g.indptr[0]) == 0 and int(g.indptr[-1]) == e
    assert bool((g.indptr[1:] >= g.indptr[:-1]).all())
    assert g.indices.shape == (e,) and g.perm.shape == (e,)
    if e:
        assert 0 <= int(g.indices.min()) and int(g.indices.max()) < n
    assert torch.equal(torch.sort(g.perm).values, torch.arange(e))
    if g.edge_weight is not None:
        assert g.edge_weight.shape == (e,) and bool(torch.isfinite(g.edge_weight).all())


@st.composite
def int_arrays(draw: st.DrawFn, shape: tuple[int, ...]) -> object:
    values = draw(st.lists(st.integers(-3, 12), min_size=int(np.prod(shape)),
                           max_size=int(np.prod(shape))))
    t = torch.tensor(values, dtype=torch.int64).reshape(shape)
    dtype = draw(st.sampled_from(_DTYPES))
    t = t.to(dtype)
    form = draw(st.sampled_from(["tensor", "numpy", "list"]))
    return t if form == "tensor" else t.numpy() if form == "numpy" else t.tolist()


_WEIGHTS = st.one_of(
    st.none(),
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=8).map(
        lambda v: torch.tensor(v, dtype=torch.float32)),
    st.lists(st.integers(0, 3), max_size=8).map(torch.tensor),
    st.just("weights"),
)
_NUM_NODES = st.one_of(st.none(), st.integers(-2, 14), st.just(True), st.just(3.0))


@st.composite
def edge_index_inputs(draw: st.DrawFn) -> tuple:
    """A valid (edge_index, num_nodes, edge_weight), then 0-2 of its parts broken."""
    n = draw(st.integers(1, 10))
    e = draw(st.integers(0, 8))
    ei = torch.tensor(draw(st.lists(st.integers(0, n - 1), min_size=2 * e, max_size=2 * e)),
                      dtype=torch.int64).reshape(2, e)
    num_nodes = draw(st.sampled_from([None, n, n + 2]))
    weight = draw(st.sampled_from([None, "ones"]))
    weight = torch.rand(e) if weight else None
    for _ in range(draw(st.integers(0, 2))):
        part = draw(st.sampled_from(["ids", "shape", "dtype", "nodes", "weight"]))
        if part == "ids" and ei.numel() and ei.dtype == torch.int64:
            ei = ei.contiguous()
            ei.view(-1)[draw(st.integers(0, ei.numel() - 1))] = draw(
                st.sampled_from([-1, n + 3, 2**40]))
        elif part == "shape":
            ei = draw(st.sampled_from([ei.t(), ei.reshape(-1), ei[:1], torch.cat([ei, ei])]))
        elif part == "dtype":
            ei = ei.to(draw(st.sampled_from(_DTYPES)))
        elif part == "nodes":
            num_nodes = draw(_NUM_NODES)
        elif part == "weight":
            weight = draw(_WEIGHTS)
    form = draw(st.sampled_from(["tensor", "tensor", "numpy", "list", "str", "none"]))
    ei = {"tensor": ei, "numpy": ei.numpy(), "list": ei.tolist(), "str": "edges",
          "none": None}[form]
    return ei, num_nodes, weight


@given(edge_index_inputs())
def test_fuzz_from_edge_index(inputs: tuple) -> None:
    edge_index, num_nodes, weight = inputs
    with documented_errors(ValueError, TypeError):
        g = Graph.from_edge_index(edge_index, num_nodes=num_nodes, edge_weight=weight)
        _check_graph(g)
        given_ei = torch.as_tensor(np.asarray(edge_index)).long()
        assert torch.equal(g.edge_index(), given_ei)  # original order round trips
        if weight is not None:
            assert torch.equal(g.edge_weight_original(), torch.as_tensor(weight))


@st.composite
def csc_inputs(draw: st.DrawFn) -> tuple:
    """A valid (indptr, indices, num_nodes, edge_weight), then 0-2 of its parts broken."""
    counts = draw(st.lists(st.integers(0, 3), min_size=1, max_size=6))
    n = len(counts)
    indptr = torch.tensor([0, *np.cumsum(counts).tolist()], dtype=torch.int64)
    e = int(indptr[-1])
    indices = torch.tensor(draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e)),
                           dtype=torch.int64)
    num_nodes, weight = draw(st.sampled_from([None, n])), None
    for _ in range(draw(st.integers(0, 2))):
        part = draw(st.sampled_from(["indptr", "indices", "nodes", "weight", "dtype"]))
        if part == "indptr":
            indptr = draw(st.integers(1, 6).flatmap(int_arrays))
        elif part == "indices":
            indices = draw(st.integers(0, 6).flatmap(int_arrays))
        elif part == "nodes":
            num_nodes = draw(_NUM_NODES)
        elif part == "weight":
            weight = draw(_WEIGHTS)
        elif isinstance(indices, torch.Tensor):
            indices = indices.to(draw(st.sampled_from(_DTYPES)))
    return indptr, indices, num_nodes, weight


@given(csc_inputs())
def test_fuzz_from_csc(inputs: tuple) -> None:
    indptr, indices, num_nodes, weight = inputs
    with documented_errors(ValueError, TypeError):
        _check_graph(Graph.from_csc(indptr, indices, num_nodes=num_nodes, edge_weight=weight))


@given(st.integers(0, 5), st.integers(0, 5), st.floats(0, 1), st.booleans())
def test_fuzz_from_scipy(rows: int, cols: int, density: float, weights: bool) -> None:
    matrix = sp.random(rows, cols, density=density, format="coo", random_state=rows * 7 + cols)
    with documented_errors(ValueError, TypeError):
        g = Graph.from_scipy(matrix, use_weights=weights)
        _check_graph(g)
        assert g.num_nodes == rows == cols and g.num_edges == matrix.nnz
