"""A GNN's dense layers as a :class:`~ngra.planner.chain.Chain`, from its compiled plans.

Each SAGA layer of a zoo :class:`~ngra.models.zoo.GNN` is compiled on the graph (the
same plan training runs; see ``ngra explain``) and read stage by stage: the ``pre``
stage's nodes (the Linears hoisted to the vertex side, GAT's score rowdots), one
``graph`` layer for Scatter-ApplyEdge-Gather (it reads the terms the edge stage
reads; the source terms are what a rank receives for its halo rows), the Linear
the sink pass moved past the gather, then ``vertex`` (ApplyVertex), and the model's
activation between layers. The result is a DAG: ApplyVertex may read the layer's
input besides the gathered rows (GIN, SAGE, CommNet).

Which Linears allow a tensor-parallel split follows from how the runtime runs them:
an ApplyVertex UDF that was not rewritten is called as written, so its ``nn.Linear``
modules run through their ``forward`` and torch's ``parallelize_module`` can split
them (:func:`ngra.planner.apply_plan`); Linears the compiled plan evaluates from
their weights (hoisted to ``pre``, rewritten ApplyVertex, the sink) run whole.

The halo of each ``d``-way row partition (the source rows the busiest rank receives)
comes from ``halo`` -- ``ngra plan`` reads it from the partition books multi-device
training uses (:func:`book_halo`) -- or from a book built here (:func:`partition_halo`;
edge-balanced ranges by default, what :mod:`ngra.planner.measure` runs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from ngra.compiler.ir import ELEMENTWISE, INPUTS, SHAPE_OPS, UNARY, Op
from ngra.distributed.feature import ColumnSplit, column_split
from ngra.planner.chain import Chain, Layer
from ngra.partition import build_book
from ngra.compiler.driver import compile_layer
from ngra.runtime.explain import capture_calls
from ngra.models.zoo import GNN
from ngra.runtime.executor import edge_data_csc

__all__ = ["book_halo", "gnn_chain", "partition_halo"]


def book_halo(book: Any) -> int:
    """Source rows the busiest rank of partition book ``book`` receives before each graph
    layer (its halo; :class:`ngra.partition.PartitionBook`)."""
    sizes = book.halo_ptr[1:] - book.halo_ptr[:-1]
    return int(sizes.max()) if sizes.numel() else 0


def partition_halo(graph: Any, parts: int, method: str = "range") -> int:
    """:func:`book_halo` of a ``parts``-way partition book of ``graph`` built by ``method``
    (``"range"``: contiguous, edge-balanced destination ranges; ``"metis"``)."""

    return book_halo(build_book(graph, parts, method)) if parts > 1 else 0


def _width(node: Any, fallback: int = 1) -> int:
    """Features per row of ``node`` (``fallback`` where the trace left its shape unknown,
    e.g. an opaque call)."""
    if node.shape is None:
        return fallback
    return int(math.prod(node.rest)) if node.rest else 1


class _Reader:
    """Turns one layer's compiled program into chain layers (module docstring)."""

    def __init__(self, layers: list[Layer], path: str, plan: Any) -> None:
        self.layers, self.path, self.plan = layers, path, plan
        self.program = plan.program
        self.resolver = plan.resolver

    def _param_bytes(self, stage: Any, node: Any) -> int:
        total = 0
        for a in node.args:
            arg = stage.nodes[a]
            if arg.op == Op.PARAM:
                value = self.resolver.param(arg.attrs["path"])
                cols = arg.attrs.get("cols")  # a column block [:, a:b] of the weight
                total += (value.shape[0] * (cols[1] - cols[0]) if cols else _numel(value)) * 4
        if node.op == Op.OPAQUE and node.attrs["kind"] == "call_module":
            mod = self.resolver.module(node.attrs["target"])
            total += sum(_numel(p) * p.element_size() for p in mod.parameters())
        return total

    def _add(self, name: str, kind: str, ins: tuple[int, ...], out: int, **kw: Any) -> int:
        width = sum(self.layers[j].out_width if j >= 0 else self.in_width for j in ins)
        saved = out if kind == "elementwise" else width
        self.layers.append(Layer(name, kind, max(width, 1), max(out, 1), saved_width=saved,
                                 inputs=ins, **kw))
        return len(self.layers) - 1

    def stage(self, stage: Any, env: dict[int, int], tp: bool) -> None:
        """Add the row-dependent nodes of ``stage``; ``env`` maps node id -> chain index
        (inputs already mapped)."""
        for node in stage.nodes.values():
            if node.op in INPUTS or node.id in env:
                continue
            rows = tuple(dict.fromkeys(env[a] for a in node.args if a in env))
            if not rows:  # parameters and constants only
                continue
            if node.op in SHAPE_OPS or (node.op == Op.FLATTEN):
                env[node.id] = rows[0]
                continue
            params = self._param_bytes(stage, node)
            name = f"{self.path}.{node.name}"
            if node.op == Op.LINEAR:
                module = node.attrs.get("module")
                target = f"{self.path}.{module}" if module else ""
                splits = ("col", "row") if tp and module and isinstance(
                    self.resolver.module(module), nn.Linear) else ()
                env[node.id] = self._add(target or name, "linear", rows, _width(node),
                                         param_bytes=params, splits=splits,
                                         module=target if splits else "")
            elif len(rows) == 1 and not params and (node.op in UNARY or node.op in ELEMENTWISE):
                env[node.id] = self._add(name, "elementwise", rows, _width(node))
            else:
                widest = max(self.layers[j].out_width if j >= 0 else self.in_width
                             for j in rows)
                env[node.id] = self._add(name, "other", rows, _width(node, widest),
                                         param_bytes=params)

    def feature_width(self, keys: set) -> int:
        """The columns (heads) the layer's edge stage splits by in the feature layout
        (:func:`~ngra.distributed.feature.column_split` on the traced terms' shapes), or 0."""
        nodes = {k: self.program.pre.nodes[r.id] for k, r in self.program.pre.outputs.items()
                 if k in keys}
        if any(n.shape is None for n in nodes.values()):
            return 0
        terms = {k: torch.empty((1,) + tuple(n.rest), device="meta") for k, n in nodes.items()}
        split = column_split(self.plan, terms, 1)
        return split.width if isinstance(split, ColumnSplit) else 0

    def read(self, inp: int, in_width: int, num_edges: int) -> int:
        """Add the layer (input: chain index ``inp``); returns its output's index."""
        program = self.program
        self.in_width = in_width
        env: dict[int, int] = {n.id: inp for n in program.pre.nodes.values()
                               if n.op == Op.VERTEX}
        self.stage(program.pre, env, tp=False)
        src_keys, dst_keys = self.plan.edge_reads()
        terms = program.pre.outputs
        src = [terms[k].id for k in src_keys]
        dst = [terms[k].id for k in dst_keys]
        width = {i: _width(program.pre.nodes[i]) for i in src + dst}
        acc = program.vertex.nodes[next(n.id for n in program.vertex.nodes.values()
                                        if n.op == Op.ACC)] if program.vertex else None
        acc_width = _width(acc) if acc is not None else sum(width[i] for i in src)
        if program.sink is not None:  # the accumulator before the sunk Linear
            acc_width = int(self.resolver.param(program.sink["weight"]["path"]).shape[1])
        ins = tuple(dict.fromkeys(env[i] for i in src + dst))
        graph = self._add(f"{self.path}.graph({program.gather})", "graph", ins, acc_width,
                          edges=num_edges, read_width=sum(width[i] for i in src + dst),
                          exchange_width=sum(width[i] for i in src),
                          feature_width=self.feature_width(src_keys | dst_keys))
        if program.sink is not None:
            weight = self.resolver.param(program.sink["weight"]["path"])
            bias = program.sink["bias"]
            params = _numel(weight) * 4 + (
                _numel(self.resolver.param(bias["path"])) * 4 if bias else 0)
            graph = self._add(f"{self.path}.{program.sink['module']}(sunk)", "linear", (graph,),
                              int(weight.shape[0]), param_bytes=params)
        if program.vertex is None:
            raise ValueError(f"layer {self.path!r} ({program.layer_name}): its ApplyVertex was "
                             "not traced, so the planner cannot see its dense layers.")
        venv = {}
        for n in program.vertex.nodes.values():
            if n.op == Op.ACC:
                venv[n.id] = graph
            elif n.op == Op.VERTEX:
                venv[n.id] = inp
        self.stage(program.vertex, venv, tp=not program.vertex_rewritten)
        out = program.vertex.outputs
        if not hasattr(out, "id"):
            raise ValueError(f"layer {self.path!r}: ApplyVertex returns a structure; the "
                             "planner plans layers that return one tensor.")
        return venv[out.id]


def _numel(t: Any) -> int:
    return int(t.numel()) if isinstance(t, torch.Tensor) else 1


def gnn_chain(model: nn.Module, graph: Any, x: torch.Tensor, edge_data: Any = None, *,
              halo: Mapping[int, int] | None = None, parts: Iterable[int] = (2, 4, 8),
              name: str | None = None) -> Chain:
    """The dense layers of zoo GNN ``model`` on ``graph`` as a chain of ``N`` rows.

    Args:
        model: a :class:`ngra.models.zoo.GNN` (``build_model``).
        graph, x, edge_data: what the model trains on (``prepare``'s graph and edge data).
        halo: ``parts -> rows`` the busiest rank receives before each graph layer under
            a ``parts``-way partition (:func:`book_halo` of the partition book); default:
            :func:`partition_halo` (edge-balanced ranges) for each of ``parts``.
        name: the chain's name (default: the model's name).

    Raises:
        ValueError: a layer runs on the generic executor or its ApplyVertex was not traced.
    """

    if not isinstance(model, GNN):
        raise TypeError(f"gnn_chain reads a zoo GNN (ngra.models.build_model); got "
                        f"{type(model).__name__}. Plan other modules with trace_module.")
    layers: list[Layer] = []
    cur, width = -1, int(x.shape[1])
    act = _activation(model)

    def linear(mod: nn.Linear, path: str, inp: int) -> int:
        params = sum(_numel(p) * 4 for p in mod.parameters())
        layers.append(Layer(path, "linear", mod.in_features, mod.out_features,
                            param_bytes=params, saved_width=mod.in_features,
                            splits=("col", "row"), inputs=(inp,), module=path))
        return len(layers) - 1

    def activation(inp: int, label: str) -> int:
        if act is None:
            return inp
        w = layers[inp].out_width if inp >= 0 else width
        layers.append(Layer(label, "elementwise", w, w, saved_width=w, inputs=(inp,)))
        return len(layers) - 1

    if model.head_in is not None:
        cur = activation(linear(model.head_in, "head_in", cur), "head_in.act")
    calls = capture_calls(model, graph, x, edge_data)
    for k, (path, layer, (g, xl, e)) in enumerate(calls):
        plan = compile_layer(layer, g, xl, edge_data_csc(g, e, type(layer).__name__))
        if plan.program is None:
            raise ValueError(f"layer {path!r} ({type(layer).__name__}) runs on the generic "
                             f"executor ({plan.reason}); the planner reads "
                             "compiled plans only.")
        in_width = layers[cur].out_width if cur >= 0 else width
        cur = _Reader(layers, path, plan).read(cur, in_width, g.num_edges)
        if k < len(calls) - 1 or model.head_out is not None:
            cur = activation(cur, f"{path}.act")
    if model.head_out is not None:
        cur = linear(model.head_out, "head_out", cur)
    if halo is None:
        halo = {p: partition_halo(graph, p) for p in sorted(set(parts)) if p > 1}
    return Chain(name or model.name, tuple(layers), int(graph.num_nodes), width,
                 tuple(sorted(halo.items())))


def _activation(model: nn.Module) -> Any:
    """The model's activation between layers, or ``None`` for the identity."""
    probe = torch.tensor([-1.0, 0.5])
    return None if torch.equal(model.act(probe), probe) else model.act
