"""DGL baselines with the math of ngra's zoo models (2 layers by default).

==========  =====================================================================
model       DGL layers
==========  =====================================================================
gcn         ``GraphConv(norm="none")`` with the prepared symmetric edge weights
gat         ``GATConv(num_heads=8)`` (self-loops prepared), heads flattened;
            last layer one head; ELU between
sage        ``SAGEConv("mean")``
gin         ``GINConv(MLP, "sum", learn_eps=True)``
ggnn        ``GatedGraphConv(n_steps=1, n_etypes=T)`` per step (its per-type
            linears carry a bias the zoo's do not); input/output linears as in
            the zoo
rgcn        ``RelGraphConv(regularizer=None, self_loop=True)`` with
            ``norm = 1/c_{v,r}``
==========  =====================================================================

DGL is imported through :func:`ngra._compat.import_dgl` (DGL 2.1 on a newer
torch). Each layer call runs inside ``record_function(LAYER_RANGE)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ngra._compat import import_dgl
from ngra.characterize.pyg_models import BaselineNet
from ngra.characterize.workloads import GAT_HEADS, Workload

__all__ = ["build_dgl"]


def build_dgl(w: Workload) -> nn.Module:
    """The DGL model for workload ``w``; call it as ``net(w.x)``."""
    dgl = import_dgl()
    import dgl.nn as dglnn

    g = dgl.graph((w.src, w.dst), num_nodes=w.num_nodes)
    g.create_formats_()  # build CSC/CSR once, outside the timed region
    f, h, c = w.x.shape[1], w.hidden, w.num_classes
    if w.model == "gcn":
        weight = w.weight
        convs = [dglnn.GraphConv(f, h, norm="none", allow_zero_in_degree=True),
                 dglnn.GraphConv(h, c, norm="none", allow_zero_in_degree=True)]
        return BaselineNet(convs, lambda m, x: m(g, x, edge_weight=weight), F.relu)
    if w.model == "gat":
        d = max(h // GAT_HEADS, 1)
        convs = [dglnn.GATConv(f, d, GAT_HEADS, allow_zero_in_degree=True),
                 dglnn.GATConv(d * GAT_HEADS, c, 1, allow_zero_in_degree=True)]

        def call(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
            out = m(g, x)
            return out.flatten(1) if m._num_heads > 1 else out.mean(1)

        return BaselineNet(convs, call, F.elu)
    if w.model == "sage":
        convs = [dglnn.SAGEConv(f, h, "mean"), dglnn.SAGEConv(h, c, "mean")]
        return BaselineNet(convs, lambda m, x: m(g, x), F.relu)
    if w.model == "gin":
        def mlp(a: int, b: int) -> nn.Module:
            return nn.Sequential(nn.Linear(a, h), nn.ReLU(), nn.Linear(h, b))

        convs = [dglnn.GINConv(mlp(f, h), "sum", learn_eps=True),
                 dglnn.GINConv(mlp(h, c), "sum", learn_eps=True)]
        return BaselineNet(convs, lambda m, x: m(g, x), F.relu)
    if w.model == "ggnn":
        et = w.etype
        convs = [dglnn.GatedGraphConv(h, h, 1, w.num_types) for _ in range(2)]
        return BaselineNet(convs, lambda m, x: m(g, x, et), lambda t: t,
                           head_in=nn.Linear(f, h), head_out=nn.Linear(h, c))
    if w.model == "rgcn":
        et, norm = w.etype, w.norm.unsqueeze(-1)
        convs = [dglnn.RelGraphConv(f, h, w.num_types, regularizer=None, self_loop=True),
                 dglnn.RelGraphConv(h, c, w.num_types, regularizer=None, self_loop=True)]
        return BaselineNet(convs, lambda m, x: m(g, x, et, norm), F.relu)
    raise ValueError(f"no DGL baseline for {w.model!r}.")
