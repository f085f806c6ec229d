"""PyG baselines with the math of ngra's zoo models (2 layers by default).

==========  =====================================================================
model       PyG layers
==========  =====================================================================
gcn         ``GCNConv(normalize=False)`` with the prepared symmetric weights
gat         ``GATConv(heads=8, add_self_loops=False)`` (self-loops prepared),
            last layer ``heads=1, concat=False``; ELU between
sage        ``SAGEConv`` (mean)
gin         ``GINConv(MLP, train_eps=True)``
ggnn        :class:`TypedGGNNConv`, a GG-NN ``MessagePassing`` with typed edges
            (PyG's ``GatedGraphConv`` has no edge types): ``A_t h`` per vertex,
            each edge reads row ``(src, type)``, sum, ``GRUCell``; input and
            output linears around two steps, as in the zoo
rgcn        ``RGCNConv(aggr="mean")``: per relation mean = ``1/c_{v,r}``
==========  =====================================================================

Each layer call runs inside ``record_function(LAYER_RANGE)`` so the profiler
attribution (:mod:`ngra.characterize.stages`) sees layer boundaries.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from ngra._compat import import_pyg
from ngra.characterize.stages import LAYER_RANGE
from ngra.characterize.workloads import GAT_HEADS, Workload

__all__ = ["build_pyg"]


class BaselineNet(nn.Module):
    """Layers called as ``call(conv, x)``, activations between, optional heads."""

    def __init__(self, convs: list[nn.Module],
                 call: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                 act: Callable[[torch.Tensor], torch.Tensor],
                 head_in: nn.Module | None = None, head_out: nn.Module | None = None) -> None:
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.call, self.act = call, act
        self.head_in, self.head_out = head_in, head_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.head_in is not None:
            x = self.act(self.head_in(x))
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            with record_function(LAYER_RANGE):
                x = self.call(conv, x)
            if i < last or self.head_out is not None:
                x = self.act(x)
        if self.head_out is not None:
            x = self.head_out(x)
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


def build_pyg(w: Workload) -> nn.Module:
    """The PyG model for workload ``w``; call it as ``net(w.x)``."""
    import_pyg()
    import torch_geometric.nn as pyg

    ei = torch.stack([w.src, w.dst])
    f, h, c = w.x.shape[1], w.hidden, w.num_classes
    if w.model == "gcn":
        weight = w.weight
        convs = [pyg.GCNConv(f, h, normalize=False), pyg.GCNConv(h, c, normalize=False)]
        return BaselineNet(convs, lambda m, x: m(x, ei, weight), F.relu)
    if w.model == "gat":
        d = max(h // GAT_HEADS, 1)
        convs = [pyg.GATConv(f, d, heads=GAT_HEADS, add_self_loops=False),
                 pyg.GATConv(d * GAT_HEADS, c, heads=1, concat=False, add_self_loops=False)]
        return BaselineNet(convs, lambda m, x: m(x, ei), F.elu)
    if w.model == "sage":
        return BaselineNet([pyg.SAGEConv(f, h), pyg.SAGEConv(h, c)], lambda m, x: m(x, ei), F.relu)
    if w.model == "gin":
        def mlp(a: int, b: int) -> nn.Module:
            return nn.Sequential(nn.Linear(a, h), nn.ReLU(), nn.Linear(h, b))

        convs = [pyg.GINConv(mlp(f, h), train_eps=True), pyg.GINConv(mlp(h, c), train_eps=True)]
        return BaselineNet(convs, lambda m, x: m(x, ei), F.relu)
    if w.model == "ggnn":
        conv_cls = _typed_ggnn_class()
        typed = torch.stack([w.src * w.num_types + w.etype, w.dst])
        convs = [conv_cls(h, w.num_types) for _ in range(2)]
        return BaselineNet(convs, lambda m, x: m(x, typed), lambda t: t,
                           head_in=nn.Linear(f, h), head_out=nn.Linear(h, c))
    if w.model == "rgcn":
        et = w.etype
        convs = [pyg.RGCNConv(f, h, w.num_types, aggr="mean"),
                 pyg.RGCNConv(h, c, w.num_types, aggr="mean")]
        return BaselineNet(convs, lambda m, x: m(x, ei, et), F.relu)
    raise ValueError(f"no PyG baseline for {w.model!r}.")
