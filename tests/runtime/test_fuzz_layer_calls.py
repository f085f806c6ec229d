"""Fuzzing battery for layer calls: zoo layers and a dict-field layer called with vertex
and edge data of generated shapes, dtypes and fields, and generated dropout. Each call
returns ``[N, out]`` finite rows or raises a ValueError / TypeError with a message."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("hypothesis")
from fuzzing import documented_errors
from hypothesis import given
from hypothesis import strategies as st

import ngra
from ngra.models.gat import GATConv
from ngra.models.gcn import GCNConv
from ngra.models.gin import GINConv
from ngra.models.sage import SAGEConv

pytestmark = pytest.mark.timeout(300)
F_IN, F_OUT = 4, 3


class FieldLayer(ngra.SagaLayer):
    """Reads named fields: vertex data {"h": [N, 4]}, edge data {"w": [E]}."""

    gather = "sum"

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(F_IN, F_OUT)

    def apply_edge(self, edge):
        return edge.src["h"] * edge.data["w"].unsqueeze(-1)

    def apply_vertex(self, vertex, acc):
        return self.lin(acc + vertex["h"])


LAYERS = {
    "gcn": lambda: GCNConv(F_IN, F_OUT),
    "sage": lambda: SAGEConv(F_IN, F_OUT),
    "gat": lambda: GATConv(F_IN, F_OUT, heads=1),
    "gin": lambda: GINConv(F_IN, F_OUT),
    "fields": FieldLayer,
}


def _broken(draw: st.DrawFn, t: torch.Tensor) -> torch.Tensor:
    """``t`` [rows, ...] off in its rows, width, rank or dtype."""
    rows = t.shape[0]
    part = draw(st.sampled_from(["rows", "width", "rank", "dtype"]))
    if part == "rows":
        return torch.randn(draw(st.sampled_from([0, rows + 1, max(rows - 1, 0)])), *t.shape[1:])
    if part == "width":
        return torch.randn(rows, draw(st.sampled_from([0, 1, 7])))
    if part == "rank":
        return draw(st.sampled_from([torch.randn(rows, 2, 2), torch.randn(()), t.reshape(-1)]))
    return t.to(draw(st.sampled_from([torch.float64, torch.int64, torch.bool, torch.float16])))


@st.composite
def layer_calls(draw: st.DrawFn) -> tuple:
    """A valid call of a layer, then (half the time) one part of it broken."""
    name = draw(st.sampled_from(sorted(LAYERS)))
    n = draw(st.integers(1, 8))
    e = draw(st.integers(0, 16))
    ei = torch.tensor(draw(st.lists(st.integers(0, n - 1), min_size=2 * e, max_size=2 * e)),
                      dtype=torch.int64).reshape(2, e)
    graph = ngra.Graph.from_edge_index(ei, num_nodes=n)
    if name == "gcn" or draw(st.booleans()):
        graph = graph.gcn_norm(add_self_loops=draw(st.booleans()))
    x: Any = torch.randn(graph.num_nodes, F_IN)
    edge_data: Any = torch.rand(graph.num_edges) if draw(st.booleans()) else None
    if name == "fields":
        x, edge_data = {"h": x}, {"w": torch.rand(graph.num_edges)}
    dropout = draw(st.sampled_from([0.0, 0.5]))
    part = draw(st.sampled_from(["none"] * 6 + ["x", "x field", "edge data", "edge field",
                                                "dropout"]))
    if part == "x":
        x = {"h": _broken(draw, x["h"])} if isinstance(x, dict) else _broken(draw, x)
    elif part == "x field":
        x = draw(st.sampled_from([{"g": torch.randn(graph.num_nodes, F_IN)},
                                  torch.randn(graph.num_nodes, F_IN), {}]))
    elif part == "edge data":
        edge_data = draw(st.sampled_from([None, "w", _broken(draw, torch.rand(graph.num_edges))]))
    elif part == "edge field":
        edge_data = {draw(st.sampled_from(["v", "w"])): _broken(draw, torch.rand(graph.num_edges))}
    elif part == "dropout":
        dropout = draw(st.sampled_from([-0.1, 1.0, 1.5, float("nan"), "0.5"]))
    return name, graph, x, edge_data, dropout, draw(st.booleans())


@given(layer_calls())
def test_fuzz_layer_calls(call: tuple) -> None:
    name, graph, x, edge_data, dropout, training = call
    torch.manual_seed(0)
    layer = LAYERS[name]().train(training)
    with documented_errors(ValueError, TypeError):
        out = layer(graph, x, edge_data, dropout=dropout)
        assert isinstance(out, torch.Tensor)
        assert out.shape == (graph.num_nodes, F_OUT), (name, list(out.shape))
        assert bool(torch.isfinite(out).all())
        if training and out.requires_grad:
            out.sum().backward()
