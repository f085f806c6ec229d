"""``ngra.explain``: how a layer call runs (or every layer call of a model).

The compiled plan (:func:`ngra.compiler.compile_layer` and the plan's ``describe``)
and, under a memory budget or a forced grid, the tile grid the runtime chooses and
how its tiles are staged. A SAGA layer is recognized by what the runtime calls on it
(``gather``, ``apply_edge``, ``apply_vertex``), so this module needs no model zoo and
no layer base class; explaining a zoo model by name is the CLI's job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ngra.compiler.chunked import chunk_line
from ngra.compiler.driver import compile_layer
from ngra.compiler.plan import Plan
from ngra.graph import EdgeFactors
from ngra.runtime.budget import current_budget, forced_grid
from ngra.runtime.device_stream import schedule_for, wants_streaming
from ngra.runtime.executor import check_vertex_data, choose_runtime_grid, edge_data_csc
from ngra.runtime.partitioned import Partitioned
from ngra.runtime.staging import forced_mode, staging_summary
from ngra.runtime.tiles import whole_graph_grid

__all__ = ["capture_calls", "explain", "explain_lines", "is_saga_layer"]


def explain(layer: nn.Module, graph: Any, x: Any = None, edge_data: Any = None) -> str:
    """The compiled plan of ``layer`` on ``graph``, as text.

    Shows which passes fired (and why the others did not), what was hoisted to the
    vertex side (with shapes), the reorder decision with the widths, which kernel
    runs per stage, and why a pattern did not fuse. Inside ``ngra.memory_budget``
    (or a forced ``grid_shape``) it also shows the grid and how its tiles are
    staged (source rows gathered vs sliced as a span).

    Args:
        layer: a :class:`ngra.SagaLayer`, or a model containing SAGA layers (then
            ``x`` is required: the model runs once, in eval mode without gradients,
            to see each layer's inputs).
        graph: the :class:`ngra.Graph` the layer runs on.
        x: vertex data (default: zeros ``[N, in_features]`` of the layer's first
            ``nn.Linear``).
        edge_data: edge data in the graph's original edge order (default: the
            graph's edge weights).

    Returns:
        The explanation (it is not printed; the CLI prints it).
    """
    if is_saga_layer(layer):
        return "\n".join(explain_lines(layer, graph, x, edge_data))
    if not isinstance(layer, nn.Module):
        raise TypeError(f"explain expects a SagaLayer or an nn.Module; got {type(layer).__name__}.")
    if x is None:
        raise ValueError(
            f"explain({type(layer).__name__}, graph, x): a model needs its input x to see "
            "what each of its SAGA layers receives."
        )
    calls = capture_calls(layer, graph, x, edge_data)
    if not calls:
        return f"{type(layer).__name__} has no SAGA layers (ngra.SagaLayer) to explain."
    out = []
    for name, sub, args in calls:
        out.append(f"== {name or type(sub).__name__} ==")
        out += explain_lines(sub, *args)
        out.append("")
    return "\n".join(out).rstrip()


def explain_lines(layer: Any, graph: Any, x: Any = None, edge_data: Any = None) -> list[str]:
    """:func:`explain` of one SAGA layer, as lines."""
    if x is None:
        x = _default_x(layer, graph)
    check_vertex_data(layer, graph, x)
    edata = edge_data_csc(graph, edge_data, type(layer).__name__)
    plan = compile_layer(layer, graph, x, edata)
    head = (f"{type(layer).__name__} (gather={layer.gather}) on {graph!r}; "
            f"x {_shape_text(x)}; edge data {_shape_text(edata)}")
    return [head] + plan.describe() + _attention_lines(layer, plan) + \
        _chunk_lines(plan, graph, x, edata) + _exchange_lines(plan, graph, x) + \
        _grid_lines(plan, graph, x, edata) + _device_lines(plan, graph, x, edata)


def _chunk_lines(plan: Plan, graph: Any, x: Any, edata: Any) -> list[str]:
    """How an edge stage no kernel runs walks the whole graph's edges: in chunks
    (:mod:`ngra.compiler.chunked`) or all at once. Nothing for a fused edge stage, a
    partitioned graph, a tile grid or streaming through a device (they tile themselves)."""
    unfused = plan.kind == "generic" or all(k == "interp" for k in plan.edge_kinds)
    if (not unfused or isinstance(graph, Partitioned) or current_budget() is not None
            or forced_grid(graph) is not None or wants_streaming(plan, graph, x)):
        return []
    with torch.no_grad():
        terms = plan.pre(x).terms
    tile = whole_graph_grid(graph).columns[0][0]
    return [chunk_line(plan.edge_chunks(tile, terms, edata), graph.num_edges)]


def _device_lines(plan: Plan, graph: Any, x: Any, edata: Any) -> list[str]:
    """The streaming schedule through a device, inside ``device_streaming`` with host data:
    its tiles, what stays on the device, the predicted peak and the bytes it moves."""
    if not wants_streaming(plan, graph, x):
        return []
    return schedule_for(plan, graph, x, edata).describe().splitlines()


def _exchange_lines(plan: Plan, graph: Any, x: Any) -> list[str]:
    """Where a partitioned graph's exchange sits in the plan, and what it moves."""
    if not isinstance(graph, Partitioned):
        return []
    with torch.no_grad():
        return graph.explain_lines(plan, plan.pre(x).terms)


def _attention_lines(layer: Any, plan: Plan) -> list[str]:
    """Where a softmax layer's attention dropout runs, when it has one."""
    p = getattr(layer, "attention_dropout", 0.0)
    if not p:
        return []
    if "softmax_aggregate" in plan.edge_kinds:
        how = ("inside the softmax kernels: each weight's keep flag is hashed from its edge's "
               "original id and drawn again in backward, no [E, H] mask is stored")
    else:
        how = "on each tile's [E, H] weights in the softmax gather"
    return [f"attention dropout (attention_dropout={p:g}, training mode): {how}"]


def _grid_lines(plan: Plan, graph: Any, x: Any, edata: Any) -> list[str]:
    """The grid and its staging, when a memory budget or a forced grid shape is active."""
    if isinstance(graph, Partitioned):  # its local grid shows in grid_report, from a run
        return []
    if current_budget() is None and forced_grid(graph) is None:
        return []
    with torch.no_grad():
        grid, _ = choose_runtime_grid(plan, graph, plan.pre(x).terms, edata)
    p, q = grid.shape
    return [f"grid    {p} x {q} ({grid.num_tiles} tiles); {staging_summary(grid, forced_mode())}"]


def _shape_text(d: Any) -> str:
    if d is None:
        return "none"
    if isinstance(d, Mapping):
        return "{" + ", ".join(f"{k!r}: {_shape_text(v)}" for k, v in d.items()) + "}"
    if isinstance(d, EdgeFactors):
        return f"[E] {str(d.dtype).replace('torch.', '')} (factored: src[N] * dst[N])"
    return f"{list(d.shape)} {str(d.dtype).replace('torch.', '')}"


def _default_x(layer: nn.Module, graph: Any) -> torch.Tensor:
    lin = next((m for m in layer.modules() if isinstance(m, nn.Linear)), None)
    if lin is None:
        raise ValueError(
            f"explain({type(layer).__name__}, graph): cannot infer the input width (the layer "
            "has no nn.Linear); pass x."
        )
    return torch.zeros(graph.num_nodes, lin.in_features, dtype=lin.weight.dtype)


def is_saga_layer(module: Any) -> bool:
    """``module`` is a SAGA program: an ``nn.Module`` with ``gather``, ``apply_edge`` and
    ``apply_vertex`` (every :class:`ngra.SagaLayer`)."""
    return isinstance(module, nn.Module) and all(
        hasattr(type(module), a) for a in ("gather", "apply_edge", "apply_vertex"))


def capture_calls(model: nn.Module, graph: Any, x: Any, edge_data: Any) -> list:
    """``[(name, layer, (graph, x, edge_data)), ...]``: each SAGA layer call of one run of
    ``model(graph, x[, edge_data])`` (eval mode, no gradients, the RNG state restored),
    with the arguments it received."""
    calls: list = []
    names = {m: n for n, m in model.named_modules()}
    handles = []

    def hook(mod: nn.Module, args: tuple, kwargs: dict) -> None:
        a = list(args) + [kwargs.get("edge_data")] * (3 - len(args))
        calls.append((names.get(mod, ""), mod, tuple(a[:3])))

    for m in model.modules():
        if is_saga_layer(m):
            handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model(graph, x) if edge_data is None else model(graph, x, edge_data)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return calls
