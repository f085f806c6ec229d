"""A ``torch.nn.Module`` -> :class:`~ngra.planner.chain.Chain`, through torch.fx.

The module is traced symbolically (``torch.nn`` modules other than containers are
leaves) and run once on a few sample rows (``ShapeProp``) for the width of every
tensor. Each node becomes a layer: ``nn.Linear`` a linear layer (column and row
splits allowed), activations and dropout (modules, functions or methods) element-wise
layers, ``nn.LayerNorm``, additions of two tensors and concatenation along features
other row-wise layers. Nodes that only rename a tensor (``nn.Identity``, a view that
keeps ``[rows, features]``) are skipped. Anything else (a convolution, an RNN, batch
norm, which mixes rows, a parameter used directly) is refused with the name of the
layer, and so is a module the tracer cannot follow (data-dependent control flow).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from ngra.planner.chain import Chain, Layer

__all__ = ["TraceError", "trace_module"]

_SAMPLE_ROWS = 3
_ELEMENTWISE_MODULES = (nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.LeakyReLU, nn.ELU,
                        nn.Dropout, nn.Softplus, nn.Mish, nn.Hardtanh, nn.ReLU6, nn.CELU,
                        nn.SELU, nn.Hardswish, nn.Hardsigmoid, nn.Softsign, nn.Tanhshrink)
_ELEMENTWISE_FUNCTIONS = {F.relu, torch.relu, F.gelu, F.silu, torch.tanh, torch.sigmoid,
                          F.sigmoid, F.tanh, F.leaky_relu, F.elu, F.dropout, F.softplus,
                          F.mish, torch.exp, torch.neg, operator.neg, F.relu6, F.hardtanh,
                          F.selu, F.celu}
_ELEMENTWISE_METHODS = {"relu", "tanh", "sigmoid", "exp", "neg", "abs", "clamp", "relu_",
                        "sigmoid_", "tanh_", "contiguous", "float"}
_BINARY = {operator.add, operator.mul, operator.sub, operator.truediv, torch.add, torch.mul,
           torch.sub}
_BINARY_METHODS = {"add", "mul", "sub", "div"}
_VIEWS = {"view", "reshape", "flatten"}


class TraceError(ValueError):
    """A module the planner cannot read; the message names the layer."""


class _Tracer(fx.Tracer):
    """Keeps ``torch.nn`` modules (not containers) as leaves; remembers which module
    was being traced when tracing failed."""

    def is_leaf_module(self, m: nn.Module, qualified_name: str) -> bool:
        if isinstance(m, (nn.Sequential, nn.ModuleList, nn.ModuleDict)):
            return False
        return type(m).__module__.startswith("torch.nn")

    def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception as exc:
            if not hasattr(exc, "_ngra_layer"):
                exc._ngra_layer = (self.path_of_module(m), type(m).__name__)
            raise


def trace_module(module: nn.Module, rows: int, *, in_width: int | None = None,
                 name: str | None = None) -> Chain:
    """The chain of dense layers of ``module`` for a batch of ``rows`` rows.

    Args:
        module: a module mapping one ``[rows, in_width]`` float tensor to ``[rows, out]``.
        rows: the global batch (samples).
        in_width: input features (default: the first ``nn.Linear``'s ``in_features``).
        name: the chain's name (default: the module's class name).

    Raises:
        TraceError: the tracer cannot follow the module, or it holds a layer the
            planner does not know; the message names the layer.
    """
    cls = type(module).__name__
    name = name or cls
    tracer = _Tracer()
    try:
        graph = tracer.trace(module)
    except Exception as exc:  # noqa: BLE001 - any failure: name where it happened
        where = getattr(exc, "_ngra_layer", ("", cls))
        layer = f"layer {where[0]!r} ({where[1]})" if where[0] else f"{cls}.forward"
        raise TraceError(
            f"cannot trace {layer}: {type(exc).__name__}: {str(exc).splitlines()[0]} -- the "
            "planner traces modules with torch.fx, which cannot follow data-dependent "
            "control flow or calls on tensor values; plan the layers as a Chain by hand or "
            "rewrite that forward without them.") from None
    gm = fx.GraphModule(module, graph)
    if in_width is None:
        first = next((m for m in module.modules() if isinstance(m, nn.Linear)), None)
        if first is None:
            raise TraceError(f"{cls} has no nn.Linear to take the input width from; "
                             "pass in_width.")
        in_width = first.in_features
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    if len(inputs) != 1:
        raise TraceError(f"{cls}.forward takes {len(inputs)} inputs; the planner plans a "
                         "module of one [rows, features] tensor.")
    param = next(module.parameters(), None)
    dtype = param.dtype if param is not None else torch.float32
    sample = torch.zeros(_SAMPLE_ROWS, in_width, dtype=dtype)
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(sample)
    except Exception as exc:  # noqa: BLE001
        raise TraceError(f"{cls} fails on a [{_SAMPLE_ROWS}, {in_width}] input: "
                         f"{type(exc).__name__}: {exc}") from None
    return Chain(name, tuple(_layers(gm, graph)), rows, in_width)


def _where(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    path = next(reversed(stack), "") if stack else ""
    return f"{node.name!r}" + (f" in {path!r}" if path else "")


def _width(node: fx.Node) -> int:
    meta = node.meta.get("tensor_meta")
    shape = getattr(meta, "shape", None)
    if shape is None or len(shape) != 2 or shape[0] != _SAMPLE_ROWS:
        raise TraceError(f"layer {_where(node)} makes a tensor of shape "
                         f"{None if shape is None else list(shape)}; the planner plans "
                         "layers on [rows, features] tensors.")
    return int(shape[1])


def _layers(gm: fx.GraphModule, graph: fx.Graph) -> list[Layer]:
    index: dict[fx.Node, int] = {}
    layers: list[Layer] = []

    def add(node: fx.Node, kind: str, ins: list[fx.Node], **kw: Any) -> None:
        src = tuple(index[a] for a in ins)
        width = sum(layers[j].out_width if j >= 0 else _in_width for j in src)
        out = _width(node)
        saved = {"linear": width, "elementwise": out, "other": width}[kind]
        layers.append(Layer(kw.pop("name", node.name), kind, width, out,
                            saved_width=saved, inputs=src, **kw))
        index[node] = len(layers) - 1

    _in_width = 0
    for node in graph.nodes:
        if node.op == "placeholder":
            index[node] = -1
            _in_width = _width(node)
            continue
        if node.op == "output":
            break
        tensors = [a for a in node.all_input_nodes if a in index]
        if node.op == "get_attr":
            raise TraceError(f"layer {_where(node)} reads parameter {node.target!r} directly; "
                             "the planner knows parameters only inside nn.Linear / nn.LayerNorm.")
        if node.op == "call_module":
            mod = gm.get_submodule(node.target)
            params = sum(p.numel() * p.element_size() for p in mod.parameters())
            if isinstance(mod, nn.Linear):
                add(node, "linear", tensors, name=node.target, module=node.target,
                    param_bytes=params, splits=("col", "row"))
            elif isinstance(mod, nn.Identity):
                index[node] = index[tensors[0]]
            elif isinstance(mod, _ELEMENTWISE_MODULES):
                add(node, "elementwise", tensors, name=node.target)
            elif isinstance(mod, nn.LayerNorm):
                add(node, "other", tensors, name=node.target, param_bytes=params)
            else:
                raise TraceError(
                    f"layer {node.target!r} ({type(mod).__name__}) is not a dense layer the "
                    "planner knows (nn.Linear, activations, dropout, nn.LayerNorm); "
                    + ("it mixes rows, which splitting rows would change."
                       if isinstance(mod, nn.modules.batchnorm._BatchNorm) else
                       "plan its dense parts as a Chain by hand."))
            continue
        target = node.target
        method = node.op == "call_method"
        if len(tensors) == 1 and ((method and target in _ELEMENTWISE_METHODS)
                                  or (not method and target in _ELEMENTWISE_FUNCTIONS)
                                  or target in _BINARY or (method and target in _BINARY_METHODS)):
            add(node, "elementwise", tensors)
        elif len(tensors) > 1 and (target in _BINARY or (method and target in _BINARY_METHODS)
                                   or target is torch.cat):
            add(node, "other", tensors)
        elif len(tensors) == 1 and ((method and target in _VIEWS) or target is torch.flatten):
            if _width(node) != _width(tensors[0]):
                raise TraceError(f"layer {_where(node)} reshapes features; the planner plans "
                                 "layers on [rows, features] tensors.")
            index[node] = index[tensors[0]]
        else:
            what = target if method else getattr(target, "__name__", str(target))
            raise TraceError(f"layer {_where(node)} calls {what!r}, which is not a row-wise "
                             "dense op the planner knows.")
    return layers
