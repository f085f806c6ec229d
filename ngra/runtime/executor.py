"""The one executor: runs a layer's plan over a grid of tiles.

``execute`` validates the inputs, puts edge data in CSC order, asks the
compiler for the layer's plan (cached per input signature), and walks the grid
column by column: the vertex-side ``pre`` stage, each tile's ``edge`` stage
merged into the column's accumulator, then ``post`` (``apply_vertex``).
Whole-graph execution is the 1 x 1 grid; a memory budget picks a finer grid.

A softmax layer's ``attention_dropout`` (training mode) becomes one
:class:`~ngra.kernels.EdgeDropout` per call: two seeds drawn once, after the input
dropout's, and the edge counters of :func:`default_edge_counter`; every tile hashes its masks
from them, so the grid does not change the masks.

Evaluation on the CPU is deterministic: the same layer on the same input gives the same
bits at every call, on any thread count, whole-graph or on the same budget's grid. Every
forward kernel gives each output row one writer that sums it in a fixed order (the CPU
kernels' row ranges, :mod:`ngra.kernels.cpu.util`), and a Linear over mostly-zero
inputs sums their non-zeros in one order whether it scans them or reads a CSR copy
(:mod:`ngra.kernels.sparse_input`). Training's backward may sum per-thread buffers in
the order the threads took their rows.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import Any

import torch

from ngra import kernels, probes
from ngra.compiler.driver import compile_layer
from ngra.compiler.plan import Plan
from ngra.graph import EdgeFactors, Graph
from ngra.kernels.dropout import EdgeDropout, check_attention_p, check_p
from ngra.runtime.budget import current_budget, forced_grid, grid_for
from ngra.runtime.device_stream import run_streamed_layer, settings_for, wants_streaming
from ngra.runtime.partitioned import Partitioned
from ngra.runtime.staging import forced_mode, plan_parameters, staging_summary
from ngra.runtime.stream import walk
from ngra.runtime.tiles import WalkGrid, whole_graph_grid

__all__ = ["execute", "run_plan", "check_vertex_data", "choose_runtime_grid",
           "default_edge_counter", "edge_data_csc"]

log = logging.getLogger(__name__)


def execute(layer: Any, graph: Graph, x: Any, edge_data: Any = None, dropout: float = 0.0,
            activation: Any = None) -> Any:
    """Run SAGA ``layer`` on ``graph`` with vertex data ``x`` (see :class:`ngra.SagaLayer`).

    ``dropout`` is the layer's input dropout, applied while ``layer.training``;
    ``activation`` (an element-wise function, e.g. the ReLU a model applies next) is
    applied to the output. Inside :func:`ngra.runtime.device_schedule.device_streaming`
    with ``x`` in host memory the layer streams through the device
    (:mod:`ngra.runtime.device_stream`: ``activation`` runs there, per column).
    Inside ``with ngra.memory_budget(...)`` the graph is tiled into the smallest
    grid whose tiles fit the budget and propagation streams tile by tile. On a
    :class:`~ngra.runtime.partitioned.Partitioned` graph (multi-device training) ``x``
    holds the owned rows and the graph brings in what its in-edges read.
    """
    check_p(dropout)
    attention = attention_dropout_of(layer)
    check_vertex_data(layer, graph, x)
    edata = edge_data_csc(graph, edge_data, type(layer).__name__)
    try:
        plan = compile_layer(layer, graph, x, edata)
        if not layer.training:
            dropout = attention = 0.0
        if wants_streaming(plan, graph, x):
            drop = _attention_drop(plan, graph, attention, None,
                                   device=settings_for(plan).device)
            return run_streamed_layer(plan, graph, x, edata, dropout, drop, activation)
        out = run_plan(plan, graph, None, x, edata, dropout, attention)
        return out if activation is None else activation(out)
    except (RuntimeError, AttributeError, KeyError, TypeError) as err:
        mismatch = input_mismatch(err, type(layer).__name__, x, edata)
        if mismatch is None:
            raise
        raise mismatch from err


# torch's messages when a tensor's shape or dtype does not fit an operation
_MISMATCH = ("shapes cannot be multiplied", "same dtype", "must match the size",
             "size mismatch", "expected scalar type", "found dtype", "Expected all tensors")


def input_mismatch(err: Exception, who: str, x: Any, edata: Any) -> ValueError | None:
    """A ``ValueError`` saying which inputs did not fit the layer's UDFs, when ``err`` is
    how they failed on them (torch's shape/dtype complaint, a missing dict field, absent
    edge data, a dict used as a tensor); ``None`` for any other failure."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    got = f"got vertex data {_describe(x)} and edge data {_describe(edata)}"
    if isinstance(err, KeyError):
        fields = [d.keys() for d in (x, edata) if isinstance(d, Mapping)]
        if not fields or any(err.args[0] in f for f in fields):
            return None
        return ValueError(f"{who} reads the data field {err.args[0]!r}, which its inputs lack; "
                          f"{got}.")
    if isinstance(err, (AttributeError, TypeError)) and "'NoneType'" in text and edata is None:
        return ValueError(f"{who} reads edge.data, but the graph has no edge weights and no "
                          f"edge_data was given ({text}). Pass edge_data [E, ...] or a weighted "
                          "graph (GCN-style layers: graph.gcn_norm()).")
    if isinstance(err, (AttributeError, TypeError)) and ("'dict' object" in text
                                                         or "not dict" in text):
        return ValueError(f"{who} uses its data as a tensor, but a dict of fields arrived "
                          f"({text}); {got}.")
    if isinstance(err, TypeError) and "invalid data type 'str'" in text:
        return ValueError(f"{who} reads its data by field name, but a tensor arrived ({text}); "
                          f"{got}. Pass a dict of tensors.")
    if isinstance(err, RuntimeError) and any(m in text for m in _MISMATCH):
        return ValueError(f"{who}: the inputs do not fit the layer's weights ({text}); {got}.")
    return None


def _describe(data: Any) -> str:
    if data is None:
        return "None"
    if isinstance(data, Mapping):
        return "{" + ", ".join(f"{k!r}: {_describe(v)}" for k, v in data.items()) + "}"
    if isinstance(data, torch.Tensor):
        return f"{list(data.shape)} {str(data.dtype).replace('torch.', '')}"
    return type(data).__name__


def attention_dropout_of(layer: Any) -> float:
    """The layer's ``attention_dropout``, checked: a probability in ``[0, 1)``, and
    nonzero only on a ``softmax`` gather."""
    who = type(layer).__name__
    p = check_attention_p(getattr(layer, "attention_dropout", 0.0), f"{who}.attention_dropout")
    if p and layer.gather != "softmax":
        raise ValueError(f"{who}.attention_dropout = {p:g} drops the weights of a softmax "
                         f"gather; this layer's gather is {layer.gather!r}. Set it to 0, or "
                         "use the input dropout (layer(graph, x, dropout=p)).")
    return p


def default_edge_counter(graph: Graph | Partitioned) -> torch.Tensor | None:
    """``[E]``: the counter attention dropout hashes each CSC edge's masks from.

    The edge's id in the graph's original edge order (``graph.perm``), so the masks
    do not depend on the CSC layout or the tile grid; on a partitioned graph, the local
    edges' ids in the whole graph (``Partitioned.edge_ids``), so every rank draws the
    masks of one whole-graph run. ``None`` where the graph's CSC order is the caller's
    edge order (no ``perm`` stored): the identity, which the kernels read as each edge's
    position, and the backward's walk by source as the reverse CSR's ``perm``, without
    an ``[E]`` array (:class:`~ngra.kernels.EdgeDropout`). This is the one place the
    runtime takes it from; :func:`run_plan` takes another (``edge_counter=``).
    """
    if isinstance(graph, Partitioned):
        return graph.edge_ids
    return graph.perm if graph.has_perm else None


def _reverse_counters(graph: Graph, counter: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(csr.perm, counter[csr.perm])``: the counters in the order the backward's walk
    over sources reads them (:class:`~ngra.kernels.EdgeDropout`), cached on the graph for
    the last counter tensor (``[E]`` in the counter's dtype, once per graph rather than once
    per call)."""
    perm = graph.csr().perm
    hit = graph._cache.get("ngra.reverse-edge-counter")
    if hit is not None and hit[0]() is counter:
        return perm, hit[1]
    rev = counter.index_select(0, perm)  # int32 or int64 positions: no [E] cast
    graph._cache["ngra.reverse-edge-counter"] = (weakref.ref(counter), rev)
    return perm, rev


def run_plan(plan: Plan, graph: Graph, grid: WalkGrid | None, x: Any, edata: Any,
             dropout: float = 0.0, attention_dropout: float = 0.0,
             edge_counter: torch.Tensor | None = None) -> Any:
    """Run ``plan``: ``pre``, the column walk over ``grid``, then ``post``.

    An input ``dropout`` > 0 runs inside ``pre``'s Linears where the plan fuses it
    (:func:`ngra.kernels.dropout_linear`: no dropped copy of ``x``), else on ``x`` first.
    An ``attention_dropout`` > 0 (a softmax gather's) drops the normalized weights
    inside the edge stage, with masks hashed from ``edge_counter`` (``[E]`` int, one
    per CSC edge; default: :func:`default_edge_counter`) and two seeds drawn here.

    ``grid=None`` picks the grid: the 1 x 1 grid, or under an active memory
    budget the smallest grid that fits it. A grid of several tiles propagates
    inside :class:`ngra.runtime.stream.StreamedPropagation` (recompute in
    backward) when the edge stage saves per-edge activations; fused kernels,
    which keep only indices, and the 1 x 1 grid run the same walk under plain
    autograd. Stages
    are timed by :mod:`ngra.probes` when a recorder is active. What ``pre`` hands on to
    the edge stage and ``post`` (its carry) stays in this call.
    """
    probes.annotate("plan", plan)
    fused = bool(dropout) and plan.fuses_input_dropout(x)
    if dropout and not fused:
        x = _dropout_vertex(x, dropout)
    with probes.stage("pre") as s:
        terms, carry = plan.pre(s.inputs(x), dropout if fused else 0.0)
        terms = s.outputs(terms)
    if isinstance(graph, Partitioned):
        acc = graph.propagate(plan, terms, edata,
                              _attention_drop(plan, graph, attention_dropout, edge_counter))
        del terms
        with probes.stage("post") as s:
            return s.outputs(plan.post(s.inputs(x), acc, graph, carry))
    if grid is None:
        grid, walk_csc = choose_runtime_grid(plan, graph, terms, edata)
    else:
        walk_csc = current_budget() is not None
    drop = _attention_drop(plan, graph, attention_dropout, edge_counter, grid)
    acc = walk(plan, graph, grid, terms, edata, drop, walk_csc, carry)
    del terms  # what backward needs is saved; the terms' memory is free for post
    with probes.stage("post") as s:
        return s.outputs(plan.post(s.inputs(x), acc, graph, carry))


def _attention_drop(plan: Plan, graph: Graph | Partitioned, p: float,
                    edge_counter: torch.Tensor | None, grid: WalkGrid | None = None,
                    device: torch.device | None = None) -> EdgeDropout | None:
    """:func:`run_plan`'s attention dropout (seeds drawn now), or ``None`` at ``p == 0``;
    on the whole-graph ``grid`` with the graph's cached reverse counters. ``device``: where
    the aggregation runs (default: the graph's), whose generator draws the seeds when its
    kernels read them there, so a layer streamed through a GPU draws the masks the same
    layer resident on it would."""
    if not p:
        return None
    if plan.accumulator.name != "softmax":
        raise ValueError(f"attention dropout drops the weights of a softmax gather; this "
                         f"plan's gather is {plan.accumulator.name!r}.")
    counter = default_edge_counter(graph) if edge_counter is None else edge_counter
    if counter is None:
        return EdgeDropout.draw(p, None, num_edges=graph.num_edges,
                                device=device or graph.indptr.device)
    if not isinstance(counter, torch.Tensor) or tuple(counter.shape) != (graph.num_edges,):
        got = list(counter.shape) if isinstance(counter, torch.Tensor) else type(counter)
        raise ValueError(f"edge_counter must hold one counter per edge ([{graph.num_edges}]"
                         f"); got {got}.")
    whole = grid is not None and grid.num_tiles == 1 and getattr(grid.columns[0][0], "whole",
                                                                 False)
    return EdgeDropout.draw(p, counter, _reverse_counters(graph, counter) if whole else None,
                            device=device)


def _dropout_vertex(x: Any, p: float) -> Any:
    if isinstance(x, Mapping):
        return {k: kernels.dropout(v, p) for k, v in x.items()}
    return kernels.dropout(x, p)


def choose_runtime_grid(plan: Plan, graph: Graph, terms: Any, edata: Any) -> tuple[WalkGrid, bool]:
    """The 1 x 1 grid, or the budget's grid when ``ngra.memory_budget`` is active, and
    whether the layer's backward walks the CSC instead of transposing (a budget too
    tight for the transpose, see :mod:`ngra.runtime.budget`)."""
    budget = current_budget()
    forced = forced_grid(graph)
    if forced is not None:
        return forced, budget is not None
    if budget is None:
        return whole_graph_grid(graph), False
    grid, choice, walk_csc = grid_for(plan, graph, terms, edata, plan_parameters(plan), budget)
    probes.annotate("grid", choice)
    if probes.active() or log.isEnabledFor(logging.DEBUG):  # builds every tile: on demand
        staging = staging_summary(grid, forced_mode())
        probes.annotate("staging", staging)
        log.debug("%s: %s; %s", plan.layer_name, choice.describe(), staging)
    return grid, walk_csc


def edge_data_csc(graph: Graph, edge_data: Any, who: str = "layer") -> Any:
    """Edge data in CSC order; defaults to the graph's edge weights (already CSC), or to
    its :class:`~ngra.graph.EdgeFactors` when the weights are factored (kernels apply
    them per edge on the fly; no ``[E]`` tensor is made)."""
    if edge_data is None:
        return graph.edge_factors if graph.edge_factors is not None else graph.edge_weight
    if isinstance(edge_data, EdgeFactors):
        return edge_data
    if isinstance(edge_data, Mapping):
        return {k: _permute_edges(graph, v, f"{who} edge_data[{k!r}]") for k, v in edge_data.items()}
    return _permute_edges(graph, edge_data, f"{who} edge_data")


def _permute_edges(graph: Graph, t: Any, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [num_edges, ...]; got {type(t).__name__}.")
    if t.dim() == 0 or t.shape[0] != graph.num_edges:
        raise ValueError(
            f"{name} must have one row per edge ([{graph.num_edges}, ...], in the graph's "
            f"original edge order); got shape {list(t.shape)}."
        )
    return graph.to_csc_order(t)


def check_vertex_data(layer: Any, graph: Any, x: Any) -> None:
    """Raise unless ``graph`` is a graph and ``x`` (a tensor or a dict of tensors) has one
    row per vertex, with a message naming the layer and the field."""
    who = type(layer).__name__
    if not isinstance(graph, (Graph, Partitioned)):
        raise TypeError(f"{who}: graph must be an ngra.Graph; got {type(graph).__name__}. "
                        "Build one with ngra.Graph.from_edge_index(edge_index).")
    items = x.items() if isinstance(x, Mapping) else [("x", x)]
    for k, v in items:
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{who}: vertex data {k!r} must be a torch.Tensor; got {type(v).__name__}.")
        if v.dim() == 0 or v.shape[0] != graph.num_nodes:
            raise ValueError(
                f"{who}: vertex data {k!r} must have one row per vertex "
                f"([{graph.num_nodes}, ...]); got shape {list(v.shape)}."
            )
