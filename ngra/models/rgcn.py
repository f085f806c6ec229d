"""Relational GCN (R-GCN) as a SAGA program."""

from __future__ import annotations

from torch import nn

from ngra.saga import SagaLayer


class RGCNConv(SagaLayer):
    r"""R-GCN: :math:`h_v' = W_0 h_v + \sum_{u \to v} \frac{1}{c_{v,r}} W_{r(uv)} h_u + b`.

    ``edge.data`` is a dict with ``"type"`` (int64 [E], relation id) and
    ``"norm"`` ([E], :math:`1/c_{v,r}`, the inverse in-degree of ``v`` under
    the edge's relation; see :func:`ngra.models.relation_norm`).

    Args:
        f_in: input width. f_out: output width. num_types: relations.
    Shapes: ``x`` [N, f_in] -> [N, f_out].
    """

    gather = "sum"

    def __init__(self, f_in: int, f_out: int, num_types: int) -> None:
        super().__init__()
        self.f_out, self.num_types = f_out, num_types
        self.lin = nn.Linear(f_in, num_types * f_out, bias=False)
        self.root = nn.Linear(f_in, f_out)

    def apply_edge(self, edge):
        per_type = self.lin(edge.src).view(-1, self.num_types, self.f_out)
        idx = edge.data["type"].view(-1, 1, 1).expand(-1, 1, self.f_out)
        return per_type.gather(1, idx).squeeze(1) * edge.data["norm"].unsqueeze(-1)

    def apply_vertex(self, vertex, acc):
        return acc + self.root(vertex)
