"""Models a user writes, for the training API's tests (importable as ``user_models:...``
with this folder on ``PYTHONPATH``)."""

from __future__ import annotations

import torch
from torch import nn

import ngra


class EdgeGated(ngra.SagaLayer):
    """A gated sum over in-edges, plus the vertex's own row."""

    gather = "sum"

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.gate = nn.Linear(f_in, 1)
        self.w = nn.Linear(f_in, f_out)

    def apply_edge(self, edge):
        return torch.sigmoid(self.gate(edge.src)) * edge.src

    def apply_vertex(self, vertex, acc):
        return self.w(acc + vertex)


class Net(nn.Module):
    def __init__(self, f_in: int, classes: int, hidden: int = 16) -> None:
        super().__init__()
        self.conv1, self.conv2 = EdgeGated(f_in, hidden), EdgeGated(hidden, classes)

    def forward(self, graph, x):
        return self.conv2(graph, torch.relu(self.conv1(graph, x)))


def build_model(num_features: int, num_classes: int, hidden: int = 16) -> Net:
    return Net(num_features, num_classes, hidden)


def not_a_module(num_features: int, num_classes: int):
    return "a string"


def wrong_width(num_features: int, num_classes: int) -> Net:
    return Net(num_features, num_classes + 1)


#: a tensor held outside the model, one row per vertex of a 300-vertex graph
OUTSIDE = torch.zeros(300, 1)


class ReadsOutside(Net):
    def forward(self, graph, x):
        return super().forward(graph, x) + OUTSIDE


def reads_outside(num_features: int, num_classes: int) -> ReadsOutside:
    return ReadsOutside(num_features, num_classes)
