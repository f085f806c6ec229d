"""PyG baselines with the math of ngra's zoo models (2 layers by default).

==========  =====================================================================
model       PyG layers
==========  =====================================================================
gcn         ``GCNConv(normalize=False)`` with the prepared symmetric weights
gat         ``GATConv(heads=w.heads, add_self_loops=False)`` (self-loops prepared),
            last layer ``heads=1, concat=False``; ELU between
sage        ``SAGEConv`` (mean)
gin         ``GINConv(MLP, train_eps=True)``
ggnn        :class:`TypedGGNNConv`, a GG-NN ``MessagePassing`` with typed edges
            (PyG's ``GatedGraphConv`` has no edge types): ``A_t h`` per vertex,
            each edge reads row ``(src, type)``, sum, ``GRUCell``; input and
            output linears around two steps, as in the zoo
rgcn        ``RGCNConv(aggr="mean")``: per relation mean = ``1/c_{v,r}``
ggcn        :class:`GGCNConv`, a ``MessagePassing`` whose ``message`` computes the
            gate per edge, as a user writes G-GCN in PyG
commnet     ``SAGEConv`` (mean) then ``tanh``: PyG has no CommNet layer, and
            ``lin_l(mean) + lin_r(x)`` is CommNet's ``C mean + H x``
mpnn        :class:`EdgeMLPConv`, a ``MessagePassing`` with the two-layer edge MLP
            on ``[x_j || x_i || e]`` in ``message`` and the root linear
==========  =====================================================================

``dropout`` (each layer's input, and the heads', as the zoo's :class:`ngra.models.GNN`)
and GAT's ``attention_dropout`` (``GATConv(dropout=)``) default to 0: the
characterization measures the layers without them; the training benchmark sets
the zoo's.

Each layer call runs inside ``record_function(LAYER_RANGE)`` so the profiler
attribution (:mod:`ngra.characterize.stages`) sees layer boundaries.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from ngra.compat import import_pyg
from ngra.characterize.stages import LAYER_RANGE
from ngra.characterize.workloads import Workload

__all__ = ["build_pyg", "BaselineNet"]


class BaselineNet(nn.Module):
    """Layers called as ``call(conv, x)``, activations between, optional heads, and
    ``dropout`` on every layer's and head's input: the layout of :class:`ngra.models.GNN`."""

    def __init__(self, convs: list[nn.Module],
                 call: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                 act: Callable[[torch.Tensor], torch.Tensor],
                 head_in: nn.Module | None = None, head_out: nn.Module | None = None,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.call, self.act = call, act
        self.head_in, self.head_out = head_in, head_out
        self.dropout = dropout

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, self.dropout, self.training) if self.dropout else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.head_in is not None:
            x = self.act(self.head_in(self._drop(x)))
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            x = self._drop(x)
            with record_function(LAYER_RANGE):
                x = self.call(conv, x)
            if i < last or self.head_out is not None:
                x = self.act(x)
        if self.head_out is not None:
            x = self.head_out(self._drop(x))
        return x


def _typed_ggnn_class() -> type:
    from torch_geometric.nn import MessagePassing

    class TypedGGNNConv(MessagePassing):
        r"""GG-NN step with typed edges:
        :math:`h_v' = \mathrm{GRU}(\sum_{u \to v} A_{t(uv)} h_u,\ h_v)`.

        ``A_t h`` is computed once per vertex (``[N, T * W]`` viewed as
        ``[N * T, W]``); the edge index's source row is ``src * T + type``.
        """

        def __init__(self, width: int, num_types: int) -> None:
            super().__init__(aggr="add")
            self.width, self.num_types = width, num_types
            self.lin = nn.Linear(width, num_types * width, bias=False)
            self.gru = nn.GRUCell(width, width)

        def forward(self, x: torch.Tensor, typed_index: torch.Tensor) -> torch.Tensor:
            n = x.shape[0]
            h = self.lin(x).view(n * self.num_types, self.width)
            acc = self.propagate(typed_index, x=h, size=(n * self.num_types, n))
            return self.gru(acc, x)

        def message(self, x_j: torch.Tensor) -> torch.Tensor:
            return x_j

    return TypedGGNNConv


def _ggcn_class() -> type:
    from torch_geometric.nn import MessagePassing

    class GGCNConv(MessagePassing):
        """G-GCN as a user writes it in PyG: the gate is computed per edge in ``message``."""

        def __init__(self, a: int, b: int) -> None:
            super().__init__(aggr="add")
            self.w_h, self.w_c, self.w = nn.Linear(a, a), nn.Linear(a, a), nn.Linear(a, b)

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.w(self.propagate(edge_index, x=x)))

        def message(self, x_i: torch.Tensor, x_j: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(self.w_h(x_i) + self.w_c(x_j)) * x_j

    return GGCNConv


def _edge_mlp_class() -> type:
    from torch_geometric.nn import MessagePassing

    class EdgeMLPConv(MessagePassing):
        """The zoo's MPNN in PyG: ``root(x_v) + sum MLP([x_u || x_v || e_uv])``."""

        def __init__(self, a: int, b: int, edge_dim: int, hidden: int) -> None:
            super().__init__(aggr="add")
            self.mlp = nn.Sequential(nn.Linear(2 * a + edge_dim, hidden), nn.ReLU(),
                                     nn.Linear(hidden, b))
            self.root = nn.Linear(a, b)

        def forward(self, x: torch.Tensor, edge_index: torch.Tensor,
                    edge_attr: torch.Tensor) -> torch.Tensor:
            return self.propagate(edge_index, x=x, edge_attr=edge_attr) + self.root(x)

        def message(self, x_i: torch.Tensor, x_j: torch.Tensor,
                    edge_attr: torch.Tensor) -> torch.Tensor:
            return self.mlp(torch.cat([x_j, x_i, edge_attr], dim=-1))

    return EdgeMLPConv


def build_pyg(w: Workload, dropout: float = 0.0, attention_dropout: float = 0.0) -> nn.Module:
    """The PyG model for workload ``w``; call it as ``net(w.x)``."""
    import_pyg()
    import torch_geometric.nn as pyg

    ei = torch.stack([w.src, w.dst])
    f, h, c = w.x.shape[1], w.hidden, w.num_classes

    def net(convs: list[nn.Module], call: Callable, act: Callable, **heads: nn.Module) -> nn.Module:
        return BaselineNet(convs, call, act, dropout=dropout, **heads)

    if w.model == "gcn":
        weight = w.weight
        convs = [pyg.GCNConv(f, h, normalize=False), pyg.GCNConv(h, c, normalize=False)]
        return net(convs, lambda m, x: m(x, ei, weight), F.relu)
    if w.model == "gat":
        k, p = w.heads, attention_dropout
        d = max(h // k, 1)
        convs = [pyg.GATConv(f, d, heads=k, add_self_loops=False, dropout=p),
                 pyg.GATConv(d * k, c, heads=1, concat=False, add_self_loops=False, dropout=p)]
        return net(convs, lambda m, x: m(x, ei), F.elu)
    if w.model == "sage":
        return net([pyg.SAGEConv(f, h), pyg.SAGEConv(h, c)], lambda m, x: m(x, ei), F.relu)
    if w.model == "gin":
        def mlp(a: int, b: int) -> nn.Module:
            return nn.Sequential(nn.Linear(a, h), nn.ReLU(), nn.Linear(h, b))

        convs = [pyg.GINConv(mlp(f, h), train_eps=True), pyg.GINConv(mlp(h, c), train_eps=True)]
        return net(convs, lambda m, x: m(x, ei), F.relu)
    if w.model == "ggnn":
        conv_cls = _typed_ggnn_class()
        typed = torch.stack([w.src * w.num_types + w.etype, w.dst])
        convs = [conv_cls(h, w.num_types) for _ in range(2)]
        return net(convs, lambda m, x: m(x, typed), _identity,
                   head_in=nn.Linear(f, h), head_out=nn.Linear(h, c))
    if w.model == "rgcn":
        et = w.etype
        convs = [pyg.RGCNConv(f, h, w.num_types, aggr="mean"),
                 pyg.RGCNConv(h, c, w.num_types, aggr="mean")]
        return net(convs, lambda m, x: m(x, ei, et), F.relu)
    if w.model == "ggcn":
        conv_cls = _ggcn_class()
        return net([conv_cls(f, h), conv_cls(h, c)], lambda m, x: m(x, ei), _identity)
    if w.model == "commnet":
        return net([pyg.SAGEConv(f, h), pyg.SAGEConv(h, c)],
                   lambda m, x: torch.tanh(m(x, ei)), _identity)
    if w.model == "mpnn":
        conv_cls, e = _edge_mlp_class(), w.weight.unsqueeze(-1)
        return net([conv_cls(f, h, 1, h), conv_cls(h, c, 1, h)], lambda m, x: m(x, ei, e), F.relu)
    raise ValueError(f"no PyG baseline for {w.model!r}.")


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x
