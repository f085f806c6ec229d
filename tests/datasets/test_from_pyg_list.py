"""from_pyg_list: edge attributes follow their edges through the CSC sort and batching,
graph labels of any shape with one element, and clear errors for edge data that does not
fit (an edgeless graph's empty edge_attr once failed to reshape)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ngra.datasets import DatasetError, GraphLoader, from_pyg_list

data = pytest.importorskip("torch_geometric.data")


def _graphs() -> list:
    """Three graphs whose edges are listed out of CSC order; each edge's attribute names it:
    ``[graph, src, dst]`` (local ids)."""
    out = []
    for g, (n, pairs, y) in enumerate([(3, [(2, 0), (0, 1), (1, 0), (2, 1)], 1.0),
                                        (1, [], 0.0),
                                        (4, [(3, 3), (0, 2), (3, 1)], 1.0)]):
        ei = torch.tensor(pairs, dtype=torch.long).t().reshape(2, -1)
        attr = torch.tensor([[g, s, d] for s, d in pairs], dtype=torch.float64).reshape(-1, 3)
        out.append(data.Data(edge_index=ei, edge_attr=attr, y=torch.tensor([[y]]), num_nodes=n))
    return out


def _edge_rows(graph, edge_attr, node_ptr, graph_of):
    """``(graph, local src, local dst)`` of each edge, read from the structure and from the
    attribute, in the graph's edge order."""
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr.numpy()))
    src = graph.indices.numpy()
    g = graph_of[dst]
    structure = np.stack([g, src - node_ptr[g], dst - node_ptr[g]], 1).tolist()
    return structure, edge_attr.long().tolist()


def test_edge_attributes_follow_their_edges():
    ds = from_pyg_list(_graphs())
    assert ds.edge_attr.shape == (7, 3) and ds.edge_attr.dtype == torch.float32
    assert ds.info["edge_attr"] == "given" and ds.info["x"] == "constant"
    node_ptr = ds.node_ptr.numpy()
    graph_of = np.repeat(np.arange(len(ds)), np.diff(node_ptr))
    structure, attrs = _edge_rows(ds.graph, ds.edge_attr, node_ptr, graph_of)
    assert structure == attrs
    for b in GraphLoader(ds, batch_size=2, shuffle=True, seed=3):  # batches keep the pairing
        ptr = b.ptr.numpy()
        structure, attrs = _edge_rows(b.graph, b.edge_attr, ptr, b.graph_ids.numpy())
        assert [[int(b.index[g]), s, d] for g, s, d in structure] == attrs


def test_graph_labels_of_any_one_element_shape():
    ds = from_pyg_list(_graphs())  # y given as [[1.0]]: one label each
    assert ds.y.tolist() == [1, 0, 1] and ds.label_values.tolist() == [0.0, 1.0]
    graphs = _graphs()
    graphs[0].y = torch.tensor(7)
    graphs[1].y, graphs[2].y = torch.tensor([2]), torch.tensor([[7]])
    ds = from_pyg_list(graphs)
    assert ds.y.tolist() == [1, 0, 1] and ds.label_values.tolist() == [2, 7]


def test_one_dimensional_edge_attr_is_one_column():
    graphs = _graphs()
    for g in graphs:
        g.edge_attr = g.edge_attr[:, 1] if g.edge_attr.numel() else torch.empty(0)
    assert from_pyg_list(graphs).edge_attr.shape == (7, 1)


def test_a_graph_without_edges_may_give_an_empty_edge_attr_of_any_shape():
    graphs = _graphs()
    graphs[1].edge_attr = torch.empty(0)  # [0], not [0, 3]
    ds = from_pyg_list(graphs)
    assert ds.edge_attr.shape == (7, 3) and ds[1].edge_attr.shape == (0, 3)


def test_edge_attr_errors():
    graphs = _graphs()
    graphs[2].edge_attr = graphs[2].edge_attr[:, :2]
    with pytest.raises(DatasetError, match="graph 2 has edge_attr 2 wide but graph 0 has 3"):
        from_pyg_list(graphs)
    graphs = _graphs()
    graphs[2].edge_attr = graphs[2].edge_attr[:2]
    with pytest.raises(DatasetError, match=r"graph 2 has edge_attr with 2 rows; expected 3 "
                                           r"\(one per edge\)"):
        from_pyg_list(graphs)
    graphs = _graphs()
    graphs[1].edge_attr = None
    with pytest.raises(DatasetError, match="graph 1 has no edge_attr but graph 0 does"):
        from_pyg_list(graphs)
