"""split_edges: counts, no leakage of held-out pairs, fixed negatives, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ngra.datasets import DatasetError, LinkSplit, sbm, split_edges
from ngra.graph import Graph


def _pairs(t: torch.Tensor) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in t.t().tolist()}


def _undirected(n: int = 60, e: int = 300, seed: int = 0) -> Graph:
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei = torch.cat([ei, ei.flip(0), torch.tensor([[3], [3]])], 1)  # plus a self-loop
    return Graph.from_edge_index(ei, num_nodes=n)


def test_undirected_split_has_no_leakage():
    graph = _undirected()
    s = split_edges(graph, val=0.1, test=0.2, seed=1)
    assert isinstance(s, LinkSplit) and s.undirected
    mp = _pairs(s.graph.edge_index())
    train = _pairs(s.train_pos)
    for held in (s.val_pos, s.test_pos):
        for u, v in _pairs(held):
            assert u < v
            assert (u, v) not in mp and (v, u) not in mp
            assert (u, v) not in train and (v, u) not in train
    # every training pair is in the message-passing graph, both directions; the loop stays
    assert all((u, v) in mp and (v, u) in mp for u, v in train)
    assert (3, 3) in mp
    # counts: floor of each fraction of the distinct undirected pairs
    ei = graph.edge_index()
    ei = ei[:, ei[0] != ei[1]]
    total = len({(min(a, b), max(a, b)) for a, b in ei.t().tolist()})
    assert s.val_pos.shape[1] == int(0.1 * total) and s.test_pos.shape[1] == int(0.2 * total)
    assert s.train_pos.shape[1] + s.val_pos.shape[1] + s.test_pos.shape[1] == total


def test_negatives_are_fixed_distinct_non_edges():
    graph = _undirected()
    s = split_edges(graph, val=0.1, test=0.2, seed=1, neg_ratio=2.0)
    edges = _pairs(graph.edge_index())
    neg = list(_pairs(s.val_neg)) + list(_pairs(s.test_neg))
    assert s.val_neg.shape[1] == 2 * s.val_pos.shape[1]
    assert len(set(neg)) == len(neg) == s.val_neg.shape[1] + s.test_neg.shape[1]
    for u, v in neg:
        assert u != v and (u, v) not in edges and (v, u) not in edges
    again = split_edges(graph, val=0.1, test=0.2, seed=1, neg_ratio=2.0)
    assert torch.equal(again.val_neg, s.val_neg) and torch.equal(again.test_pos, s.test_pos)
    other = split_edges(graph, val=0.1, test=0.2, seed=2, neg_ratio=2.0)
    assert not torch.equal(other.test_pos, s.test_pos)


def test_directed_graph_holds_out_ordered_pairs():
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 1],
                       [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 0, 2]])  # 1->2 twice: a multi-edge
    s = split_edges(Graph.from_edge_index(ei, num_nodes=10), val=0.2, test=0.2, seed=0)
    assert not s.undirected
    mp = _pairs(s.graph.edge_index())
    held = _pairs(s.val_pos) | _pairs(s.test_pos)
    assert len(held) == 4 and not held & mp
    assert s.graph.num_edges == 12 - sum(2 if p == (1, 2) else 1 for p in held)


def test_dataset_keeps_features_and_rejection_by_argument():
    ds = sbm(nodes=120, blocks=3, feat=4, seed=0)
    s = split_edges(ds, val=0.05, test=0.1)
    assert s.x is ds.x and s.undirected
    forced = split_edges(ds.graph, val=0.05, test=0.1, undirected=False)
    assert not forced.undirected and forced.val_pos.shape[1] > s.val_pos.shape[1]


def test_with_val_edges_adds_both_directions():
    s = split_edges(_undirected(), val=0.1, test=0.1)
    g = s.with_val_edges()
    mp = _pairs(g.edge_index())
    assert all((u, v) in mp and (v, u) in mp for u, v in _pairs(s.val_pos))
    assert g.num_edges == s.graph.num_edges + 2 * s.val_pos.shape[1]


def test_dense_graph_negatives_come_from_every_non_edge():
    n = 12  # complete graph less 5 undirected pairs: exactly 5 non-edges
    u, v = np.triu_indices(n, 1)
    keep = np.ones(u.size, bool)
    keep[[0, 7, 20, 40, 60]] = False
    missing = {(int(a), int(b)) for a, b in zip(u[~keep], v[~keep])}
    ei = torch.from_numpy(np.stack([np.r_[u[keep], v[keep]], np.r_[v[keep], u[keep]]]))
    s = split_edges(Graph.from_edge_index(ei, num_nodes=n), val=0.05, test=0.0, neg_ratio=1.0)
    assert s.val_pos.shape[1] == 3 and _pairs(s.val_neg) <= missing


@pytest.mark.parametrize("kwargs, words", [
    (dict(val=1.0), ["val", "[0, 1)", "1.0"]),
    (dict(test=-0.1), ["test", "-0.1"]),
    (dict(val=0.5, test=0.5), ["val + test", "< 1"]),
    (dict(val=0.01, test=0.0), ["none", "at least 100 pairs", "the graph's 45"]),
])
def test_bad_fractions_and_too_small_graphs(kwargs, words):
    n = 10
    u, v = np.triu_indices(n, 1)  # complete: 45 undirected pairs
    ei = torch.from_numpy(np.stack([np.r_[u, v], np.r_[v, u]]))
    with pytest.raises(DatasetError) as err:
        split_edges(Graph.from_edge_index(ei, num_nodes=n), **kwargs)
    for w in words:
        assert w in str(err.value)


def test_complete_graph_has_no_negatives():
    n = 10
    u, v = np.triu_indices(n, 1)
    ei = torch.from_numpy(np.stack([np.r_[u, v], np.r_[v, u]]))
    with pytest.raises(DatasetError, match=r"4 negative pairs are needed .* only 0 non-edges"):
        split_edges(Graph.from_edge_index(ei, num_nodes=n), val=0.05, test=0.05)


def test_large_graph_rejection_path():
    n = 3000  # 9e6 vertex pairs: negatives by rejection sampling
    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n, (2, 6000), generator=g)
    graph = Graph.from_edge_index(torch.cat([ei, ei.flip(0)], 1), num_nodes=n)
    s = split_edges(graph, val=0.05, test=0.1)
    edges = _pairs(graph.edge_index())
    neg = _pairs(s.val_neg) | _pairs(s.test_neg)
    assert len(neg) == s.val_neg.shape[1] + s.test_neg.shape[1]
    assert all(u < v and (u, v) not in edges for u, v in neg)


def test_train_negatives_avoid_the_message_graph_and_change_per_epoch():
    s = split_edges(_undirected(), val=0.1, test=0.1, seed=4)
    a, b = s.train_negatives(0), s.train_negatives(1)
    assert a.shape == (2, s.train_pos.shape[1]) and not torch.equal(a, b)
    assert torch.equal(a, s.train_negatives(0, seed=4))
    mp = _pairs(s.graph.edge_index())
    assert not any(p in mp for p in _pairs(a)) and bool((a[0] != a[1]).all())
    half = s.train_negatives(0, dst_range=(0, 30))
    assert torch.equal(half, a[:, a[1] < 30])


def test_split_by_relation_holds_out_triples():
    """Typed edges split as (u, relation, v): a held-out triple leaves the message graph
    (both directions), the same pair in another relation stays with its type; negatives
    are no edge in any relation and carry the relations of the positives."""
    from ngra.datasets import load

    ds = load("sbm:nodes=300,blocks=3,feat=4,edge_types=3,seed=1")
    # the same pair in two relations: duplicate some edges with another type
    ei = ds.graph.edge_index()
    extra = ei[:, :40]
    both = torch.cat([ei, extra], 1)
    types = torch.cat([ds.edge_type, (ds.edge_type[:40] + 1) % 3])
    from dataclasses import replace

    ds = replace(ds, graph=Graph.from_edge_index(both, num_nodes=300), edge_type=types)
    s = split_edges(ds, val=0.2, test=0.2, seed=0, by_relation=True)
    assert s.num_relations == 3 and s.edge_type.shape == (s.graph.num_edges,)
    msg = {(u, v, r) for (u, v), r in zip(s.graph.edge_index().t().tolist(), s.edge_type.tolist())}
    triples = {(u, v, r) for (u, v), r in zip(both.t().tolist(), types.tolist())}
    held = []
    for pos, rel in ((s.val_pos, s.val_rel), (s.test_pos, s.test_rel)):
        for (u, v), r in zip(pos.t().tolist(), rel.tolist()):
            assert (u, v, r) not in msg and (v, u, r) not in msg
            assert (u, v, r) in triples or (v, u, r) in triples
            held.append((u, v, r))
    # a held pair's edges in other relations stay typed in the message graph (unless
    # those triples are held out themselves)
    held_both = {t for u, v, r in held for t in ((u, v, r), (v, u, r))}
    others = [(u, v, q) for u, v, r in held for q in range(3)
              if q != r and ((u, v, q) in triples or (v, u, q) in triples)]
    assert others
    for u, v, q in others:
        assert (u, v, q) in held_both or (u, v, q) in msg or (v, u, q) in msg
    pairs = {(u, v) for u, v, _ in triples} | {(v, u) for u, v, _ in triples}
    for neg, rel, pos_rel in ((s.val_neg, s.val_neg_rel, s.val_rel),
                              (s.test_neg, s.test_neg_rel, s.test_rel)):
        assert not any((u, v) in pairs for u, v in neg.t().tolist())
        assert torch.equal(rel, pos_rel[torch.arange(rel.numel()) % pos_rel.numel()])
    neg, index = s.train_negatives(3, return_index=True)
    assert torch.equal(s.negative_relations(index), s.train_rel[index % s.train_rel.numel()])
    assert s.summary()["relations"] == 3
    with pytest.raises(DatasetError, match="typed edges"):
        split_edges(load("sbm:nodes=100,blocks=2,feat=4"), by_relation=True)
