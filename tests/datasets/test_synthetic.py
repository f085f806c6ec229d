"""R-MAT and SBM generators: determinism, sizes, skew, learnable labels, edge types."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ngra.datasets import DatasetError, load, rmat, sbm
from ngra.datasets.synthetic import rmat_edges


def nearest_centroid_accuracy(
    x: torch.Tensor, y: torch.Tensor, train: torch.Tensor, test: torch.Tensor
) -> float:
    """Fit class means on the training nodes; accuracy on the test nodes."""
    classes = int(y.max()) + 1
    cent = torch.stack([x[train & (y == c)].mean(0) for c in range(classes)])
    pred = torch.cdist(x[test], cent).argmin(1)
    return float((pred == y[test]).float().mean())


def mean_aggregate(g, x: torch.Tensor) -> torch.Tensor:
    """One hop of mean aggregation with a self-loop (what a GCN layer does, minus weights)."""
    acc = x.clone().index_add_(0, g.dst_index(), x[g.indices])
    return acc / (g.in_degrees() + 1).unsqueeze(1)


def edge_keys(ds) -> np.ndarray:
    ei = ds.graph.edge_index()
    return (ei[0] * ds.num_nodes + ei[1]).numpy()


# ----------------------------------------------------------------------------- R-MAT
def test_rmat_quadrant_probabilities() -> None:
    src, dst = rmat_edges(1, 200_000, a=0.5, b=0.2, c=0.2, seed=0)
    freq = np.bincount(src * 2 + dst, minlength=4) / src.size
    np.testing.assert_allclose(freq, [0.5, 0.2, 0.2, 0.1], atol=0.005)


def test_rmat_deterministic_and_seeded(assert_same) -> None:
    a, b = rmat(scale=10, seed=3), rmat(scale=10, seed=3)
    assert_same(a, b)
    c = rmat(scale=10, seed=4)
    assert not np.array_equal(edge_keys(a), edge_keys(c)) and not torch.equal(a.x, c.x)
    # graph independent of the feature width
    d = rmat(scale=10, seed=3, feat=8)
    assert torch.equal(a.graph.indices, d.graph.indices) and torch.equal(a.y, d.y)


def test_rmat_sizes_and_simple_graph() -> None:
    ds = rmat(scale=12, edge_factor=8, seed=0)
    n = 1 << 12
    assert ds.num_nodes == n and ds.num_classes == 8 and ds.num_features == 64
    assert 0.8 * 8 * n < ds.num_edges <= 8 * n
    keys = edge_keys(ds)
    assert np.unique(keys).size == keys.size and not ds.graph.has_self_loops()
    raw = rmat(scale=12, edge_factor=8, seed=0, simple=False)
    assert raw.num_edges == 8 * n  # every generated edge kept
    sym = rmat(scale=10, seed=0, symmetric=True)
    k = edge_keys(sym)
    ei = sym.graph.edge_index()
    assert np.array_equal(np.sort(k), np.sort((ei[1] * sym.num_nodes + ei[0]).numpy()))


def test_rmat_degree_skew_and_balanced_labels() -> None:
    ds = rmat(scale=13, seed=0)
    deg = ds.graph.in_degrees().float()
    assert float(deg.max()) > 20 * float(deg.mean())  # power law; an Erdos-Renyi graph gives ~2-3x
    assert int((deg == 0).sum()) > 0.1 * ds.num_nodes  # R-MAT's many isolated / tail vertices
    assert torch.equal(torch.bincount(ds.y), torch.full((8,), ds.num_nodes // 8))
    # label 0 = generator ids in the 'a' corner: the highest degrees
    total = ds.graph.in_degrees() + ds.graph.out_degrees()
    per_class = torch.stack([total[ds.y == c].float().mean() for c in range(8)])
    assert int(per_class.argmax()) == 0


def test_rmat_labels_learnable() -> None:
    ds = rmat(scale=11, seed=0)
    acc = nearest_centroid_accuracy(ds.x, ds.y, ds.train_mask, ds.test_mask)
    assert acc > 0.6  # chance is 1/8


def test_rmat_diffusion_labels_are_homophilous() -> None:
    ds = rmat(scale=11, seed=0, labels="diffusion")
    y = ds.y
    same = float((y[ds.graph.indices] == y[ds.graph.dst_index()]).float().mean())
    assert same > 1.5 / ds.num_classes


def test_rmat_parameter_errors() -> None:
    with pytest.raises(DatasetError, match="a \\+ b \\+ c"):
        rmat(scale=4, a=0.6, b=0.3, c=0.3)
    with pytest.raises(DatasetError, match="scale"):
        rmat(scale=0)
    with pytest.raises(DatasetError, match="labels"):
        rmat(scale=4, labels="bogus")
    with pytest.raises(DatasetError, match="a=nan"):  # once a silently skewed graph
        rmat(scale=4, a=float("nan"))
    with pytest.raises(DatasetError, match="noise must be a finite number"):
        rmat(scale=4, noise=float("inf"))


# ----------------------------------------------------------------------------- SBM
def test_sbm_default_is_small_and_learnable() -> None:
    ds = load("sbm")
    assert ds.num_nodes == 2000 and ds.num_classes == 7
    assert not ds.graph.has_self_loops()
    keys = edge_keys(ds)
    assert np.unique(keys).size == keys.size
    ei = ds.graph.edge_index()
    assert np.array_equal(
        np.sort(keys), np.sort((ei[1] * ds.num_nodes + ei[0]).numpy())
    )  # undirected
    y = ds.y
    same = float((y[ds.graph.indices] == y[ds.graph.dst_index()]).float().mean())
    assert same > 0.6
    raw_acc = nearest_centroid_accuracy(ds.x, y, ds.train_mask, ds.test_mask)
    h = mean_aggregate(ds.graph, mean_aggregate(ds.graph, ds.x))
    agg_acc = nearest_centroid_accuracy(h, y, ds.train_mask, ds.test_mask)
    assert raw_acc > 2 / 7  # features alone carry some signal...
    assert agg_acc > 0.9 > raw_acc  # ...and two hops of aggregation make it easy


def test_sbm_deterministic_sizes_and_probabilities(assert_same) -> None:
    kw = {"nodes": 1000, "blocks": 4, "p_in": 0.05, "p_out": 0.005}
    a, b = sbm(**kw, seed=1), sbm(**kw, seed=1)
    assert_same(a, b)
    assert torch.equal(torch.bincount(a.y), torch.full((4,), 250))
    y = a.y
    same = y[a.graph.indices] == y[a.graph.dst_index()]
    inside, across = int(same.sum()) // 2, int((~same).sum()) // 2  # undirected pairs
    exp_in = 4 * 250 * 249 / 2 * 0.05
    exp_out = (1000 * 1000 - 4 * 250 * 250) / 2 * 0.005
    assert abs(inside - exp_in) < 5 * exp_in**0.5
    assert abs(across - exp_out) < 5 * exp_out**0.5
    assert not torch.equal(a.x, sbm(**kw, seed=2).x)


def test_sbm_split_fractions() -> None:
    ds = sbm(nodes=1000, train=0.5, val=0.2)
    assert (int(ds.train_mask.sum()), int(ds.val_mask.sum()), int(ds.test_mask.sum())) == (
        500,
        200,
        300,
    )
    assert not (ds.train_mask & ds.val_mask).any() and not (ds.train_mask & ds.test_mask).any()
    with pytest.raises(DatasetError, match="split fractions"):
        sbm(nodes=100, train=0.8, val=0.3)


def test_sbm_parameter_errors() -> None:
    with pytest.raises(DatasetError, match="p_in"):
        sbm(p_in=1.5)
    with pytest.raises(DatasetError, match="blocks"):
        sbm(nodes=3, blocks=5)


def test_edge_types() -> None:
    ds = load("sbm:nodes=600,edge_types=3")
    assert ds.num_edge_types == 3 and ds.edge_type is not None
    ei = ds.graph.edge_index()
    same = ds.y[ei[0]] == ds.y[ei[1]]
    assert torch.equal(ds.edge_type == 0, same)
    assert set(ds.edge_type.unique().tolist()) == {0, 1, 2}
    # both directions of an undirected edge share a type
    n = ds.num_nodes
    fwd = dict(zip((ei[0] * n + ei[1]).tolist(), ds.edge_type.tolist()))
    assert all(
        fwd[int(d) * n + int(s)] == t for s, d, t in zip(ei[0], ei[1], ds.edge_type.tolist())
    )
    assert rmat(scale=8, edge_types=1).edge_type is None


@pytest.mark.slow
def test_rmat_scale20_generates_and_caches(assert_same) -> None:
    first = load("rmat:scale=20,edge_factor=16")
    assert first.num_nodes == 1 << 20 and 0.9 * (16 << 20) < first.num_edges <= 16 << 20
    second = load("rmat:scale=20,edge_factor=16")
    assert first.info["cache"] == "miss" and second.info["cache"] == "hit"
    assert_same(first, second)
