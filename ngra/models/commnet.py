"""CommNet as a SAGA program."""

from __future__ import annotations

import torch
from torch import nn

from ngra.saga import SagaLayer


class CommNetConv(SagaLayer):
    r"""CommNet: :math:`h_v' = \tanh(H h_v + C\, \mathrm{mean}_{u \to v} h_u)`.

    Args:
        f_in: input width. f_out: output width.
    Shapes: ``x`` [N, f_in] -> [N, f_out].
    """

    gather = "mean"

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.h = nn.Linear(f_in, f_out)
        self.c = nn.Linear(f_in, f_out, bias=False)

    def apply_edge(self, edge):
        return edge.src

    def apply_vertex(self, vertex, acc):
        return torch.tanh(self.h(vertex) + self.c(acc))
