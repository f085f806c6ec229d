"""GAT (multi-head graph attention) as a SAGA program."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ngra.kernels.dropout import check_attention_p
from ngra.saga import SagaLayer


class GATConv(SagaLayer):
    r"""Graph attention, ``heads`` heads of width ``f_out``.

    .. math::
        e_{uv} = \mathrm{LeakyReLU}(a_s^\top W h_u + a_d^\top W h_v),\quad
        h_v' = \big\Vert_{k} \sum_{u \to v} \mathrm{softmax}_u(e_{uv}) W h_u + b

    Run on a graph with self-loops (as PyG's ``GATConv`` adds them).

    Args:
        f_in: input width. f_out: width per head. heads: number of heads (default: 1).
        concat: concatenate heads (True) or average them (default: True).
        negative_slope: LeakyReLU slope (default: 0.2).
        attention_dropout: dropout of the normalized attention weights in training
            mode (PyG's ``GATConv(dropout=...)``; the GAT paper uses 0.6) (default: 0).
    Shapes: ``x`` [N, f_in] -> [N, heads * f_out] (concat) or [N, f_out].
    """

    gather = "softmax"

    def __init__(self, f_in: int, f_out: int, heads: int = 1, concat: bool = True,
                 negative_slope: float = 0.2, attention_dropout: float = 0.0) -> None:
        super().__init__()
        if heads < 1 or f_out < 1:
            raise ValueError(f"GATConv needs heads >= 1 and f_out >= 1; got heads={heads}, "
                             f"f_out={f_out}.")
        self.heads, self.f_out, self.concat = heads, f_out, concat
        self.negative_slope = negative_slope
        self.attention_dropout = check_attention_p(attention_dropout, "GATConv attention_dropout")
        self.lin = nn.Linear(f_in, heads * f_out, bias=False)
        self.a_src = nn.Parameter(torch.empty(heads, f_out))
        self.a_dst = nn.Parameter(torch.empty(heads, f_out))
        self.bias = nn.Parameter(torch.zeros(heads * f_out if concat else f_out))
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.xavier_uniform_(self.a_src)
        nn.init.xavier_uniform_(self.a_dst)

    def apply_edge(self, edge):
        hs = self.lin(edge.src).view(-1, self.heads, self.f_out)
        hd = self.lin(edge.dst).view(-1, self.heads, self.f_out)
        score = (hs * self.a_src).sum(-1) + (hd * self.a_dst).sum(-1)
        return F.leaky_relu(score, self.negative_slope), hs

    def apply_vertex(self, vertex, acc):
        out = acc.flatten(1) if self.concat else acc.mean(1)
        return out + self.bias
