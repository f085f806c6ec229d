"""sample_negatives: seeded per epoch, the same set on any number of ranks, edges rejected."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fresh_python import fresh_python

from ngra.datasets import DatasetError, sample_negatives
from ngra.datasets.negatives import is_edge
from ngra.graph import Graph


def _graph(n: int = 50, e: int = 400, seed: int = 0) -> Graph:
    g = torch.Generator().manual_seed(seed)
    return Graph.from_edge_index(torch.randint(0, n, (2, e), generator=g), num_nodes=n)


def test_seeded_by_seed_and_epoch():
    a = sample_negatives(100, 500, seed=3, epoch=1)
    assert a.shape == (2, 500) and a.dtype == torch.int64
    assert torch.equal(a, sample_negatives(100, 500, seed=3, epoch=1))
    assert not torch.equal(a, sample_negatives(100, 500, seed=3, epoch=2))
    assert not torch.equal(a, sample_negatives(100, 500, seed=4, epoch=1))
    assert bool((a[0] != a[1]).all())  # no self-loops by default


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("kind", ["uniform", "degree"])
def test_union_over_ranks_is_the_single_process_set(ranks, kind):
    graph = _graph()
    deg = (graph.in_degrees() + graph.out_degrees()).double()
    kw = dict(seed=7, epoch=5, kind=kind, degrees=deg if kind == "degree" else None,
              exclude=graph)
    whole, index = sample_negatives(50, 3000, return_index=True, **kw)
    bounds = np.linspace(0, 50, ranks + 1).astype(int)
    parts = [sample_negatives(50, 3000, dst_range=(lo, hi), return_index=True, **kw)
             for lo, hi in zip(bounds[:-1], bounds[1:])]
    for (p, i), lo, hi in zip(parts, bounds[:-1], bounds[1:]):
        assert bool(((p[1] >= lo) & (p[1] < hi)).all())
    got_i = torch.cat([i for _, i in parts])
    got_p = torch.cat([p for p, _ in parts], 1)
    order = torch.argsort(got_i)
    assert torch.equal(got_i[order], index) and torch.equal(got_p[:, order], whole)


@pytest.mark.parametrize("kind", ["uniform", "degree"])
def test_owned_masks_with_owned_columns_only_give_the_single_process_set(kind):
    # a rank of a METIS book owns no range, and holds only its own vertices' in-edges
    graph = _graph()
    deg = (graph.in_degrees() + graph.out_degrees()).double()
    kw = dict(seed=3, epoch=2, kind=kind, degrees=deg if kind == "degree" else None)
    whole, index = sample_negatives(50, 2000, exclude=graph, return_index=True, **kw)
    owner = np.random.default_rng(0).integers(0, 3, 50)
    ei = graph.edge_index()
    got_i, got_p = [], []
    for r in range(3):
        mine = owner == r
        cols = torch.from_numpy(mine)[ei[1]]
        own_graph = Graph.from_edge_index(ei[:, cols], num_nodes=50)
        p, i = sample_negatives(50, 2000, exclude=own_graph, dst_owned=mine,
                                return_index=True, **kw)
        assert bool(torch.from_numpy(mine)[p[1]].all())
        got_i.append(i)
        got_p.append(p)
    got_i, got_p = torch.cat(got_i), torch.cat(got_p, 1)
    order = torch.argsort(got_i)
    assert torch.equal(got_i[order], index) and torch.equal(got_p[:, order], whole)
    with pytest.raises(ValueError, match="not both"):
        sample_negatives(50, 10, 0, dst_range=(0, 5), dst_owned=owner == 0)
    with pytest.raises(DatasetError, match=r"\[50\] bool mask"):
        sample_negatives(50, 10, 0, dst_owned=np.ones(49, bool))


def test_exclude_rejects_every_edge():
    graph = _graph(n=30, e=300)
    neg = sample_negatives(30, 5000, seed=0, exclude=graph)
    edges = {tuple(e) for e in graph.edge_index().t().tolist()}
    assert neg.shape[1] == 5000
    assert not any((u, v) in edges for u, v in neg.t().tolist())
    assert bool((neg[0] != neg[1]).all())


def test_is_edge_matches_a_set_on_unsorted_columns():
    ei = torch.tensor([[4, 0, 2, 3, 1, 2], [1, 1, 1, 0, 3, 2]])  # column 1: sources 4, 0, 2
    graph = Graph.from_edge_index(ei, num_nodes=5)
    edges = {tuple(e) for e in ei.t().tolist()}
    s, d = np.meshgrid(np.arange(5), np.arange(5))
    found = is_edge(graph, s.ravel(), d.ravel())
    assert [bool(f) for f in found] == [(a, b) in edges for a, b in zip(s.ravel(), d.ravel())]


def test_degree_kind_follows_the_weights():
    deg = torch.zeros(10)
    deg[[2, 7]] = torch.tensor([1.0, 3.0])
    neg = sample_negatives(10, 4000, seed=0, kind="degree", degrees=deg, self_loops=True)
    assert set(neg.unique().tolist()) == {2, 7}
    share = float((neg[1] == 7).double().mean())
    assert 0.72 < share < 0.78


def test_unfixable_destination_is_dropped_with_a_warning(caplog):
    n = 4  # every vertex points to 0: no source can make a negative into 0
    graph = Graph.from_edge_index(torch.tensor([[1, 2, 3], [0, 0, 0]]), num_nodes=n)
    neg = sample_negatives(n, 400, seed=0, exclude=graph)
    assert 0 < neg.shape[1] < 400 and bool((neg[1] != 0).all())
    assert "dropped" in caplog.text


def test_errors_name_what_is_wrong():
    with pytest.raises(DatasetError, match="degrees"):
        sample_negatives(10, 5, seed=0, kind="degree")
    with pytest.raises(DatasetError, match="'uniform' or 'degree'"):
        sample_negatives(10, 5, seed=0, kind="popular")
    with pytest.raises(DatasetError, match="exclude has 5 vertices; expected num_nodes=10"):
        sample_negatives(10, 5, seed=0, exclude=_graph(n=5, e=3))


def test_grouped_by_destination_in_index_order():
    graph = _graph()
    pairs, index = sample_negatives(50, 3000, seed=5, epoch=1, exclude=graph,
                                    return_index=True)
    assert torch.equal(index, torch.arange(3000))
    assert bool((pairs[1, 1:] >= pairs[1, :-1]).all())


@pytest.mark.parametrize("kind", ["uniform", "degree"])
def test_both_endpoints_follow_the_distribution(kind):
    # as a multiset, num independent pairs: destinations and sources each uniform (or in
    # proportion to the weights), and independent of each other
    n, num = 8, 80_000
    w = torch.arange(1, n + 1, dtype=torch.float64)
    p = (w / w.sum()).numpy() if kind == "degree" else np.full(n, 1 / n)
    pairs = sample_negatives(n, num, seed=1, kind=kind, degrees=w, self_loops=True)
    for row in pairs:
        share = np.bincount(row.numpy(), minlength=n) / num
        np.testing.assert_allclose(share, p, atol=0.01)
    joint = np.bincount((pairs[0] * n + pairs[1]).numpy(), minlength=n * n) / num
    np.testing.assert_allclose(joint, np.outer(p, p).ravel(), atol=0.006)


def test_loading_datasets_does_not_load_numba():
    """The searches and draws are numba kernels in ``ngra.kernels.cpu.csc_search``,
    imported when one first runs: ``import ngra.datasets`` (every ``ngra`` command, a GPU
    rank) does not pay numba's 56 MB; drawing negatives loads it."""
    code = ("import sys, ngra.datasets as d\n"
            "assert 'numba' not in sys.modules, 'import ngra.datasets loaded numba'\n"
            "d.sample_negatives(20, 30, seed=0)\n"
            "print('numba' in sys.modules)\n")
    assert fresh_python(code) == "True"
