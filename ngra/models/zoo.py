"""The model zoo: two-layer (by default) node classifiers built from SAGA layers.

Each entry knows its usual hyper-parameters and how it prepares the graph
(normalization, self-loops, edge types) once before training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ngra.graph import Graph
from ngra.kernels import dropout
from ngra.kernels._checks import sole_owner_uses, storage_uses
from ngra.models.commnet import CommNetConv
from ngra.models.gat import GATConv
from ngra.models.gcn import GCNConv
from ngra.models.ggcn import GGCNConv
from ngra.models.ggnn import GGNNConv
from ngra.models.gin import GINConv
from ngra.models.mpnn import MPNNConv
from ngra.models.rgcn import RGCNConv
from ngra.models.sage import SAGEConv

__all__ = ["MODELS", "ModelSpec", "GNN", "build_model", "relation_norm"]


@dataclass(frozen=True)
class ModelSpec:
    """How to build and feed one zoo model.

    Attributes:
        hidden, lr, weight_decay, dropout: the usual hyper-parameters.
        heads: attention heads of hidden layers (GAT only).
        self_loops: add a self-loop to every vertex before training.
        edge_data: what the layers read as ``edge.data``: "none", "gcn_norm",
            "type", "type_norm" or "norm_feat" (the GCN weight as a [E, 1] feature).
    """

    hidden: int = 64
    lr: float = 0.01
    weight_decay: float = 5e-4
    dropout: float = 0.5
    heads: int = 1
    self_loops: bool = False
    edge_data: str = "none"
    extra: dict = field(default_factory=dict)


MODELS: dict[str, ModelSpec] = {
    "gcn": ModelSpec(hidden=16, edge_data="gcn_norm"),
    "sage": ModelSpec(hidden=64),
    "gat": ModelSpec(hidden=8, heads=8, lr=0.005, dropout=0.6, self_loops=True),
    "gin": ModelSpec(hidden=64),
    "ggcn": ModelSpec(hidden=64),
    "commnet": ModelSpec(hidden=64),
    "ggnn": ModelSpec(hidden=64, edge_data="type"),
    "rgcn": ModelSpec(hidden=64, edge_data="type_norm"),
    "mpnn": ModelSpec(hidden=64, edge_data="norm_feat"),
}


class GNN(nn.Module):
    """A stack of SAGA layers with dropout and activations between them.

    Dropout is :func:`ngra.kernels.dropout` (``F.dropout``'s distribution, drawn
    in parallel: torch's one-thread ``bernoulli_`` was most of a PubMed epoch). A
    SAGA layer's input dropout is handed to the layer, whose compiled plan fuses it
    into the Linears that read the input where it can.

    ``forward(graph, x, edge_data)`` where ``graph``/``edge_data`` come from
    :meth:`prepare`.
    """

    def __init__(self, name: str, layers: list[nn.Module], dropout: float,
                 act: Callable[[torch.Tensor], torch.Tensor],
                 head_in: nn.Module | None = None, head_out: nn.Module | None = None) -> None:
        super().__init__()
        self.name = name
        self.layers = nn.ModuleList(layers)
        self.dropout = dropout
        self.act = act
        self.head_in, self.head_out = head_in, head_out

    def forward(self, graph: Graph, x: torch.Tensor, edge_data: Any = None) -> torch.Tensor:
        if self.head_in is not None:
            x = self.act(self.head_in(dropout(x, self.dropout, self.training)))
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(graph, x, edge_data, dropout=self.dropout)
            if i < last or self.head_out is not None:
                x = self.act(x)
        if self.head_out is not None:
            x = self.head_out(dropout(x, self.dropout, self.training))
        return x


class _ELU(torch.autograd.Function):
    """ELU (alpha = 1) that saves its output, not its input as ``F.elu`` does: the next
    layer saves the same tensor as its input, so a GAT keeps one ``N x F`` tensor per
    activation instead of two. (Not ``F.elu(inplace=True)``, which saves the output too
    but fails on a tensor that a custom Function returned as a view.)

    Backward writes the input gradient over the saved output when nothing else can see
    it any more: the consumers of the output have run their backward (they come first)
    and no user variable, view, hook or double-backward graph holds it. That is one
    ``N x F`` tensor less at a GAT's backward peak, which is this node's. "Nothing else"
    is the storage's use count that :func:`~ngra.kernels._checks.sole_owner_uses`
    measures on a throwaway graph at import, so the check follows torch's bookkeeping
    instead of assuming it.
    """

    @staticmethod
    def forward(ctx, x):
        y = F.elu(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        if not torch.is_grad_enabled() and storage_uses(y) == _SOLE_OWNER_USES:
            # torch's kernel, element-wise: reading and writing y in place is exact
            return torch.ops.aten.elu_backward.grad_input(grad, 1.0, 1.0, 1.0, True, y,
                                                          grad_input=y)
        # torch's own kernel, given the result (is_result): one output, no temporaries
        return torch.ops.aten.elu_backward(grad, 1.0, 1.0, 1.0, True, y)


#: what _ELU's saved output shows in backward when nothing else holds it
_SOLE_OWNER_USES = sole_owner_uses("output")


def _elu(x: torch.Tensor) -> torch.Tensor:
    return _ELU.apply(x)


def build_model(name: str, in_dim: int, num_classes: int, *, hidden: int | None = None,
                heads: int | None = None, num_layers: int = 2, num_edge_types: int = 1,
                dropout: float | None = None) -> GNN:
    """Build zoo model ``name`` for ``in_dim`` features and ``num_classes`` outputs."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}.")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1; got {num_layers}.")
    spec = MODELS[name]
    h = hidden or spec.hidden
    p = spec.dropout if dropout is None else dropout
    widths = [in_dim] + [h] * (num_layers - 1) + [num_classes]
    pairs = list(zip(widths[:-1], widths[1:]))
    if name == "gcn":
        return GNN(name, [GCNConv(a, b) for a, b in pairs], p, F.relu)
    if name == "sage":
        return GNN(name, [SAGEConv(a, b) for a, b in pairs], p, F.relu)
    if name == "gin":
        return GNN(name, [GINConv(a, b, hidden=h) for a, b in pairs], p, F.relu)
    if name == "ggcn":
        return GNN(name, [GGCNConv(a, b) for a, b in pairs], p, lambda t: t)
    if name == "commnet":
        return GNN(name, [CommNetConv(a, b) for a, b in pairs], p, lambda t: t)
    if name == "mpnn":
        return GNN(name, [MPNNConv(a, b, edge_dim=1, hidden=h) for a, b in pairs], p, F.relu)
    if name == "rgcn":
        return GNN(name, [RGCNConv(a, b, num_edge_types) for a, b in pairs], p, F.relu)
    if name == "gat":
        k = heads or spec.heads
        layers: list[nn.Module] = []
        f = in_dim
        for _ in range(num_layers - 1):
            layers.append(GATConv(f, h, heads=k))
            f = h * k
        layers.append(GATConv(f, num_classes, heads=1, concat=False))
        return GNN(name, layers, p, _elu)
    if name == "ggnn":
        layers = [GGNNConv(h, num_edge_types) for _ in range(num_layers)]
        return GNN(name, layers, p, lambda t: t, head_in=nn.Linear(in_dim, h),
                   head_out=nn.Linear(h, num_classes))
    raise AssertionError(name)


def prepare(name: str, graph: Graph, edge_type: torch.Tensor | None = None,
            num_edge_types: int = 1) -> tuple[Graph, Any]:
    """The graph and edge data zoo model ``name`` trains on.

    Args:
        graph: the dataset's graph.
        edge_type: ``[E]`` int64 edge types in the graph's original order
            (default: all 0).
    Returns:
        ``(graph, edge_data)`` to pass to the model's forward.
    """
    spec = MODELS[name]
    if spec.edge_data == "gcn_norm":
        return graph.gcn_norm(add_self_loops=True), None
    if spec.edge_data == "norm_feat":
        g = graph.gcn_norm(add_self_loops=True)
        return g, g.edge_weight_original().unsqueeze(-1)
    if spec.self_loops:
        graph = graph.remove_self_loops().add_self_loops()
    if spec.edge_data in ("type", "type_norm"):
        if edge_type is None:
            edge_type = torch.zeros(graph.num_edges, dtype=torch.int64)
        if edge_type.numel() != graph.num_edges:
            raise ValueError(f"edge_type must have [{graph.num_edges}] entries; got {edge_type.numel()}.")
        if spec.edge_data == "type":
            return graph, edge_type
        return graph, {"type": edge_type, "norm": relation_norm(graph, edge_type, num_edge_types)}
    return graph, None


def relation_norm(graph: Graph, edge_type: torch.Tensor, num_types: int) -> torch.Tensor:
    """``[E]`` (original order) ``1 / c_{v,r}``: inverse in-degree of each edge's
    destination counting only edges of the same relation."""
    dst = graph.edge_index()[1]
    key = dst * num_types + edge_type
    counts = torch.bincount(key, minlength=graph.num_nodes * num_types)
    return 1.0 / counts[key].to(torch.float32)
