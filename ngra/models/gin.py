"""GIN (graph isomorphism network) as a SAGA program."""

from __future__ import annotations

import torch
from torch import nn

from ngra.saga import SagaLayer


class GINConv(SagaLayer):
    r"""GIN: :math:`h_v' = \mathrm{MLP}((1 + \epsilon) h_v + \sum_{u \to v} h_u)`.

    Args:
        f_in: input width. f_out: output width. hidden: MLP hidden width (default: f_out).
        train_eps: learn :math:`\epsilon` (default: True).
    Shapes: ``x`` [N, f_in] -> [N, f_out].
    """

    gather = "sum"

    def __init__(self, f_in: int, f_out: int, hidden: int | None = None, train_eps: bool = True) -> None:
        super().__init__()
        hidden = f_out if hidden is None else hidden
        self.mlp = nn.Sequential(nn.Linear(f_in, hidden), nn.ReLU(), nn.Linear(hidden, f_out))
        self.eps = nn.Parameter(torch.zeros(1), requires_grad=train_eps)

    def apply_edge(self, edge):
        return edge.src

    def apply_vertex(self, vertex, acc):
        return self.mlp((1 + self.eps) * vertex + acc)
