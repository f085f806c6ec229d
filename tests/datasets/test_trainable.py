"""check_trainable: every figure that makes training meaningless is named."""

from __future__ import annotations

import pytest
import torch

from ngra import Graph
from ngra.datasets import DatasetError, NodeDataset, check_trainable


def make(**over) -> NodeDataset:
    n = 6
    fields = dict(
        name="toy",
        graph=Graph.from_edge_index(torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]]), num_nodes=n),
        x=torch.randn(n, 3),
        y=torch.tensor([0, 1, 0, 1, 0, 1]),
        train_mask=torch.tensor([1, 1, 0, 0, 0, 0], dtype=torch.bool),
        val_mask=torch.tensor([0, 0, 1, 1, 0, 0], dtype=torch.bool),
        test_mask=torch.tensor([0, 0, 0, 0, 1, 1], dtype=torch.bool),
        num_classes=2,
    )
    fields.update(over)
    return NodeDataset(**fields)


def test_a_trainable_dataset_passes() -> None:
    check_trainable(make(), "toy")


@pytest.mark.parametrize("over, message", [
    ({"y": torch.full((6,), -1), "num_classes": 2}, "toy has 0 labelled vertices"),
    ({"y": torch.tensor([0, -1, 0, 1, 0, 1])},
     "train split of toy selects 1 unlabelled vertices"),
    ({"y": torch.tensor([1, 1, 0, 1, 0, 1])}, "train split of toy holds 1 class (label 1)"),
    ({"test_mask": torch.zeros(6, dtype=torch.bool)}, "test split of toy has 0 vertices"),
    ({"x": torch.zeros(6, 0)}, "toy has 0 feature columns"),
    ({"y": torch.tensor([0, 5000, 0, 1, 0, 1]), "num_classes": 5001},
     "toy declares 5,001 classes for 6 labelled vertices (3 labels occur)"),
    ({"x": torch.tensor([[0.0, 1, 2]] * 5 + [[0, float("inf"), 0]])},
     "1 features (x) of toy are not finite (nan or inf), the first at vertex 5, column 1 (inf)"),
])
def test_unusable_figures_are_named(over, message) -> None:
    with pytest.raises(DatasetError) as err:
        check_trainable(make(**over), "toy")
    assert message in str(err.value)


def test_non_finite_edge_weights() -> None:
    g = make().graph
    # bypass the constructors' own check, as a dataset read from elsewhere could
    weighted = Graph(g.indptr, g.indices, g.perm, g.num_nodes,
                     torch.tensor([1.0, float("nan"), 1.0, 1.0, 1.0]))
    with pytest.raises(DatasetError, match="1 edge weights of toy are not finite"):
        check_trainable(make(graph=weighted), "toy")


def test_no_vertices() -> None:
    empty = Graph.from_edge_index(torch.empty(2, 0, dtype=torch.int64), num_nodes=0)
    none = torch.zeros(0, dtype=torch.bool)
    ds = make(graph=empty, x=torch.zeros(0, 3), y=torch.zeros(0, dtype=torch.int64),
              train_mask=none, val_mask=none, test_mask=none)
    with pytest.raises(DatasetError, match="toy has 0 vertices"):
        check_trainable(ds, "toy")
