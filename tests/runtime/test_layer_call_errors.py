"""Inputs that do not fit a layer's UDFs are named in a ValueError, not a traceback from
inside the UDF (torch's shape/dtype complaint, a KeyError, an AttributeError on None)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ngra
from ngra.models.gcn import GCNConv
from ngra.models.sage import SAGEConv


class FieldLayer(ngra.SagaLayer):
    gather = "sum"

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def apply_edge(self, edge):
        return edge.src["h"] * edge.data["w"].unsqueeze(-1)

    def apply_vertex(self, vertex, acc):
        return self.lin(acc + vertex["h"])


GRAPH = ngra.Graph.from_edge_index(torch.tensor([[0, 1, 2], [1, 2, 0]]), num_nodes=3)


@pytest.mark.parametrize("layer, x, edge_data, message", [
    (SAGEConv(4, 3), torch.randn(3, 5), None,
     r"SAGEConv: the inputs do not fit the layer's weights \(mat1 and mat2 shapes.*"
     r"got vertex data \[3, 5\] float32"),
    (SAGEConv(4, 3), torch.randn(3, 4).double(), None, r"same dtype.*\[3, 4\] float64"),
    (GCNConv(4, 3), torch.randn(3, 4), None,
     r"GCNConv reads edge.data, but the graph has no edge weights.*gcn_norm"),
    (FieldLayer(), {"g": torch.randn(3, 4)}, {"w": torch.rand(3)},
     r"reads the data field 'h', which its inputs lack; got vertex data \{'g'"),
    (FieldLayer(), torch.randn(3, 4), {"w": torch.rand(3)}, "by field name, but a tensor arrived"),
    (SAGEConv(4, 3), {"h": torch.randn(3, 4)}, None, "as a tensor, but a dict of fields arrived"),
])
def test_inputs_that_do_not_fit_are_named(layer, x, edge_data, message):
    with pytest.raises(ValueError, match=message):
        layer(GRAPH, x, edge_data)


def test_other_failures_pass_through():
    class Broken(ngra.SagaLayer):
        gather = "sum"

        def apply_edge(self, edge):
            return edge.src

        def apply_vertex(self, vertex, acc):
            raise RuntimeError("a bug in the layer itself")

    with pytest.raises(RuntimeError, match="a bug in the layer itself"):
        Broken()(GRAPH, torch.randn(3, 4))
