"""NodeDataset validation and summaries."""

from __future__ import annotations

import pytest
import torch

from ngra import Graph
from ngra.datasets import NodeDataset


def make(**over):
    g = Graph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]))
    args = {
        "name": "tiny",
        "graph": g,
        "x": torch.zeros(3, 2),
        "y": torch.tensor([0, 1, 0]),
        "train_mask": torch.tensor([True, False, False]),
        "val_mask": torch.tensor([False, True, False]),
        "test_mask": torch.tensor([False, False, True]),
        "num_classes": 2,
    }
    args.update(over)
    return NodeDataset(**args)


def test_valid_dataset_summary() -> None:
    ds = make(edge_type=torch.tensor([0, 1, 1]), num_edge_types=2)
    assert ds.summary() == {
        "name": "tiny",
        "num_nodes": 3,
        "num_edges": 3,
        "num_features": 2,
        "num_classes": 2,
        "num_edge_types": 2,
        "train": 1,
        "val": 1,
        "test": 1,
        "reciprocity": 0.0,  # a directed triangle
        "synthesized": [],  # built by hand: real data
    }
    assert repr(ds) == (
        "NodeDataset('tiny', num_nodes=3, num_edges=3, num_features=2, num_classes=2, "
        "num_edge_types=2, split=1/1/1)"
    )


@pytest.mark.parametrize(
    ("over", "exc", "pattern"),
    [
        (
            {"x": torch.zeros(3, 2, dtype=torch.float64)},
            TypeError,
            r"x must have dtype torch.float32.*x.float\(\)",
        ),
        ({"x": torch.zeros(4, 2)}, ValueError, r"one row per node: \[3, F\]"),
        ({"x": torch.zeros(3)}, ValueError, r"x must be 2-D"),
        ({"y": torch.tensor([0, 1, 0], dtype=torch.int32)}, TypeError, r"y.long\(\)"),
        ({"y": torch.tensor([0, 2, 0])}, ValueError, r"labels must be in \[0, num_classes=2\)"),
        (
            {"train_mask": torch.tensor([1, 0, 0])},
            TypeError,
            r"train_mask must have dtype torch.bool",
        ),
        (
            {"test_mask": torch.zeros(2, dtype=torch.bool)},
            ValueError,
            r"test_mask must have shape \[3\]",
        ),
        ({"edge_type": torch.tensor([0, 1])}, ValueError, r"one per edge"),
        (
            {"edge_type": torch.tensor([0, 1, 2]), "num_edge_types": 2},
            ValueError,
            r"num_edge_types=2",
        ),
        ({"num_edge_types": 3}, ValueError, r"edge_type is None"),
        ({"graph": "not a graph"}, TypeError, r"ngra.Graph"),
        ({"num_classes": 2.0}, TypeError, r"num_classes must be an int"),
    ],
)
def test_validation(over, exc, pattern) -> None:
    with pytest.raises(exc, match=pattern):
        make(**over)


def test_unlabeled_nodes_allowed() -> None:
    assert make(y=torch.tensor([0, -1, 1])).y.tolist() == [0, -1, 1]
