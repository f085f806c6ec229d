"""The model zoo: two-layer (by default) node classifiers built from SAGA layers.

Each entry knows its hyper-parameter defaults, each with where it comes from (a
paper, PyG's example, or ngra's own choice; :func:`defaults_table` prints them, as the
README does), and how it prepares the graph (normalization, self-loops, edge types)
once before training. :func:`hyper_parameters` checks given values against the table:
a setting a model does not have (``heads`` for GCN) is an error, not ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ngra.graph import Graph
from ngra.kernels import dropout, sparse_input
from ngra.kernels.checks import sole_owner_uses, storage_uses
from ngra.spill import is_spilled
from ngra.models.commnet import CommNetConv
from ngra.models.gat import GATConv
from ngra.models.gcn import GCNConv
from ngra.models.ggcn import GGCNConv
from ngra.models.ggnn import GGNNConv
from ngra.models.gin import GINConv
from ngra.models.mpnn import MPNNConv
from ngra.models.rgcn import RGCNConv
from ngra.models.sage import SAGEConv

__all__ = ["MODELS", "ModelSpec", "Defaults", "Hyper", "HYPER_PARAMETERS", "GNN", "build_model",
           "defaults_table", "hyper_parameters", "param_groups", "prepare", "relation_norm"]


# ----------------------------------------------------------------------------- defaults
_GCN = "Kipf & Welling 2017 (Planetoid); PyG examples/gcn.py"
_GAT = "Velickovic et al. 2018 (Cora, Citeseer); PyG examples/gat.py"
_NGRA = "ngra: GCN's Planetoid optimizer and dropout, width 64 (no paper value adopted yet)"


@dataclass(frozen=True)
class Hyper:
    """One default value and where it comes from."""

    value: float
    source: str


def _setting(about: str, check: Callable[[str, Any], Any], kind: type = float) -> Any:
    """A :class:`Defaults` field: ``about`` for help and errors, ``check(name, value)``
    validates (and returns) a value, ``kind`` is the CLI flag's type."""
    return field(default=None, metadata={"help": about, "check": check, "type": kind})


def _positive_int(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be a positive integer; got {v!r}.")
    return v


def _positive(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
        raise ValueError(f"{name} must be a positive number; got {v!r}.")
    return float(v)


def _non_negative(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
        raise ValueError(f"{name} must be a number >= 0; got {v!r}.")
    return float(v)


def _probability(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
        raise ValueError(f"{name} must be a probability in [0, 1); got {v!r}.")
    return float(v)


@dataclass(frozen=True)
class Defaults:
    """A zoo model's hyper-parameter defaults, each with its source. A setting left
    ``None`` does not exist for the model: giving it is an error, not ignored.

    One field per setting; the field's ``help`` and ``check`` serve the CLI flag
    (``--hidden`` for ``hidden``), the error messages and the README table.
    """

    hidden: Hyper | None = _setting("width of each hidden layer (per head for GAT)",
                                    _positive_int, int)
    heads: Hyper | None = _setting("attention heads of each hidden layer", _positive_int, int)
    lr: Hyper | None = _setting("Adam learning rate", _positive)
    weight_decay: Hyper | None = _setting("Adam weight decay (L2)", _non_negative)
    dropout: Hyper | None = _setting("dropout of each layer's input", _probability)
    attention_dropout: Hyper | None = _setting(
        "dropout of the normalized attention weights (a softmax gather's)", _probability)

    @classmethod
    def cite(cls, source: str, **values: float) -> Defaults:
        """Defaults whose values all come from ``source``."""
        return cls(**{k: Hyper(v, source) for k, v in values.items()})


HYPER_PARAMETERS: tuple[str, ...] = tuple(f.name for f in fields(Defaults))


@dataclass(frozen=True)
class ModelSpec:
    """How to build and feed one zoo model.

    Attributes:
        defaults: its hyper-parameter defaults and their sources (:class:`Defaults`).
        decay_first_layer_only: weight decay on the first layer's parameters only
            (the GCN paper's L2 term), else on every parameter.
        normalize_features: train on row-normalized (sum 1) features where they are
            non-negative (bag-of-words), as the GCN and GAT papers preprocess them.
        self_loops: add a self-loop to every vertex before training.
        edge_data: what the layers read as ``edge.data``: "none", "gcn_norm",
            "type", "type_norm" or "norm_feat" (the GCN weight as a [E, 1] feature).
    """

    defaults: Defaults
    decay_first_layer_only: bool = False
    normalize_features: bool = False
    self_loops: bool = False
    edge_data: str = "none"


#: Models with no published setting for full-graph node classification use GCN's recipe.
_NGRA_DEFAULTS = Defaults.cite(_NGRA, hidden=64, lr=0.01, weight_decay=5e-4, dropout=0.5)

MODELS: dict[str, ModelSpec] = {
    "gcn": ModelSpec(Defaults(
        hidden=Hyper(16, _GCN), lr=Hyper(0.01, _GCN), dropout=Hyper(0.5, _GCN),
        weight_decay=Hyper(5e-4, "Kipf & Welling 2017, PyG examples/gcn.py: on the first layer "
                                 "only"),
    ), decay_first_layer_only=True, normalize_features=True, edge_data="gcn_norm"),
    "sage": ModelSpec(_NGRA_DEFAULTS),
    "gat": ModelSpec(Defaults.cite(_GAT, hidden=8, heads=8, lr=0.005, weight_decay=5e-4,
                                   dropout=0.6, attention_dropout=0.6),
                     normalize_features=True, self_loops=True),
    "gin": ModelSpec(_NGRA_DEFAULTS),
    "ggcn": ModelSpec(_NGRA_DEFAULTS),
    "commnet": ModelSpec(_NGRA_DEFAULTS),
    "ggnn": ModelSpec(_NGRA_DEFAULTS, edge_data="type"),
    "rgcn": ModelSpec(_NGRA_DEFAULTS, edge_data="type_norm"),
    "mpnn": ModelSpec(_NGRA_DEFAULTS, edge_data="norm_feat"),
}


def hyper_parameters(model: str, **given: Any) -> dict[str, Hyper | None]:
    """Zoo model ``model``'s hyper-parameters: each given value (``None``: not given),
    checked, over the model's default; ``source`` says ``"given"`` or where the default
    comes from. A setting the model does not have is ``None``.

    Raises:
        ValueError: unknown model, a setting the model has not (``heads`` for GCN), or a
            value out of range (a width or head count below 1, a dropout outside [0, 1)).
        TypeError: a name that is no hyper-parameter.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of {sorted(MODELS)}.")
    unknown = sorted(set(given) - set(HYPER_PARAMETERS))
    if unknown:
        raise TypeError(f"unknown hyper-parameter(s) {unknown}; the zoo's are "
                        f"{list(HYPER_PARAMETERS)}.")
    defaults = MODELS[model].defaults
    out: dict[str, Hyper | None] = {}
    for f in fields(Defaults):
        default, value = getattr(defaults, f.name), given.get(f.name)
        if default is None:
            if value is not None:
                has = [k for k in HYPER_PARAMETERS if getattr(defaults, k) is not None]
                raise ValueError(
                    f"{model} has no {f.name} setting ({f.metadata['help']}), so {f.name}="
                    f"{value!r} (--{f.name.replace('_', '-')}) cannot apply; its settings are "
                    f"{', '.join(has)}.")
            out[f.name] = None
            continue
        check = f.metadata["check"]
        out[f.name] = (Hyper(check(f.name, default.value), default.source) if value is None
                       else Hyper(check(f.name, value), "given"))
    return out


def defaults_table() -> str:
    """The zoo's defaults as a markdown table, a numbered source per value (README, --help)."""
    sources: list[str] = []
    rows = []
    for name, spec in MODELS.items():
        cells = []
        for k in HYPER_PARAMETERS:
            h = getattr(spec.defaults, k)
            if h is None:
                cells.append("-")
                continue
            if h.source not in sources:
                sources.append(h.source)
            cells.append(f"{h.value:g} [{sources.index(h.source) + 1}]")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    head = "| model | " + " | ".join(k.replace("_", " ") for k in HYPER_PARAMETERS) + " |"
    rule = "|" + "---|" * (len(HYPER_PARAMETERS) + 1)
    notes = [f"[{i}] {src}" for i, src in enumerate(sources, 1)]
    return "\n".join([head, rule, *rows, "", *notes])


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
                 head_in: nn.Linear | None = None, head_out: nn.Module | None = None) -> None:
        super().__init__()
        self.name = name
        self.layers = nn.ModuleList(layers)
        self.dropout = dropout
        self.act = act
        self.head_in, self.head_out = head_in, head_out

    def forward(self, graph: Graph, x: torch.Tensor, edge_data: Any = None) -> torch.Tensor:
        if self.head_in is not None:  # a Linear: through a sparse copy of mostly-zero x
            x = dropout(x, self.dropout, self.training)
            x = self.act(sparse_input.linear(x, self.head_in.weight, self.head_in.bias))
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            # the activation goes to the layer, which applies it where its output is made
            # (on the device, per column, when the layer streams through one)
            act = self.act if i < last or self.head_out is not None else None
            x = layer(graph, x, edge_data, dropout=self.dropout, activation=act)
        if self.head_out is not None:
            x = self.head_out(dropout(x, self.dropout, self.training))
        return x


def _output_saving(name: str, fn: Callable[[torch.Tensor], torch.Tensor],
                   grad: Callable[..., torch.Tensor], doc: str) -> type:
    """An activation that saves its output, not its input, and whose backward writes the
    input gradient over that output when nothing else holds it.

    The next layer saves the same tensor as its input, so a model keeps one ``N x F``
    tensor per activation instead of two. (Not ``F.elu(inplace=True)``, which saves the
    output too but fails on a tensor that a custom Function returned as a view.) Backward
    reuses the output's memory when nothing else can see it any more: the consumers of the
    output have run their backward (they come first) and no user variable, view, hook or
    double-backward graph holds it; that is one ``N x F`` tensor less at the backward's
    peak. "Nothing else" is the storage's use count that
    :func:`~ngra.kernels.checks.sole_owner_uses` measures on a throwaway graph at import,
    so the check follows torch's bookkeeping instead of assuming it. ``grad(g, y, out)`` is
    torch's element-wise backward kernel given the result (``out``: write into it, or
    ``None``), so reading and writing ``y`` in place is exact.
    """

    def forward(ctx, x):
        y = fn(x)
        ctx.save_for_backward(y)
        return y

    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return grad(g, y, y if _reusable(y) else None)

    return type(name, (torch.autograd.Function,), {
        "__doc__": doc, "forward": staticmethod(forward), "backward": staticmethod(backward)})


def _elu_grad(g, y, out):
    if out is None:
        return torch.ops.aten.elu_backward(g, 1.0, 1.0, 1.0, True, y)
    return torch.ops.aten.elu_backward.grad_input(g, 1.0, 1.0, 1.0, True, y, grad_input=out)


def _relu_grad(g, y, out):
    if out is None:
        return torch.ops.aten.threshold_backward(g, y, 0)
    return torch.ops.aten.threshold_backward.grad_input(g, y, 0, grad_input=out)


_ELU = _output_saving("_ELU", F.elu, _elu_grad, "ELU (alpha = 1), GAT's (``F.elu`` saves "
                      "its input): one ``N x F`` tensor less at a GAT's backward peak.")
_ReLU = _output_saving("_ReLU", F.relu, _relu_grad, "ReLU (``F.relu`` saves its output "
                       "too, but its backward always allocates): GCN on R-MAT 2^23 (hidden "
                       "16), 512 MB off the backward's peak.")


#: what an activation's saved output shows in backward when nothing else holds it
_SOLE_OWNER_USES = sole_owner_uses("output")


def _reusable(y: torch.Tensor) -> bool:
    """Whether backward may write over the saved output ``y`` (see :func:`_output_saving`;
    a saved output mapped back from disk, :mod:`ngra.spill`, is this backward's own copy)."""
    return not torch.is_grad_enabled() and (is_spilled(y)
                                            or storage_uses(y) == _SOLE_OWNER_USES)


def _elu(x: torch.Tensor) -> torch.Tensor:
    return _ELU.apply(x)


def _relu(x: torch.Tensor) -> torch.Tensor:
    return _ReLU.apply(x)


def build_model(name: str, in_dim: int, num_classes: int, *, hidden: int | None = None,
                heads: int | None = None, num_layers: int = 2, num_edge_types: int = 1,
                dropout: float | None = None, attention_dropout: float | None = None) -> GNN:
    """Build zoo model ``name`` for ``in_dim`` features and ``num_classes`` outputs.

    ``hidden``, ``heads``, ``dropout`` and ``attention_dropout`` default to the model's
    (:data:`MODELS`); see :func:`hyper_parameters` for what is refused.
    """
    hp = hyper_parameters(name, hidden=hidden, heads=heads, dropout=dropout,
                          attention_dropout=attention_dropout)
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise ValueError(f"num_layers must be an integer >= 1; got {num_layers!r}.")
    h, p = hp["hidden"].value, hp["dropout"].value
    widths = [in_dim] + [h] * (num_layers - 1) + [num_classes]
    pairs = list(zip(widths[:-1], widths[1:]))
    if name == "gcn":
        return GNN(name, [GCNConv(a, b) for a, b in pairs], p, _relu)
    if name == "sage":
        return GNN(name, [SAGEConv(a, b) for a, b in pairs], p, _relu)
    if name == "gin":
        return GNN(name, [GINConv(a, b, hidden=h) for a, b in pairs], p, _relu)
    if name == "ggcn":
        return GNN(name, [GGCNConv(a, b) for a, b in pairs], p, lambda t: t)
    if name == "commnet":
        return GNN(name, [CommNetConv(a, b) for a, b in pairs], p, lambda t: t)
    if name == "mpnn":
        return GNN(name, [MPNNConv(a, b, edge_dim=1, hidden=h) for a, b in pairs], p, _relu)
    if name == "rgcn":
        return GNN(name, [RGCNConv(a, b, num_edge_types) for a, b in pairs], p, _relu)
    if name == "gat":
        k, att = hp["heads"].value, hp["attention_dropout"].value
        layers: list[nn.Module] = []
        f = in_dim
        for _ in range(num_layers - 1):
            layers.append(GATConv(f, h, heads=k, attention_dropout=att))
            f = h * k
        layers.append(GATConv(f, num_classes, heads=1, concat=False, attention_dropout=att))
        return GNN(name, layers, p, _elu)
    if name == "ggnn":
        layers = [GGNNConv(h, num_edge_types) for _ in range(num_layers)]
        return GNN(name, layers, p, lambda t: t, head_in=nn.Linear(in_dim, h),
                   head_out=nn.Linear(h, num_classes))
    raise AssertionError(name)


def param_groups(name: str, model: GNN, weight_decay: float) -> list[dict[str, Any]]:
    """Optimizer parameter groups of zoo model ``name``: ``weight_decay`` on every
    parameter, or only on the first layer's where the model's paper says so
    (:attr:`ModelSpec.decay_first_layer_only`: GCN)."""
    if not MODELS[name].decay_first_layer_only:
        return [{"params": list(model.parameters()), "weight_decay": weight_decay}]
    first = list(model.layers[0].parameters())
    ids = {id(p) for p in first}
    rest = [p for p in model.parameters() if id(p) not in ids]
    return [{"params": first, "weight_decay": weight_decay},
            {"params": rest, "weight_decay": 0.0, "decay": False}]


def prepare(name: str, graph: Graph, edge_type: torch.Tensor | None = None,
            num_edge_types: int = 1) -> tuple[Graph, Any]:
    """The graph and edge data zoo model ``name`` trains on.

    Lean: the derived graph is built in one pass over the CSC (no edge list, no sort),
    keeps 32-bit ids, no ``perm``, and GCN's normalization as per-vertex factors.

    Args:
        graph: the dataset's graph.
        edge_type: ``[E]`` int64 edge types in the graph's original order
            (default: all 0).
    Returns:
        ``(graph, edge_data)`` to pass to the model's forward.
    """
    spec = MODELS[name]
    # Self-loops in CSC order: no edge data in the old order has to line up with them, so
    # the new graph needs no perm; GCN's normalization stays two [N] factors.
    if spec.edge_data == "gcn_norm":
        return graph.gcn_norm(add_self_loops=True, order="csc"), None
    if spec.edge_data == "norm_feat":
        g = graph.gcn_norm(add_self_loops=True, order="csc")
        return g, g.edge_weight.unsqueeze(-1)
    if spec.self_loops:
        graph = graph.remove_self_loops().add_self_loops(order="csc")
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
