"""Gated graph neural network (GG-NN) with typed edges as a SAGA program."""

from __future__ import annotations

from torch import nn

from ngra.saga import SagaLayer


class GGNNConv(SagaLayer):
    r"""GG-NN step: :math:`h_v' = \mathrm{GRU}(\sum_{u \to v} A_{t(uv)} h_u,\ h_v)`.

    ``edge.data`` holds each edge's type in ``[0, num_types)``; each type has
    its own weight :math:`A_t`. The per-type products depend only on the
    source, so they are computed per vertex and selected per edge.

    Args:
        width: state width (input and output). num_types: edge types (default: 1).
    Shapes: ``x`` [N, width] -> [N, width]; ``edge.data`` [E] int64.
    """

    gather = "sum"

    def __init__(self, width: int, num_types: int = 1) -> None:
        super().__init__()
        self.width, self.num_types = width, num_types
        self.lin = nn.Linear(width, num_types * width, bias=False)
        self.gru = nn.GRUCell(width, width)

    def apply_edge(self, edge):
        per_type = self.lin(edge.src).view(-1, self.num_types, self.width)
        idx = edge.data.view(-1, 1, 1).expand(-1, 1, self.width)
        return per_type.gather(1, idx).squeeze(1)

    def apply_vertex(self, vertex, acc):
        return self.gru(acc, vertex)
