"""Batches of graphs: the vectorized gather equals gluing the graphs one at a time; the
loader's order depends on (seed, epoch) only; from_pyg_list keeps every graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ngra.datasets import DatasetError, GraphBatch, GraphDataset, GraphLoader, collate


def random_dataset(num_graphs: int = 30, seed: int = 0) -> GraphDataset:
    """Graphs of 0..9 nodes (empty and isolated-node graphs included), random edges
    with multi-edges and self-loops, edge attributes carrying their global edge id."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 10, num_graphs)
    counts[:2] = [0, 1]
    node_ptr = np.concatenate(([0], np.cumsum(counts)))
    src, dst = [], []
    for g, n in enumerate(counts):
        m = int(rng.integers(0, 3 * n + 1)) if n else 0
        src.append(node_ptr[g] + rng.integers(0, max(n, 1), m))
        dst.append(node_ptr[g] + rng.integers(0, max(n, 1), m))
    src, dst = np.concatenate(src), np.concatenate(dst)
    x = rng.standard_normal((int(node_ptr[-1]), 3))
    edge_attr = np.arange(src.size, dtype=np.float64).reshape(-1, 1)
    return GraphDataset.from_edges("random", src, dst, node_ptr, rng.integers(0, 3, num_graphs)
                                   * 10, x, edge_attr=edge_attr, info={"x": "given"})


def glued(ds: GraphDataset, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference batch built one graph at a time: (edge_index, x, edge_attr)."""
    eis, xs, eas, offset = [], [], [], 0
    for g in idx:
        n0, n1 = int(ds.node_ptr[g]), int(ds.node_ptr[g + 1])
        e0, e1 = int(ds.edge_ptr[g]), int(ds.edge_ptr[g + 1])
        dst = torch.repeat_interleave(torch.diff(ds.indptr[n0:n1 + 1]))
        eis.append(torch.stack([ds.indices[e0:e1] - n0, dst]) + offset)
        xs.append(ds.x[n0:n1])
        eas.append(ds.edge_attr[e0:e1])
        offset += n1 - n0
    return torch.cat(eis, 1), torch.cat(xs), torch.cat(eas)


def test_collate_equals_gluing_graphs_one_by_one():
    ds = random_dataset()
    idx = [5, 0, 17, 1, 5, 29, 3]  # any order, an empty graph, a repeat
    b = collate(ds, idx)
    ei, x, ea = glued(ds, idx)
    assert torch.equal(b.graph.edge_index(), ei)
    assert torch.equal(b.x, x) and torch.equal(b.edge_attr, ea)
    assert torch.equal(b.y, ds.y[idx]) and b.index.tolist() == idx
    counts = torch.diff(ds.node_ptr)[idx]
    assert b.ptr.tolist() == [0, *torch.cumsum(counts, 0).tolist()]
    assert torch.equal(b.graph_ids, torch.repeat_interleave(torch.arange(len(idx)), counts))
    assert b.num_graphs == len(idx) and b.graph.num_nodes == int(counts.sum())


def test_no_edge_joins_two_graphs_of_a_batch():
    b = collate(random_dataset(seed=3), list(range(30)))
    ei = b.graph.edge_index()
    assert torch.equal(b.graph_ids[ei[0]], b.graph_ids[ei[1]])


def test_subset_and_item():
    ds = random_dataset()
    sub = ds[[4, 2, 9]]
    assert isinstance(sub, GraphDataset) and len(sub) == 3
    assert torch.equal(sub.y, ds.y[[4, 2, 9]])
    assert torch.equal(collate(sub, [0, 1, 2]).graph.edge_index(),
                       collate(ds, [4, 2, 9]).graph.edge_index())
    assert len(ds[ds.y == 0]) == int((ds.y == 0).sum()) and len(ds[10:20]) == 10
    one = ds[-1]
    assert isinstance(one, GraphBatch) and one.index.tolist() == [29]
    with pytest.raises(IndexError, match="graph index 30 is out of range for 30 graphs"):
        ds[30]


def test_loader_covers_every_graph_once_per_epoch_and_is_seeded():
    ds = random_dataset()
    loader = GraphLoader(ds, batch_size=8, shuffle=True, seed=7)
    assert len(loader) == 4
    e0 = torch.cat([b.index for b in loader])
    e1 = torch.cat([b.index for b in loader])  # the next pass is the next epoch
    assert sorted(e0.tolist()) == list(range(30)) and sorted(e1.tolist()) == list(range(30))
    assert not torch.equal(e0, e1)
    again = GraphLoader(ds, batch_size=8, shuffle=True, seed=7)
    assert torch.equal(torch.cat([b.index for b in again]), e0)
    again.set_epoch(0)
    assert torch.equal(torch.cat([b.index for b in again]), e0)
    other = GraphLoader(ds, batch_size=8, shuffle=True, seed=8)
    assert not torch.equal(torch.cat([b.index for b in other]), e0)


def test_loader_drop_last_and_plain_order():
    ds = random_dataset()
    plain = GraphLoader(ds, batch_size=8)
    assert [b.num_graphs for b in plain] == [8, 8, 8, 6]
    assert torch.equal(torch.cat([b.index for b in plain]), torch.arange(30))
    assert [b.num_graphs for b in GraphLoader(ds, 8, drop_last=True)] == [8, 8, 8]
    with pytest.raises(ValueError, match="batch_size must be an int >= 1; got 0"):
        GraphLoader(ds, 0)


def test_edge_joining_two_graphs_is_refused():
    with pytest.raises(DatasetError, match="joins graph 0 and graph 1"):
        GraphDataset.from_edges("bad", np.array([0]), np.array([2]), np.array([0, 2, 3]),
                                np.array([0, 1]), np.ones((3, 1)))


def test_from_pyg_list():
    data = pytest.importorskip("torch_geometric.data")
    from ngra.datasets import from_pyg_list

    graphs = [data.Data(edge_index=torch.tensor([[0, 1], [1, 0]]), x=torch.randn(2, 4),
                        y=torch.tensor([3]), num_nodes=2),
              data.Data(edge_index=torch.empty(2, 0, dtype=torch.long), x=torch.randn(1, 4),
                        y=torch.tensor([5]), num_nodes=1),
              data.Data(edge_index=torch.tensor([[2, 0], [1, 2]]), x=torch.randn(3, 4),
                        y=torch.tensor(3), num_nodes=3)]
    ds = from_pyg_list(graphs)
    assert len(ds) == 3 and ds.y.tolist() == [0, 1, 0] and ds.label_values.tolist() == [3, 5]
    assert torch.equal(ds.x, torch.cat([g.x for g in graphs]))
    b = ds[2]
    assert sorted(map(tuple, b.graph.edge_index().t().tolist())) == [(0, 2), (2, 1)]
    graphs[1].x = None
    with pytest.raises(DatasetError, match="graph 1 has no x but graph 0 does"):
        from_pyg_list(graphs)
    graphs[1].x, graphs[1].y = torch.randn(1, 4), torch.tensor([1, 2])
    with pytest.raises(DatasetError, match=r"graph 1 has y of shape \[2\]"):
        from_pyg_list(graphs)
