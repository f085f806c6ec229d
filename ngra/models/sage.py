"""GraphSAGE with the mean aggregator as a SAGA program."""

from __future__ import annotations

from torch import nn

from ngra.saga import SagaLayer


class SAGEConv(SagaLayer):
    r"""GraphSAGE-mean: :math:`h_v' = W_l \,\mathrm{mean}_{u \to v} h_u + W_r h_v + b`.

    Args:
        f_in: input width. f_out: output width.
    Shapes: ``x`` [N, f_in] -> [N, f_out].
    """

    gather = "mean"

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.lin_l = nn.Linear(f_in, f_out)
        self.lin_r = nn.Linear(f_in, f_out, bias=False)

    def apply_edge(self, edge):
        return edge.src

    def apply_vertex(self, vertex, acc):
        return self.lin_l(acc) + self.lin_r(vertex)
