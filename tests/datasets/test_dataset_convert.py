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
        from ngra.compat import import_dgl

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
    assert ds.info["split"].startswith("random") and ds.num_classes == 2  # no masks given
    assert isinstance(to_dgl(ds), dgl.DGLGraph)


# ---------------------------------------------------- own split masks, no masks, bad data
def _tiny_pyg(tg, **masks):
    ei = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]])
    return tg.Data(x=torch.randn(6, 3), y=torch.tensor([0, 1, 2, 0, 1, 2]), edge_index=ei,
                   num_nodes=6, **masks)


def test_pyg_masks_kept_and_no_masks_random_split() -> None:
    tg = pytest.importorskip("torch_geometric.data")
    masks = {"train_mask": torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool),
             "val_mask": torch.tensor([0, 0, 1, 0, 0, 0], dtype=torch.bool),
             "test_mask": torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.bool)}
    ds = from_pyg(_tiny_pyg(tg, **masks))
    for m, want in masks.items():
        assert torch.equal(getattr(ds, m), want)
    assert ds.info["split"] == "the graph's masks" and ds.synthesized == []
    assert ds.summary()["synthesized"] == []
    bare = from_pyg(_tiny_pyg(tg), train=0.5, val=0.25, seed=3)  # no masks: a random split
    counts = [int(m.sum()) for m in (bare.train_mask, bare.val_mask, bare.test_mask)]
    assert counts == [3, 2, 1] and bool((bare.train_mask | bare.val_mask | bare.test_mask).all())
    assert bare.info["split"].startswith("random (train=0.5, val=0.25, seed=3)")
    again = from_pyg(_tiny_pyg(tg), train=0.5, val=0.25, seed=3)
    assert torch.equal(again.train_mask, bare.train_mask)  # seeded


def test_pyg_bad_labels_and_feature_rows() -> None:
    tg = pytest.importorskip("torch_geometric.data")
    data = _tiny_pyg(tg)
    data.y = torch.tensor([0, 1, 2, 7, 1, 2])
    with pytest.raises(DatasetError, match=r"\[0, num_classes=3\).*vertex 3 has 7"):
        from_pyg(data, num_classes=3)
    data.y = torch.tensor([0.0, 1.0, 2.5, 0.0, 1.0, 2.0])
    with pytest.raises(DatasetError, match="integer classes.*vertex 2 has 2.5"):
        from_pyg(data)
    data.y = torch.tensor([0, 1, -1, 0, 1, 2])  # -1: unlabeled, never in the random split
    ds = from_pyg(data)
    assert not bool((ds.train_mask | ds.val_mask | ds.test_mask)[2])
    data.x = torch.randn(5, 3)
    with pytest.raises(DatasetError, match=r"data.x must be \[num_vertices, F\] = \[6, F\]"):
        from_pyg(data)


def test_dgl_masks_kept_and_no_masks_random_split() -> None:
    _dgl()
    g = Graph.from_edge_index(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])).to_dgl()
    g.ndata["feat"] = torch.randn(4, 2)
    g.ndata["label"] = torch.tensor([0, 1, 0, 1])
    bare = from_dgl(g, train=0.5, val=0.25)
    assert [int(m.sum()) for m in (bare.train_mask, bare.val_mask, bare.test_mask)] == [2, 1, 1]
    assert bare.info["split"].startswith("random") and bare.synthesized == []
    g.ndata["train_mask"] = torch.tensor([True, False, False, False])
    g.ndata["val_mask"] = torch.tensor([False, True, False, False])
    g.ndata["test_mask"] = torch.tensor([False, False, True, True])
    ds = from_dgl(g)
    assert ds.train_mask.tolist() == [True, False, False, False]
    assert ds.test_mask.tolist() == [False, False, True, True]
    back = to_dgl(ds)
    assert torch.equal(back.ndata["val_mask"], g.ndata["val_mask"])
    g.ndata["label"] = torch.tensor([0, 1, -3, 1])
    with pytest.raises(DatasetError, match=r'g.ndata\["label"\].*vertex 2 has -3'):
        from_dgl(g)
