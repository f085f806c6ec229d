"""Interop with PyG Data and DGL graphs, both directions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ngra import Graph
from ngra.datasets import DatasetError, from_dgl, from_pyg, load, to_dgl, to_pyg


@pytest.fixture
def typed():
    return load("sbm:nodes=300,edge_types=3", cache=False)


def test_pyg_round_trip(typed, assert_same) -> None:
    pytest.importorskip("torch_geometric")
    data = to_pyg(typed)
    assert torch.equal(data.edge_index, typed.graph.edge_index())
    assert torch.equal(data.x, typed.x) and torch.equal(data.y, typed.y)
    assert torch.equal(data.train_mask, typed.train_mask) and torch.equal(
        data.edge_type, typed.edge_type
    )
    back = from_pyg(data, name=typed.name, num_classes=typed.num_classes)
    assert_same(typed, back)


def test_pyg_planetoid_round_trip(data_dir: Path, assert_same) -> None:
    pytest.importorskip("torch_geometric")
    cora = load("cora", root=data_dir)
    assert_same(cora, from_pyg(to_pyg(cora), name="cora"))


def test_from_pyg_weights_missing_masks_and_2d_masks() -> None:
    tg = pytest.importorskip("torch_geometric.data")
    ei = torch.tensor([[2, 0, 1], [0, 1, 2]])
    data = tg.Data(
        x=torch.ones(3, 2, dtype=torch.float64),
        y=torch.tensor([0, 1, 1]),
        edge_index=ei,
        edge_weight=torch.tensor([0.5, 1.0, 2.0]),
        num_nodes=3,
    )
    data.val_mask = torch.tensor([[True, False], [False, False], [False, True]])
    ds = from_pyg(data, split=1)
    assert ds.x.dtype == torch.float32 and ds.num_classes == 2
    assert not ds.train_mask.any() and ds.val_mask.tolist() == [False, False, True]
    assert torch.equal(ds.graph.edge_index(), ei)
    assert torch.equal(ds.graph.edge_weight_original(), torch.tensor([0.5, 1.0, 2.0]))
    assert torch.equal(to_pyg(ds).edge_weight, torch.tensor([0.5, 1.0, 2.0]))
    with pytest.raises(DatasetError, match="one class label per node"):
        from_pyg(tg.Data(x=torch.ones(3, 2), y=torch.ones(3, 4), edge_index=ei))


def _dgl():
    try:
        from ngra._compat import import_dgl

        return import_dgl()
    except Exception as err:  # noqa: BLE001 - DGL's import can fail in many ways
        pytest.skip(f"DGL unavailable: {err}")


def test_dgl_round_trip(typed, assert_same) -> None:
    _dgl()
    g = to_dgl(typed)
    assert g.num_nodes() == typed.num_nodes and g.num_edges() == typed.num_edges
    src, dst = g.edges(order="eid")
    assert torch.equal(torch.stack([src, dst]), typed.graph.edge_index())
    assert torch.equal(g.ndata["feat"], typed.x) and torch.equal(g.ndata["label"], typed.y)
    assert torch.equal(g.ndata["test_mask"], typed.test_mask) and torch.equal(
        g.edata["etype"], typed.edge_type
    )
    back = from_dgl(g, name=typed.name, num_classes=typed.num_classes)
    assert_same(typed, back)


def test_dgl_weights_and_missing_fields() -> None:
    dgl = _dgl()
    g = Graph.from_edge_index(
        torch.tensor([[1, 0], [0, 1]]), edge_weight=torch.tensor([2.0, 3.0])
    ).to_dgl()
    with pytest.raises(DatasetError, match="feat"):
        from_dgl(g)
    g.ndata["feat"] = torch.zeros(2, 4)
    g.ndata["label"] = torch.tensor([1, 0])
    ds = from_dgl(g)
    assert torch.equal(ds.graph.edge_weight_original(), torch.tensor([2.0, 3.0]))
    assert not ds.train_mask.any() and ds.num_classes == 2
    assert isinstance(to_dgl(ds), dgl.DGLGraph)
