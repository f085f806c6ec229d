"""An MPNN-style layer whose ApplyEdge is a two-layer MLP: the kind that cannot fuse."""

from __future__ import annotations

import torch
from torch import nn

from ngra.saga import SagaLayer


class MPNNConv(SagaLayer):
    r"""Edge-network message passing:

    .. math::
        h_v' = W_0 h_v + \sum_{u \to v} \mathrm{MLP}([h_u \Vert h_v \Vert e_{uv}])

    with a two-layer MLP (ReLU). Its ``[E, hidden]`` temporaries are exactly
    what chunked streaming must bound.

    Args:
        f_in: input width. f_out: output width. edge_dim: width of ``edge.data``.
        hidden: MLP hidden width (default: f_out).
    Shapes: ``x`` [N, f_in] -> [N, f_out]; ``edge.data`` [E, edge_dim].
    """

    gather = "sum"

    def __init__(self, f_in: int, f_out: int, edge_dim: int = 1, hidden: int | None = None) -> None:
        super().__init__()
        hidden = f_out if hidden is None else hidden
        self.mlp = nn.Sequential(nn.Linear(2 * f_in + edge_dim, hidden), nn.ReLU(),
                                 nn.Linear(hidden, f_out))
        self.root = nn.Linear(f_in, f_out)

    def apply_edge(self, edge):
        return self.mlp(torch.cat([edge.src, edge.dst, edge.data], dim=-1))

    def apply_vertex(self, vertex, acc):
        return acc + self.root(vertex)
