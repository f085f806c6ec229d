"""Gated GCN (NeuGraph's running example) as a SAGA program."""

from __future__ import annotations

import torch
from torch import nn

from ngra.saga import SagaLayer


class GGCNConv(SagaLayer):
    r"""G-GCN: :math:`h_v' = \mathrm{ReLU}(W \sum_{u \to v} \sigma(W_H h_v + W_C h_u) \odot h_u)`.

    The gate's two linears depend only on the destination and only on the
    source: the compiler computes them once per vertex, not once per edge, and
    fuses the gate, product and sum into one edge kernel.

    Args:
        f_in: input width. f_out: output width.
    Shapes: ``x`` [N, f_in] -> [N, f_out].
    """

    gather = "sum"

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.w_h = nn.Linear(f_in, f_in)
        self.w_c = nn.Linear(f_in, f_in)
        self.w = nn.Linear(f_in, f_out)

    def apply_edge(self, edge):
        return torch.sigmoid(self.w_h(edge.dst) + self.w_c(edge.src)) * edge.src

    def apply_vertex(self, vertex, acc):
        return torch.relu(self.w(acc))
