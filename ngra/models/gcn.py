"""GCN (Kipf & Welling) as a SAGA program."""

from __future__ import annotations

from torch import nn

from ngra.saga import SagaLayer


class GCNConv(SagaLayer):
    r"""Graph convolution: :math:`h_v' = W \sum_{u \to v} w_{uv} h_u + b`.

    Run on ``graph.gcn_norm()`` so that ``edge.data`` holds the symmetric
    normalization :math:`1/\sqrt{d_u d_v}` (self-loops included). The compiler
    moves ``lin`` before propagation when that shrinks the propagated width.

    The weight is Glorot-uniform and the bias zero at construction, as in the GCN
    paper (and PyG's ``GCNConv``).

    Args:
        f_in: input width. f_out: output width. bias: add a bias (default: True).
    Shapes: ``x`` [N, f_in] -> [N, f_out]; ``edge.data`` [E].
    """

    gather = "sum"

    def __init__(self, f_in: int, f_out: int, bias: bool = True) -> None:
        super().__init__()
        self.lin = nn.Linear(f_in, f_out, bias=bias)
        nn.init.xavier_uniform_(self.lin.weight)
        if bias:
            nn.init.zeros_(self.lin.bias)

    def apply_edge(self, edge):
        return edge.src * edge.data.unsqueeze(-1)

    def apply_vertex(self, vertex, acc):
        return self.lin(acc)
