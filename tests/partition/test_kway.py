"""k-way partitioning: METIS parts and contiguous balanced ranges."""

from __future__ import annotations

import pytest
import torch

import ngra
from ngra.partition import (
    cost_balanced_ranges,
    degree_indptr,
    edge_balanced_ranges,
    interval_of,
    metis_parts,
    refine_ranges,
    symmetric_adjacency,
)

from partition_cases import CASES


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_metis_parts_cover_all_vertices(graph_case, k):
    parts = metis_parts(graph_case, k, seed=0)
    n = graph_case.num_nodes
    assert parts.dtype == torch.int64 and parts.shape == (n,)
    if n:
        assert int(parts.min()) >= 0 and int(parts.max()) < k
        # every part is used when there are enough vertices
        assert torch.unique(parts).numel() == min(k, n)
    assert torch.equal(parts, metis_parts(graph_case, k, seed=0))  # deterministic


def test_metis_parts_cut_few_edges_on_two_cliques():
    a = torch.combinations(torch.arange(10), 2).t()
    b = a + 10
    bridge = torch.tensor([[0], [10]])
    g = ngra.Graph.from_edge_index(torch.cat([a, b, bridge], 1), num_nodes=20)
    parts = metis_parts(g, 2, seed=1)
    assert torch.unique(parts[:10]).numel() == 1 and torch.unique(parts[10:]).numel() == 1
    assert int(parts[0]) != int(parts[10])
    edges = metis_parts(g, 2, balance="edges")
    assert edges.shape == (20,)


def test_symmetric_adjacency_is_simple_and_symmetric(graph_case):
    xadj, adj = symmetric_adjacency(graph_case)
    n = graph_case.num_nodes
    assert xadj.shape == (n + 1,) and xadj[-1] == adj.size
    pairs = set()
    for u in range(n):
        nb = adj[xadj[u] : xadj[u + 1]].tolist()
        assert nb == sorted(set(nb)) and u not in nb  # sorted, no duplicates, no self loop
        pairs |= {(u, v) for v in nb}
    assert all((v, u) in pairs for u, v in pairs)
    ei = graph_case.edge_index()
    expect = {(int(s), int(d)) for s, d in ei.t().tolist() if s != d}
    assert pairs == expect | {(d, s) for s, d in expect}


@pytest.mark.parametrize("k", [1, 2, 3, 5, 16, 50])
def test_edge_balanced_ranges_cover_and_balance(graph_case, k):
    g = graph_case
    n, e = g.num_nodes, g.num_edges
    deg = g.in_degrees()
    max_deg = int(deg.max()) if n else 0
    for vertex_cost in (0.0, 1.0, 3.0):
        b = edge_balanced_ranges(g.indptr, k, vertex_cost=vertex_cost)
        assert b.dtype == torch.int64 and b.shape == (k + 1,)
        assert int(b[0]) == 0 and int(b[-1]) == n and bool((b[1:] >= b[:-1]).all())
        cost = g.indptr[b[1:]] - g.indptr[b[:-1]] + vertex_cost * (b[1:] - b[:-1])
        total = e + vertex_cost * n
        assert float(cost.max()) <= total / k + max_deg + vertex_cost + 1e-9
        if vertex_cost == 0:
            edges = g.indptr[b[1:]] - g.indptr[b[:-1]]
            assert int(edges.max()) <= e / k + max_deg


def test_edge_balanced_ranges_by_hand():
    indptr = degree_indptr(torch.tensor([4, 0, 0, 4, 1, 1, 1, 1]))  # 12 edges
    assert edge_balanced_ranges(indptr, 3, vertex_cost=0).tolist() == [0, 1, 4, 8]
    # edges + vertices: costs [5, 1, 1, 5, 2, 2, 2, 2], prefix [0, 5, 6, 7, 12, 14, 16, 18, 20]
    assert edge_balanced_ranges(indptr, 2).tolist() == [0, 4, 8]  # target 10: 12 beats 7
    assert edge_balanced_ranges(indptr, 3).tolist() == [0, 3, 5, 8]  # 6.67 -> 7, 13.33 -> 14
    # only vertices
    assert edge_balanced_ranges(indptr, 4, edge_cost=0).tolist() == [0, 2, 4, 6, 8]
    # a sub-range (one rank's columns)
    assert edge_balanced_ranges(indptr, 2, vertex_cost=0, start=3, stop=8).tolist() == [3, 4, 8]
    # more ranges than vertices: some are empty
    b = edge_balanced_ranges(indptr, 12)
    assert b[0] == 0 and b[-1] == 8 and bool((b[1:] >= b[:-1]).all())


def test_cost_balanced_ranges_and_interval_of():
    b = cost_balanced_ranges(torch.tensor([1.0, 1.0, 6.0, 1.0, 1.0]), 2)
    assert b.tolist() == [0, 2, 5] or b.tolist() == [0, 3, 5]
    assert cost_balanced_ranges(torch.ones(6), 3).tolist() == [0, 2, 4, 6]
    bounds = torch.tensor([0, 2, 2, 5])
    assert interval_of(bounds, torch.tensor([0, 1, 2, 4])).tolist() == [0, 0, 2, 2]


def test_errors():
    g = CASES["hub"]
    with pytest.raises(ValueError, match=">= 1"):
        edge_balanced_ranges(g.indptr, 0)
    with pytest.raises(TypeError):
        edge_balanced_ranges(g.indptr, 2.5)
    with pytest.raises(ValueError, match="both be 0"):
        edge_balanced_ranges(g.indptr, 2, vertex_cost=0, edge_cost=0)
    with pytest.raises(ValueError, match="start"):
        edge_balanced_ranges(g.indptr, 2, start=5, stop=2)
    with pytest.raises(ValueError, match="balance"):
        metis_parts(g, 2, balance="flops")
    with pytest.raises(ValueError, match=">= 1"):
        metis_parts(g, 0)


def test_refine_ranges_nests_rank_ranges(power_law):
    outer = edge_balanced_ranges(power_law.indptr, 3)
    fine = refine_ranges(power_law.indptr, outer, 4)
    assert fine.shape == (13,) and torch.equal(fine[::4], outer)
    assert bool((fine[1:] >= fine[:-1]).all())
    for r in range(3):
        assert torch.equal(
            fine[4 * r : 4 * r + 5],
            edge_balanced_ranges(power_law.indptr, 4, start=int(outer[r]), stop=int(outer[r + 1])),
        )
