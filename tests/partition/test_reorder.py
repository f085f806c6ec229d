"""Vertex orderings and relabeling: permutations, edge multisets, the perm to original edges."""

from __future__ import annotations

import pytest
import torch

import ngra
from ngra.partition import (
    REORDER_METHODS,
    Reordering,
    metis_parts,
    permute_graph,
    permute_rows,
    relabel,
    reorder,
    unpermute_rows,
)

from partition_cases import CASES


def _is_permutation(t: torch.Tensor, n: int) -> bool:
    return (
        t.dtype == torch.int64
        and t.shape == (n,)
        and torch.equal(torch.sort(t).values, torch.arange(n))
    )


def _edge_multiset(ei: torch.Tensor) -> list[tuple[int, int]]:
    return sorted(map(tuple, ei.t().tolist()))


@pytest.mark.parametrize("method", REORDER_METHODS)
def test_reorder_is_a_permutation(graph_case, method):
    r = reorder(graph_case, method)
    n = graph_case.num_nodes
    assert _is_permutation(r.order, n) and _is_permutation(r.rank, n)
    assert torch.equal(r.rank[r.order], torch.arange(n))
    assert torch.equal(r.order[r.rank], torch.arange(n))
    assert r.method == method


def test_degree_order_descending_and_stable(graph_case):
    r = reorder(graph_case, "degree")
    deg = graph_case.in_degrees()[r.order]
    assert bool((deg[1:] <= deg[:-1]).all())
    # ties keep ascending old ids
    same = deg[1:] == deg[:-1]
    assert bool((r.order[1:][same] > r.order[:-1][same]).all())


def test_degree_order_by_hand():
    g = ngra.Graph.from_edge_index(torch.tensor([[0, 1, 2, 0, 3], [2, 2, 1, 3, 3]]), num_nodes=5)
    # in-degrees: [0, 1, 2, 2, 0] -> 2, 3 (tie, by id), 1, 0, 4
    assert reorder(g, "degree").order.tolist() == [2, 3, 1, 0, 4]


def test_metis_order_groups_parts(graph_case):
    k = 3
    r = reorder(graph_case, "metis", num_parts=k, seed=0)
    parts = metis_parts(graph_case, k, seed=0)
    p = parts[r.order]
    assert bool((p[1:] >= p[:-1]).all())
    same = p[1:] == p[:-1]
    assert bool((r.order[1:][same] > r.order[:-1][same]).all())


def test_rcm_shrinks_bandwidth_of_a_shuffled_path():
    n = 200
    shuffle = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    path = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
    g = ngra.Graph.from_edge_index(shuffle[path], num_nodes=n)
    before = int((g.edge_index()[0] - g.edge_index()[1]).abs().max())
    h = permute_graph(g, reorder(g, "rcm"))
    after = int((h.edge_index()[0] - h.edge_index()[1]).abs().max())
    assert after == 1 < before


@pytest.mark.parametrize("method", REORDER_METHODS)
def test_permute_graph_relabels_and_keeps_original_edge_ids(graph_case, method):
    g = graph_case
    r = reorder(g, method, num_parts=2)
    h = permute_graph(g, r)
    ei = g.edge_index()  # original order
    # Same edges in the caller's original order, relabeled: edge data keeps lining up.
    assert torch.equal(h.edge_index(), r.rank[ei])
    # CSC edge j of h is original edge h.perm[j].
    assert torch.equal(h.edge_index("csc"), r.rank[ei[:, h.perm]])
    assert _edge_multiset(h.edge_index()) == _edge_multiset(r.rank[ei])
    assert torch.equal(h.in_degrees(), g.in_degrees()[r.order])
    if g.edge_weight is None:
        assert h.edge_weight is None
    else:
        assert torch.equal(h.edge_weight_original(), g.edge_weight_original())
    # Exactly what building from the relabeled edge list gives (edge order inside columns too).
    ref = ngra.Graph.from_edge_index(
        r.rank[ei], num_nodes=g.num_nodes, edge_weight=g.edge_weight_original()
    )
    for name in ("indptr", "indices", "perm", "edge_weight"):
        a, b = getattr(h, name), getattr(ref, name)
        assert (a is None and b is None) or torch.equal(a, b), name


def test_permute_graph_roundtrip_and_composition(power_law):
    g = power_law
    r1, r2 = reorder(g, "degree"), reorder(g, "rcm")
    back = permute_graph(permute_graph(g, r1), r1.inverse())
    for name in ("indptr", "indices", "perm", "edge_weight"):
        assert torch.equal(getattr(back, name), getattr(g, name)), name
    h12 = permute_graph(permute_graph(g, r1), reorder(permute_graph(g, r1), "rcm"))
    r12 = r1.then(reorder(permute_graph(g, r1), "rcm"))
    assert torch.equal(permute_graph(g, r12).indices, h12.indices)
    assert torch.equal(permute_graph(g, r12).perm, h12.perm)
    assert r2.num_nodes == g.num_nodes


def test_permute_graph_from_csc_keeps_csc_edge_ids():
    g = ngra.Graph.from_csc(torch.tensor([0, 2, 3, 3]), torch.tensor([1, 2, 0]))
    r = Reordering.from_order(torch.tensor([2, 0, 1]))
    h = permute_graph(g, r)
    assert torch.equal(h.edge_index(), r.rank[g.edge_index()])
    assert h.perm.tolist() == [0, 1, 2]  # old column 0 is new column 1, old 1 is new 2


def test_rows_roundtrip():
    g = CASES["power_law"]
    r = reorder(g, "degree")
    x = torch.randn(g.num_nodes, 3)
    xn = permute_rows(x, r)
    assert torch.equal(xn[r.rank], x)  # vertex v's row moved to row rank[v]
    assert torch.equal(unpermute_rows(xn, r), x)
    ids = torch.tensor([0, 5, 7])
    assert torch.equal(xn[relabel(ids, r)], x[ids])
    mask = torch.rand(g.num_nodes) > 0.5
    assert torch.equal(unpermute_rows(permute_rows(mask, r), r), mask)


def test_errors():
    g = CASES["multi_edges"]
    with pytest.raises(ValueError, match="unknown reorder method"):
        reorder(g, "random")
    with pytest.raises(ValueError, match="permutation"):
        Reordering.from_order(torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="permutation"):
        Reordering.from_order(torch.tensor([0, 3, 1]))
    with pytest.raises(ValueError, match="vertices"):
        permute_graph(g, Reordering.identity(3))
    with pytest.raises(ValueError, match="rows"):
        permute_rows(torch.zeros(4, 2), Reordering.identity(5))
