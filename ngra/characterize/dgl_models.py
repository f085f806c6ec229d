"""DGL baselines with the math of ngra's zoo models (2 layers by default).

==========  =====================================================================
model       DGL layers
==========  =====================================================================
gcn         ``GraphConv(norm="none")`` with the prepared symmetric edge weights
gat         ``GATConv(num_heads=w.heads)`` (self-loops prepared), heads flattened;
            last layer one head; ELU between
sage        ``SAGEConv("mean")``
gin         ``GINConv(MLP, "sum", learn_eps=True)``
ggnn        ``GatedGraphConv(n_steps=1, n_etypes=T)`` per step (its per-type
            linears carry a bias the zoo's do not); input/output linears as in
            the zoo
rgcn        ``RelGraphConv(regularizer=None, self_loop=True)`` with
            ``norm = 1/c_{v,r}``
ggcn        ``update_all`` with a UDF message computing the gate per edge, as a
            user writes G-GCN in DGL
commnet     ``SAGEConv("mean")`` then ``tanh`` (DGL has no CommNet layer;
            ``fc_self(x) + fc_neigh(mean)`` is CommNet's ``H x + C mean``)
mpnn        ``update_all`` with a UDF message running the two-layer edge MLP on
            ``[src || dst || e]``, ``fn.sum``, plus the root linear
==========  =====================================================================

``dropout`` and GAT's ``attention_dropout`` (``attn_drop``) as in
:func:`ngra.characterize.pyg_models.build_pyg`.

DGL is imported through :func:`ngra.compat.import_dgl` (DGL 2.1 on a newer
torch). Each layer call runs inside ``record_function(LAYER_RANGE)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ngra.compat import import_dgl
from ngra.characterize.pyg_models import BaselineNet, _identity
from ngra.characterize.workloads import Workload

__all__ = ["build_dgl", "GGCNConv", "EdgeMLPConv"]


class GGCNConv(nn.Module):
    """G-GCN as a user writes it in DGL: ``update_all`` with a UDF message."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__()
        self.w_h, self.w_c, self.w = nn.Linear(a, a), nn.Linear(a, a), nn.Linear(a, b)

    def message(self, edges):
        return {"m": torch.sigmoid(self.w_h(edges.dst["h"]) + self.w_c(edges.src["h"]))
                * edges.src["h"]}

    def forward(self, graph, x: torch.Tensor) -> torch.Tensor:
        import dgl.function as fn

        with graph.local_scope():
            graph.ndata["h"] = x
            graph.update_all(self.message, fn.sum("m", "acc"))
            return torch.relu(self.w(graph.ndata["acc"]))


class EdgeMLPConv(nn.Module):
    """The zoo's MPNN in DGL: ``root(x_v) + sum MLP([x_u || x_v || e_uv])`` through
    ``update_all`` with a UDF message."""

    def __init__(self, a: int, b: int, edge_dim: int, hidden: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2 * a + edge_dim, hidden), nn.ReLU(),
                                 nn.Linear(hidden, b))
        self.root = nn.Linear(a, b)

    def message(self, edges):
        return {"m": self.mlp(torch.cat([edges.src["h"], edges.dst["h"], edges.data["e"]], -1))}

    def forward(self, graph, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        import dgl.function as fn

        with graph.local_scope():
            graph.ndata["h"], graph.edata["e"] = x, e
            graph.update_all(self.message, fn.sum("m", "acc"))
            return graph.ndata["acc"] + self.root(x)


def build_dgl(w: Workload, dropout: float = 0.0, attention_dropout: float = 0.0) -> nn.Module:
    """The DGL model for workload ``w``; call it as ``net(w.x)``."""
    dgl = import_dgl()
    import dgl.nn as dglnn

    g = dgl.graph((w.src, w.dst), num_nodes=w.num_nodes)
    g.create_formats_()  # build CSC/CSR once, outside the timed region
    f, h, c = w.x.shape[1], w.hidden, w.num_classes

    def net(convs: list[nn.Module], call, act, **heads: nn.Module) -> nn.Module:
        return BaselineNet(convs, call, act, dropout=dropout, **heads)

    if w.model == "gcn":
        weight = w.weight
        convs = [dglnn.GraphConv(f, h, norm="none", allow_zero_in_degree=True),
                 dglnn.GraphConv(h, c, norm="none", allow_zero_in_degree=True)]
        return net(convs, lambda m, x: m(g, x, edge_weight=weight), F.relu)
    if w.model == "gat":
        k, p = w.heads, attention_dropout
        d = max(h // k, 1)
        convs = [dglnn.GATConv(f, d, k, allow_zero_in_degree=True, attn_drop=p),
                 dglnn.GATConv(d * k, c, 1, allow_zero_in_degree=True, attn_drop=p)]

        def call(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
            out = m(g, x)
            return out.flatten(1) if m._num_heads > 1 else out.mean(1)

        return net(convs, call, F.elu)
    if w.model == "sage":
        convs = [dglnn.SAGEConv(f, h, "mean"), dglnn.SAGEConv(h, c, "mean")]
        return net(convs, lambda m, x: m(g, x), F.relu)
    if w.model == "gin":
        def mlp(a: int, b: int) -> nn.Module:
            return nn.Sequential(nn.Linear(a, h), nn.ReLU(), nn.Linear(h, b))

        convs = [dglnn.GINConv(mlp(f, h), "sum", learn_eps=True),
                 dglnn.GINConv(mlp(h, c), "sum", learn_eps=True)]
        return net(convs, lambda m, x: m(g, x), F.relu)
    if w.model == "ggnn":
        et = w.etype
        convs = [dglnn.GatedGraphConv(h, h, 1, w.num_types) for _ in range(2)]
        return net(convs, lambda m, x: m(g, x, et), _identity,
                   head_in=nn.Linear(f, h), head_out=nn.Linear(h, c))
    if w.model == "rgcn":
        et, norm = w.etype, w.norm.unsqueeze(-1)
        convs = [dglnn.RelGraphConv(f, h, w.num_types, regularizer=None, self_loop=True),
                 dglnn.RelGraphConv(h, c, w.num_types, regularizer=None, self_loop=True)]
        return net(convs, lambda m, x: m(g, x, et, norm), F.relu)
    if w.model == "ggcn":
        return net([GGCNConv(f, h), GGCNConv(h, c)], lambda m, x: m(g, x), _identity)
    if w.model == "commnet":
        convs = [dglnn.SAGEConv(f, h, "mean"), dglnn.SAGEConv(h, c, "mean")]
        return net(convs, lambda m, x: torch.tanh(m(g, x)), _identity)
    if w.model == "mpnn":
        e = w.weight.unsqueeze(-1)
        return net([EdgeMLPConv(f, h, 1, h), EdgeMLPConv(h, c, 1, h)],
                   lambda m, x: m(g, x, e), F.relu)
    raise ValueError(f"no DGL baseline for {w.model!r}.")
