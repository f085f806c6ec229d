"""Lowering: a compiled program -> a plan the runtime executes tile by tile.

A plan has the interface of :class:`ngra.compiler.generic.GenericPlan`:

* ``accumulator``: the Gather accumulator (:func:`ngra.compiler.gather.make_accumulator`);
* ``pre(x) -> terms``: the vertex-side stage (hoisted terms, a transform moved before
  propagation), a dict ``term key -> [N, ...]``;
* ``edge(tile, src, dst, edata, drop=None) -> partial``: the accumulator's partial state for one
  staged :class:`~ngra.runtime.tiles.TileView` (sum/mean: per-destination sums over the
  tile's interval; max/min: ``(values, has_edges)``; softmax: ``(m, s, o)``), from the
  tile's staged source rows ``src`` and destination rows ``dst`` (dicts ``term key ->
  rows``) and its edge data rows ``edata`` (see :mod:`ngra.runtime.staging`); ``drop`` is
  a softmax gather's attention dropout on the tile's edges (an ``EdgeDropout``), which
  the softmax kernels apply inside;
* ``edge_reads() -> (src_keys, dst_keys)``: the terms the edge stage reads per side
  (only those are staged);
* ``post(x, acc, graph) -> out``: ApplyVertex (the UDF, or its rewritten IR after a reorder),
  after the Linear the sink pass moved past the gather (it reads the graph's in-degrees);
* ``describe() -> list[str]``: the explain lines.

Source-side rows are indexed with the tile's local source ids; destination-side
rows are the tile's interval ``[dst_lo, dst_hi)``, indexed with local destination ids.

A softmax whose scores are rowdots of its own value (``SoftmaxMatch.weights``, GAT) runs
on the whole-graph tile as :func:`~ngra.kernels.attention_aggregate`. When pre made that
value from the plain ``x`` and parameters by closed ops, pre also notes (weakly: the plan
outlives the step) how to make it again, replaying its input dropout's masks; the edge
stage hands that :class:`~ngra.kernels.Recompute` to the kernel, which then saves no
value for backward.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ngra import kernels
from ngra.compiler.gather import make_accumulator
from ngra.compiler.generic import GenericPlan, check_vertex_output
from ngra.compiler.interp import Resolver, apply_sink, evaluate, run_stage
from ngra.compiler.ir import Node, Op, Program, format_key, format_node, iter_refs
from ngra.compiler.passes import PassNote
from ngra.compiler.passes.fuse import (
    FusedEdgeMatch,
    GspmmMatch,
    InterpMatch,
    SoftmaxMatch,
    describe_match,
)
from ngra.graph import EdgeFactors
from ngra.memstat import is_mapped, release_mapped

if TYPE_CHECKING:  # types only: the runtime builds tiles and runs plans, it is not imported
    from ngra.runtime.tiles import TileView

__all__ = ["CompiledPlan", "FallbackPlan", "lower"]

#: Bytes of a memory-mapped input per block of a streamed ``pre`` (see ``_pre_rows``).
PRE_BLOCK_BYTES = 1 << 24
#: A softmax value term (GAT's ``dropout(x) W``) at least this large is made again from
#: ``x`` in backward instead of saved; a smaller one is saved: on a small graph the saved
#: bytes are few and the GEMM again is a sixth of a Cora GAT step (17.2 -> 14.7 ms).
RECOMPUTE_VALUE_BYTES = 1 << 24
# ops that only reshape a per-edge scalar ([E] <-> [E, 1, ...])
_SHAPE_OPS = (Op.UNSQUEEZE, Op.VIEW, Op.RESHAPE, Op.SQUEEZE, Op.FLATTEN)


class FallbackPlan(GenericPlan):
    """The generic UDF executor, with the compiler's notes on why nothing was fused."""

    def __init__(self, layer: Any, reason: str, notes: list[PassNote] | None = None) -> None:
        super().__init__(layer, reason)
        self.notes = list(notes or [])
        self.edge_kinds: tuple[str, ...] = ("generic",)

    def describe(self) -> list[str]:
        lines = super().describe()
        if self.notes:
            lines += ["passes:"] + [ln for note in self.notes for ln in note.lines()]
        return lines


def _dropout_linears(program: Program) -> tuple[list[tuple[int, int, int | None]],
                                                list[tuple[int, int, int | None]], str]:
    """``(pre's, vertex stage's, note)``: the Linears an input dropout fuses into, each as
    ``(linear, weight, bias or None)`` node ids of its stage, when they are the only reads
    of the (single-tensor) layer input; else ``([], [], why not)``."""
    if program.vertex is None:
        return [], [], "ApplyVertex was not traced, so its reads of x are unknown"
    if any(n.op == Op.VERTEX for n in program.edge.nodes.values()):
        return [], [], "the edge stage reads x itself"
    pre = program.pre
    read = {n.attrs["key"] for n in program.edge.nodes.values() if n.op in (Op.SRC, Op.DST)}
    if any(pre.nodes[pre.outputs[k].id].op == Op.VERTEX for k in read):
        return [], [], "the edge stage reads x itself"
    found = []
    for stage in (pre, program.vertex):
        linears, why = _linears_of_x(stage)
        if why:
            return [], [], why
        found.append(linears)
    if not any(found):
        return [], [], "no Linear reads x"
    where = " and ".join(f"{len(lins)} of the {stage} stage" for lins, stage
                         in zip(found, ("pre", "vertex")) if lins)
    return found[0], found[1], f"fused into the Linear(s) of x: {where}"


def _linears_of_x(stage: Any) -> tuple[list[tuple[int, int, int | None]], str]:
    """``stage``'s Linears of the layer input ``x``, or ``([], why)`` where it reads ``x``
    otherwise."""
    reads = [n for n in stage.nodes.values() if n.op == Op.VERTEX]
    if any(n.attrs["key"] is not None for n in reads):
        return [], "x is a dict of tensors"
    ids = {n.id for n in reads}
    if stage.kind == "vertex" and ids & set(stage.output_ids()):
        return [], "the vertex stage returns x as it is"
    linears = []
    for n in stage.nodes.values():
        used = [i for i, a in enumerate(n.args) if a in ids]
        if not used:
            continue
        if n.op != Op.LINEAR or used != [0]:
            return [], (f"x is read by {n.op.value} in the {stage.kind} stage, not only as "
                        "the input of a Linear")
        linears.append((n.id, n.args[1], n.args[2] if len(n.args) > 2 else None))
    return linears, ""


def _shares_weights(program: Program, pre: list, vertex: list) -> bool:
    """Whether a vertex-stage Linear of x reads the same layer parameters (weight and
    bias) as a pre Linear of x; only PARAM nodes name a parameter."""
    def params(stage: Any, lins: list) -> set:
        def path(i: int | None) -> Any:
            n = None if i is None else stage.nodes[i]
            if n is not None and n.op != Op.PARAM:
                return (stage.kind, i)  # a computed weight: never the other stage's
            return None if n is None else (n.attrs["path"], n.attrs.get("cols"))
        return {(path(w), path(b)) for _, w, b in lins}

    return bool(vertex) and bool(params(program.pre, pre) & params(program.vertex, vertex))


class _Tile:
    """Per-tile inputs of the edge stage, gathered per edge on demand (each at most once)."""

    def __init__(self, tile: TileView, src: dict, dst: dict, edata: Any) -> None:
        self.tile, self.src, self.dst, self.edata = tile, src, dst, edata
        self._cache: dict[Any, Any] = {}

    def __call__(self, n: Node) -> Any:
        key = (n.op, n.attrs["key"])
        if key not in self._cache:
            if n.op == Op.EDATA:
                d = self.edata
                v = d if n.attrs["key"] is None else d[n.attrs["key"]]
                if isinstance(v, EdgeFactors):  # a per-edge weight made from vertex factors
                    v = v.per_edge(self.tile.src_idx, self.tile.dst_idx)
            elif n.op == Op.SRC:
                v = self.src[n.attrs["key"]].index_select(0, self.tile.src_idx)
            else:
                v = self.dst[n.attrs["key"]].index_select(0, self.tile.dst_idx)
            self._cache[key] = v
        return self._cache[key]

    @property
    def num_dst(self) -> int:
        return self.tile.dst_hi - self.tile.dst_lo


class CompiledPlan:
    """A plan whose edge stage runs fused kernels (see the module docstring)."""

    kind = "compiled"

    def __init__(self, layer: Any, program: Program, notes: list[PassNote]) -> None:
        self.program = program
        self.notes = notes
        self.resolver = Resolver(layer)
        self.accumulator = make_accumulator(program.gather)
        self.gather = program.gather
        self.layer_name = program.layer_name
        self.edge_kinds: tuple[str, ...] = tuple(m.kind for m in program.lowering.values())
        self._typed_cache: list[tuple] = []
        self.dropout_linears, self.vertex_dropout_linears, self.dropout_note = \
            _dropout_linears(program)
        # the vertex stage's Linears of x (of dropout(x)), made by pre with its own and
        # handed to the next post (one layer call: pre, the edge walk, post), and whether
        # post may overwrite them
        self._vertex_linears: tuple[dict[int, Any], bool] | None = None
        # a vertex-stage Linear of x has a pre Linear's weight: pre makes both at once
        self._shared_linears = _shares_weights(program, self.dropout_linears,
                                               self.vertex_dropout_linears)
        self._value_recipe = _value_recipe(program, self.dropout_linears)
        # (weak refs to pre's value term and to x, Recompute.fn, parameters)
        self._deferred: tuple | None = None

    @property
    def layer(self) -> Any:
        return self.resolver.layer

    def edge_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the edge stage reads (the streaming runtime differentiates
        each recomputed tile with respect to them)."""
        out: dict[int, torch.nn.Parameter] = {}
        for n in self.program.edge.nodes.values():
            if n.op == Op.PARAM:
                v = self.resolver.param(n.attrs["path"])
                if isinstance(v, torch.nn.Parameter):
                    out[id(v)] = v
            elif n.op == Op.OPAQUE and n.attrs["kind"] == "call_module":
                for v in self.resolver.module(n.attrs["target"]).parameters():
                    out[id(v)] = v
        return list(out.values())

    def edge_reads(self) -> tuple[set, set]:
        """``(src_keys, dst_keys)``: the terms the edge stage reads from sources / destinations."""
        side: dict[Op, set] = {Op.SRC: set(), Op.DST: set()}
        for n in self.program.edge.nodes.values():
            if n.op in side:
                side[n.op].add(n.attrs["key"])
        return side[Op.SRC], side[Op.DST]

    def runs_attention_aggregate(self) -> bool:
        """Whether a whole-graph tile whose sources are its destinations runs
        :func:`~ngra.kernels.attention_aggregate` (a softmax gather whose scores are
        rowdots of its own value, GAT): its backward walks the edges one more time than
        ``softmax_aggregate``'s, which the exchange cost model counts."""
        m = self.program.lowering.get(None)
        return isinstance(m, SoftmaxMatch) and m.weights is not None

    def fuses_input_dropout(self, x: Any) -> bool:
        """Whether :meth:`pre` can apply an input dropout inside the Linears that read ``x``
        (a plain ``[N, F]`` tensor: :func:`~ngra.kernels.dropout_linear` works on rows)."""
        return (bool(self.dropout_linears or self.vertex_dropout_linears)
                and isinstance(x, torch.Tensor) and x.dim() == 2)

    # ------------------------------------------------------------------ stages
    def pre(self, x: Any, dropout: float = 0.0) -> dict:
        """The vertex-side terms; with ``dropout > 0`` (only where :meth:`fuses_input_dropout`)
        of ``dropout(x)``, computed by :func:`ngra.kernels.dropout_linear`: one mask, no
        dropped copy of ``x``."""
        def vertex(n: Node) -> Any:
            k = n.attrs["key"]
            return x if k is None else x[k]

        preset: dict[int, Any] = {}
        self._vertex_linears = None
        if dropout and not self.fuses_input_dropout(x):
            raise ValueError(f"{self.layer_name}: {self.dropout_note}; apply the dropout "
                             "to x before pre.")
        streams = not torch.is_grad_enabled() and _mapped_input(x)
        if dropout or (self._shared_linears and isinstance(x, torch.Tensor) and not streams):
            preset, self._vertex_linears, outs = self._linears_of_x(x, dropout, vertex)
        if not dropout and streams:
            terms = self._pre_rows(x)
        else:
            terms = run_stage(self.program.pre, vertex, self.resolver, preset)
        self._deferred = None
        if self._value_recipe is not None and isinstance(x, torch.Tensor) \
                and _nbytes(terms[self._value_recipe[0]]) >= RECOMPUTE_VALUE_BYTES:
            masks = kernels.dropout_masks(outs[0]) if dropout else None
            self._deferred = self._recompute_value(terms, x, dropout, masks)
        return terms

    def _linears_of_x(self, x: torch.Tensor, dropout: float, vertex: Any) -> tuple:
        """Every Linear of ``x`` (of ``dropout(x)``) in pre and in the vertex stage, each
        distinct weight once (GIN's reordered self term shares pre's), in one
        :func:`~ngra.kernels.dropout_linear` call: ``(pre's preset, (vertex stage's preset,
        whether post may overwrite it), outputs)``."""
        stages = ((self.program.pre, self.dropout_linears),
                  (self.program.vertex, self.vertex_dropout_linears))
        slots: list[int] = []  # the unique (weight, bias) each Linear reads
        weights: list = []
        biases: list = []
        for stage, lins in stages:
            args = [a for _, w, b in lins for a in (w, b) if a is not None]
            env = evaluate(stage, args, vertex, self.resolver)
            for _, w, b in lins:
                wb = (env[w], None if b is None else env[b])
                i = next((i for i, (u, v) in enumerate(zip(weights, biases))
                          if u is wb[0] and v is wb[1]), len(weights))
                if i == len(weights):
                    weights.append(wb[0])
                    biases.append(wb[1])
                slots.append(i)
        outs = (kernels.dropout_linear(x, weights, biases, dropout) if dropout
                else [F.linear(x, w, b) for w, b in zip(weights, biases)])
        cut = len(self.dropout_linears)
        preset = {lin: outs[i] for (lin, _, _), i in zip(self.dropout_linears, slots)}
        mine = {lin: outs[i] for (lin, _, _), i in zip(self.vertex_dropout_linears, slots[cut:])}
        alone = all(slots.count(i) == 1 for i in slots[cut:])
        return preset, (mine, alone), outs

    def _pre_rows(self, x: torch.Tensor) -> dict:
        """``pre`` a block of rows at a time (it is row-wise), for an ``x`` memory-mapped
        from the on-disk store: each block's pages are dropped once read, so ``x``
        streams from disk instead of becoming resident."""
        rows = max(1, PRE_BLOCK_BYTES // max(x[:1].numel() * x.element_size(), 1))
        pre = self.program.pre
        # terms that are x itself stay x (mapped), as the whole-array stage returns them
        terms: dict = {k: x for k, r in pre.outputs.items() if pre.nodes[r.id].op == Op.VERTEX}
        for r0 in range(0, x.shape[0], rows):
            block = x[r0:r0 + rows]
            part = run_stage(pre, lambda n: block, self.resolver)
            release_mapped(x, r0, r0 + block.shape[0])
            for k, v in part.items():
                if terms.get(k) is x:
                    continue
                if k not in terms:
                    terms[k] = v.new_empty((x.shape[0],) + tuple(v.shape[1:]))
                terms[k][r0:r0 + block.shape[0]] = v
        return terms

    def _recompute_value(self, terms: dict, x: torch.Tensor, dropout: float,
                         masks: Any) -> tuple | None:
        """How attention_aggregate can make the softmax value term again from ``x`` and
        the parameters (a Recompute that replays the input dropout's ``masks``), with
        pre's value term it stands for."""
        key, root, params, all_dropout = self._value_recipe
        if dropout and (not all_dropout or masks is None):
            return None  # the value would need its own draw of the one dropout mask
        pre, resolver, lins = self.program.pre, self.resolver, self.dropout_linears

        def fn(x_: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
            def vertex(_n: Node) -> torch.Tensor:
                return x_

            preset = dict(zip(params, ps))
            if dropout:  # as in pre: one mask for every Linear of x (all are the value's)
                wb = [a for _, w, b in lins for a in (w, b) if a is not None]
                env = evaluate(pre, wb, vertex, resolver, preset)
                outs = kernels.dropout_linear(
                    x_, [env[w] for _, w, _ in lins],
                    [None if b is None else env[b] for _, _, b in lins], dropout, masks=masks)
                preset.update((lin, o) for (lin, _, _), o in zip(lins, outs))
            return evaluate(pre, [root], vertex, resolver, preset)[root]

        env = evaluate(pre, params, lambda _n: x, resolver)
        # weak: the plan outlives the step, and x (an activation, for a second layer) must
        # not stay alive, nor look shared to in-place backward kernels, through it
        return (weakref.ref(terms[key]), weakref.ref(x), fn, [env[i] for i in params])

    def edge(self, tile: TileView, src: Any, dst: Any, edata: Any, drop: Any = None) -> Any:
        ctx = _Tile(tile, src, dst, edata)
        lowering = self.program.lowering
        if self.gather == "softmax":
            m = lowering[None]
            if isinstance(m, SoftmaxMatch):
                return self._softmax(ctx, m, drop)
            out = self.program.edge.outputs
            env = evaluate(self.program.edge, [out[0].id, out[1].id], ctx, self.resolver)
            return self.accumulator.partial(tile.indptr, (env[out[0].id], env[out[1].id]), drop)
        interp = [k for k, m in lowering.items() if isinstance(m, InterpMatch)]
        env = {}
        if interp:
            roots = [self._root(k) for k in interp]
            env = evaluate(self.program.edge, roots, ctx, self.resolver)
        reduce = "sum" if self.gather in ("sum", "mean") else self.gather
        parts = {}
        for k, m in lowering.items():
            if isinstance(m, InterpMatch):
                parts[k] = kernels.segment_reduce(tile.indptr, env[self._root(k)], reduce)
            elif isinstance(m, GspmmMatch):
                parts[k] = self._gspmm(ctx, m, reduce)
            else:
                parts[k] = self._fused(ctx, m, reduce)
        value = parts[None] if set(parts) == {None} else parts
        if self.gather in ("max", "min"):
            return value, tile.indptr[1:] > tile.indptr[:-1]
        return value

    def post(self, x: Any, acc: Any, graph: Any = None) -> Any:
        if self.program.sink is not None:
            if graph is None:
                raise ValueError(f"{self.layer_name}: this plan applies a Linear after the "
                                 "gather and needs the graph's in-degrees (post(x, acc, graph)).")
            acc = apply_sink(self.program.sink, self.gather, acc, graph.in_degrees(),
                             self.resolver)
        # pre's dropout_linear made the Linears of x (of dropout(x)): the vertex IR runs
        # with them (the traced UDF, when not rewritten: the interpreter computes the same)
        linears, owned = self._vertex_linears or (None, False)
        self._vertex_linears = None
        if not self.program.vertex_rewritten and not linears:
            out = self.resolver.layer.apply_vertex(x, acc)
        else:
            def inputs(n: Node) -> Any:
                k = n.attrs["key"]
                if n.op == Op.ACC:
                    return acc if k is None else acc[k]
                return x if k is None else x[k]

            out = run_stage(self.program.vertex, inputs, self.resolver, linears, owned=owned)
        check_vertex_output(self.layer_name, out, acc)
        return out

    def _root(self, key: Any) -> int:
        out = self.program.edge.outputs
        return (out if key is None else out[key]).id

    # ------------------------------------------------------------------ kernels
    def _factor(self, ctx: _Tile, m: GspmmMatch, rows: int, dtype: torch.dtype) -> Any:
        if not m.factors:
            return None
        env = evaluate(self.program.edge, [f for f, _ in m.factors], ctx, self.resolver)
        prod: Any = None
        for f, recip in m.factors:
            v = env[f]
            v = 1.0 / v if recip else v
            prod = v if prod is None else prod * v
        rank = len(m.feat)
        if not isinstance(prod, torch.Tensor):
            prod = torch.tensor(float(prod), dtype=dtype, device=ctx.tile.indptr.device)
        if prod.dim() <= rank:  # constant factors only: no row dim yet
            prod = prod.reshape((1,) * (rank + 1 - prod.dim()) + tuple(prod.shape))
        keep = tuple(m.feat[: m.edge_dims])
        full = (rows,) + keep + (1,) * (rank - m.edge_dims)
        return _shaped(prod.expand(full), (rows,) + keep)

    def _gspmm(self, ctx: _Tile, m: GspmmMatch, reduce: str) -> torch.Tensor:
        tile = ctx.tile
        src = ctx.src[m.src]
        indices, rev = tile.src_idx, tile.rev
        if m.typed is not None:
            t, f = m.typed["types"], m.typed["width"]
            types = evaluate(self.program.edge, [m.typed["type_node"]], ctx,
                             self.resolver)[m.typed["type_node"]].reshape(-1)
            indices, rev = self._virtual(tile, types, t, src.shape[0])
            src = src.reshape(src.shape[0] * t, f)
        scale = self._vertex_factors(ctx, m, reduce)
        if scale is not None:  # w_e = s[u] d[v] applied on the fly: no [E] weight
            out = kernels.gspmm(tile.indptr, indices, src, reduce=reduce, rev=rev, scale=scale)
            return _shaped(out, (ctx.num_dst,) + m.out)
        ef = self._factor(ctx, m, tile.num_edges, src.dtype)
        out = kernels.gspmm(tile.indptr, indices, src, ef, reduce=reduce, rev=rev)
        return _shaped(out, (ctx.num_dst,) + m.out)

    def _vertex_factors(self, ctx: _Tile, m: GspmmMatch, reduce: str) -> tuple | None:
        """``(src_scale, dst_scale)`` when the message's only factor is the edge data and
        that is an :class:`~ngra.graph.EdgeFactors` (reshaped to one scalar per edge)."""
        if (m.typed is not None or len(m.factors) != 1 or m.factors[0][1] or m.edge_dims
                or reduce not in ("sum", "mean")):
            return None
        stage, nid = self.program.edge, m.factors[0][0]
        while stage.nodes[nid].op in _SHAPE_OPS:
            nid = stage.nodes[nid].args[0]
        n = stage.nodes[nid]
        if n.op != Op.EDATA:
            return None
        d = ctx.edata if n.attrs["key"] is None else ctx.edata[n.attrs["key"]]
        if not isinstance(d, EdgeFactors) or d.src.requires_grad or d.dst.requires_grad:
            return None
        return d.src, d.dst

    def _virtual(self, tile: TileView, types: torch.Tensor, num_types: int,
                 num_src: int) -> tuple[torch.Tensor, Any]:
        """Source ids ``u * T + type`` and their reverse CSR, cached per tile and type content."""
        for ref, ns, cached, vidx, vrev in self._typed_cache:
            if (ref() is tile.src_idx and ns == num_src and cached.shape == types.shape
                    and torch.equal(cached, types)):
                return vidx, vrev
        if types.numel() and (int(types.min()) < 0 or int(types.max()) >= num_types):
            raise IndexError(
                f"{self.layer_name}: edge types must be in [0, {num_types}) to select a per-type "
                f"term; got range [{int(types.min())}, {int(types.max())}]."
            )
        vidx = tile.src_idx * num_types + types.to(tile.src_idx.dtype)
        vrev = kernels.transpose_csc(tile.indptr, vidx, num_src * num_types)
        self._typed_cache.insert(0, (weakref.ref(tile.src_idx), num_src, types.clone(), vidx, vrev))
        del self._typed_cache[4:]
        return vidx, vrev

    def _fused(self, ctx: _Tile, m: FusedEdgeMatch, reduce: str) -> torch.Tensor:
        from ngra.kernels.fused_edge import fused_edge_aggregate

        tile = ctx.tile
        rest, width = m.out, math.prod(m.out) if m.out else 1
        src_terms = [_term(ctx.src[k], rest, lay) for k, lay in m.src]
        dst_terms = []
        params = [i for kind, i, _ in m.dst if kind == "param"]
        penv = evaluate(self.program.edge, params, ctx, self.resolver) if params else {}
        for kind, k, lay in m.dst:
            if kind == "term":
                dst_terms.append(_term(ctx.dst[k], rest, lay))
            else:
                # one row every destination reads (fused_edge_aggregate's shared rows)
                dst_terms.append(_const_term(penv[k], rest, lay).to(tile.indptr.device))
        edge_terms = []
        if m.edge:
            env = evaluate(self.program.edge, [i for i, _ in m.edge], ctx, self.resolver)
            edge_terms = [_term(env[i], rest, lay) for i, lay in m.edge]
        out = fused_edge_aggregate(tile.indptr, tile.src_idx, m.expr, src_terms, dst_terms,
                                   edge_terms, reduce=reduce, rev=tile.rev if src_terms else None)
        if out.shape[1] != width:  # only width-1 terms: broadcast to the message width
            out = out.expand(out.shape[0], width)
        return _shaped(out, (ctx.num_dst,) + rest)

    def _softmax_operands(self, ctx: _Tile, m: SoftmaxMatch) -> tuple:
        """``(score_src [n, H], score_dst [nd, H], value [n, H, D])`` of a staged tile."""
        value = ctx.src[m.value]
        n, nd = value.shape[0], ctx.num_dst
        h = math.prod(m.heads) if m.heads else 1
        d = math.prod(m.dims) if m.dims else 1
        s_src = (_shaped(ctx.src[m.score_src], (n, h)) if m.score_src is not None
                 else value.new_zeros(n, h))
        s_dst = (_shaped(ctx.dst[m.score_dst], (nd, h)) if m.score_dst is not None
                 else value.new_zeros(nd, h))
        return s_src, s_dst, _shaped(value, (n, h, d))

    def _softmax(self, ctx: _Tile, m: SoftmaxMatch, drop: Any = None) -> tuple:
        tile, nd = ctx.tile, ctx.num_dst
        if tile.whole and m.weights is not None and ctx.src[m.value].shape[0] == nd:
            # every edge, scores rowdot(value, w): one op differentiates scores and value
            # (see attention_aggregate; the pre stage's scores go unused here)
            value = ctx.src[m.value]
            shape = (nd, math.prod(m.heads) if m.heads else 1, m.dims[0])
            env = evaluate(self.program.pre, list(m.weights), ctx, self.resolver)
            ws, wd = (env[i] for i in m.weights)  # broadcasting to [H, D], as rowdot takes
            rc, deferred, self._deferred = None, self._deferred, None
            if deferred is not None and deferred[0]() is value and deferred[1]() is not None:
                _, x, fn, params = deferred
                rc = kernels.Recompute(lambda *a: _shaped(fn(*a), shape), [x(), *params])
            out = kernels.attention_aggregate(tile.indptr, tile.src_idx, _shaped(value, shape),
                                              ws, wd, negative_slope=m.slope, rev=tile.rev,
                                              recompute=rc, dropout=drop)
            return out.new_zeros((nd,) + m.heads), None, _shaped(out, (nd,) + m.heads + m.dims)
        s_src, s_dst, v3 = self._softmax_operands(ctx, m)
        out, lse = kernels.softmax_aggregate(tile.indptr, tile.src_idx, s_src, s_dst, v3,
                                             negative_slope=m.slope, rev=tile.rev,
                                             return_lse=True, dropout=drop)
        o = _shaped(out, (nd,) + m.heads + m.dims)
        if tile.whole:
            # The tile holds every edge: no other tile merges into this state, so the
            # normalized output is the whole state; the sum None says so, and finalize
            # returns ``o`` itself (no division by ones: one N x H x D tensor less in
            # forward and in backward).
            return out.new_zeros((nd,) + m.heads), None, o
        has = (tile.indptr[1:] > tile.indptr[:-1]).to(out.dtype)
        ss = has.view((nd,) + (1,) * len(m.heads)).expand((nd,) + m.heads)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (s_src, s_dst, v3)):
            # the kernel's lse is not differentiable; chunked training differentiates
            # tiles with tile_grads, so only a lone partial tile under autograd gets here
            lse = _segment_lse(tile, s_src, s_dst, m.slope)
        # the kernel's lse is float64; the merged state (and so the layer's output) keeps
        # the value's dtype (a float64 state made a budgeted GAT's next layer fail)
        lse = lse.reshape((nd,) + m.heads).to(out.dtype)
        return torch.where(lse > -math.inf, lse, torch.zeros_like(lse)), ss, o

    def tile_grads(self, staged: Any, final: Any, grad: torch.Tensor) -> list | None:
        """Gradients of one tile's share of the output, without recomputing its forward.

        ``staged`` is a :class:`~ngra.runtime.staging.Staged` tile, ``final`` the
        accumulator's :meth:`~ngra.compiler.gather.Accumulator.final_stats` for the
        tile's destinations, and ``grad`` the output gradient of those rows. Returns
        ``[(staged rows, their gradient), ...]``, or ``None`` when the plan has no
        direct rule (the executor then recomputes the tile under autograd).

        A fused softmax aggregation has one: with the whole aggregation's
        log-sum-exp and output, the tile's gradient is the kernel's backward on the
        tile's edges (:func:`ngra.kernels.softmax_aggregate_backward`), with the
        tile's share of an attention dropout (``staged.drop``).
        """
        m = self.program.lowering.get(None)
        if self.gather != "softmax" or not isinstance(m, SoftmaxMatch):
            return None
        ctx = _Tile(staged.view, staged.src, staged.dst, staged.edata)
        tile, nd = ctx.tile, ctx.num_dst
        s_src, s_dst, v3 = (t.detach() for t in self._softmax_operands(ctx, m))
        dev = v3.device  # the compute device; the accumulator's stats live with the terms
        lse, out = (t.to(dev, non_blocking=True) for t in final)
        g_src, g_dst, g_val = kernels.softmax_aggregate_backward(
            tile.indptr, tile.src_idx, s_src, s_dst, v3, out.reshape(nd, *v3.shape[1:]),
            lse.reshape(nd, v3.shape[1]), grad.to(dev).reshape(nd, *v3.shape[1:]),
            negative_slope=m.slope, rev=tile.rev, dropout=staged.drop)
        pairs = [(ctx.src[m.value], g_val)]
        if m.score_src is not None:
            pairs.append((ctx.src[m.score_src], g_src))
        if m.score_dst is not None:
            pairs.append((ctx.dst[m.score_dst], g_dst))
        return [(t, g.reshape(t.shape)) for t, g in pairs]

    # ------------------------------------------------------------------ explain
    def describe(self) -> list[str]:
        p = self.program
        kinds = ", ".join(self.edge_kinds)
        lines = [f"plan: compiled ({kinds})", "passes:"]
        for note in self.notes:
            lines += note.lines()
        lines.append("stages:")
        pre_terms = [k for k, info in p.terms.items() if info.get("origin") != "input"
                     and k in p.pre.outputs]
        if pre_terms:
            parts = []
            for k in pre_terms:
                info = p.terms[k]
                node = p.pre.nodes[p.pre.outputs[k].id]
                rest = node.rest if node.shape is not None else info.get("rest")
                shape = "?" if rest is None else ", ".join(["N", *map(str, rest)])
                parts.append(f"{format_key(k)} = {format_node(p.pre, node.id)} [{shape}]")
            lines.append("  pre     (per vertex) " + "; ".join(parts))
        else:
            lines.append("  pre     (per vertex) nothing: the edge stage reads the vertex data")
        for key, m in p.lowering.items():
            who = "" if key is None else f"[{key!r}] "
            kernel = _kernel_line(p, m, self.gather, self._value_recipe is not None)
            lines.append(f"  edge    (per tile)   {who}{kernel}")
        lines.append(f"  gather  {self.gather}" + (" (partial sums per tile; divided by the "
                                                    "in-degree at the end)" if self.gather == "mean"
                                                    else ""))
        if p.sink is not None:
            lines.append(f"  sink    (per vertex) {p.sink['module']} applied to the gathered "
                         "messages (moved from the end of ApplyEdge)")
        if p.vertex_rewritten:
            out = ", ".join(format_node(p.vertex, r.id) for r in _refs(p.vertex.outputs))
            lines.append(f"  vertex  apply_vertex rewritten: {out}")
        else:
            lines.append(f"  vertex  {p.layer_name}.apply_vertex as written")
        how = ("inside pre, dropout_linear (no dropped copy of x)"
               if self.dropout_linears or self.vertex_dropout_linears
               else "applied to x before pre")
        lines.append(f"input dropout (layer(..., dropout=p)): {how}: {self.dropout_note}")
        return lines


def _value_recipe(program: Program, dropout_linears: list) -> tuple | None:
    """``(value key, value node, its PARAM nodes, reads every dropout Linear)`` when
    the softmax value of a rowdot-scored match (``SoftmaxMatch.weights``) is made in
    pre from the plain ``x`` and parameters by closed ops alone (no opaque call, no
    random op), so that attention_aggregate can make it again in backward; else None."""
    m = program.lowering.get(None)
    if not isinstance(m, SoftmaxMatch) or m.weights is None or "pre" in program.as_written:
        return None
    pre = program.pre
    root = pre.outputs[m.value].id
    nodes = [pre.nodes[i] for i in pre.ancestors([root])]
    if any(n.op == Op.OPAQUE or (n.op == Op.VERTEX and n.attrs["key"] is not None)
           for n in nodes):
        return None
    ids = {n.id for n in nodes}
    return (m.value, root, [n.id for n in nodes if n.op == Op.PARAM],
            all(lin in ids for lin, _, _ in dropout_linears))


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _mapped_input(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] > 0 and is_mapped(x)


def _refs(struct: Any) -> list:
    return list(iter_refs(struct))


def _kernel_line(p: Program, m: Any, gather: str, remade: bool = False) -> str:
    reduce = "sum" if gather in ("sum", "mean") else gather
    if isinstance(m, GspmmMatch):
        ef = "edge_feat=" + ("[E]" if m.edge_dims == 0 else
                             "[E, " + ", ".join(map(str, m.feat[:m.edge_dims])) + "]") \
            if m.factors else "no edge_feat"
        if m.typed:
            return (f"gspmm over N*{m.typed['types']} virtual sources (typed), {ef}, "
                    f"reduce={reduce} -> [N_dst, {', '.join(map(str, m.out))}]")
        return (f"gspmm({format_key(m.src)}, {ef}, reduce={reduce}) -> "
                f"[N_dst, {', '.join(map(str, m.out))}]")
    if isinstance(m, SoftmaxMatch):
        line = (f"softmax_aggregate(score_src={_k(m.score_src)}, score_dst={_k(m.score_dst)}, "
                f"value={format_key(m.value)}, negative_slope={m.slope:g}) -> "
                f"[N_dst, {', '.join(map(str, m.heads + m.dims))}]; no [E, H, D] tensor")
        if m.weights is not None:
            line += ("; whole graph: attention_aggregate(value, w_src, w_dst), the scores' "
                     "rowdots inside")
            if remade:
                line += ", the value made again from x in backward instead of saved"
        return line
    if isinstance(m, FusedEdgeMatch):
        src = ", ".join(format_key(k) for k, _ in m.src)
        dst = ", ".join(format_key(k) if kind == "term" else "param row" for kind, k, _ in m.dst)
        return (f"fused_edge_aggregate({m.expr}; src=[{src}], dst=[{dst}], "
                f"edge={len(m.edge)} term(s), reduce={reduce}) -> "
                f"[N_dst, {', '.join(map(str, m.out))}]; no [E, F] tensor")
    return f"interpreted edge stage + segment_reduce ({describe_match(p, m)})"


def _k(key: Any) -> str:
    return "0" if key is None else format_key(key)


def _term(t: torch.Tensor, rest: tuple[int, ...], layout: str) -> torch.Tensor:
    rows = t.shape[0]
    if layout == "ones":
        return _shaped(t, (rows, 1))
    if layout == "expand":
        t = t.expand((rows,) + rest)
    return _shaped(t, (rows, math.prod(rest) if rest else 1))


def _const_term(v: Any, rest: tuple[int, ...], layout: str) -> torch.Tensor:
    rank = len(rest)
    v = v if v.dim() <= rank else v.reshape(tuple(v.shape[1:]))
    v = v.reshape((1,) * (rank - v.dim()) + tuple(v.shape))
    if layout == "ones":
        return v.reshape(1, 1)
    return v.expand(rest).reshape(1, math.prod(rest) if rest else 1)


def _segment_lse(tile: TileView, s_src: torch.Tensor, s_dst: torch.Tensor,
                 slope: float) -> torch.Tensor:
    """Per-destination log-sum-exp of the tile's scores (differentiable), ``[N_dst, H]``."""
    local = tile.dst_idx
    e = torch.nn.functional.leaky_relu(s_src.index_select(0, tile.src_idx)
                                       + s_dst.index_select(0, local), slope)
    m = kernels.segment_reduce(tile.indptr, e.detach(), "max")
    p = torch.exp(e - m.index_select(0, local))
    s = kernels.segment_reduce(tile.indptr, p, "sum")
    return m + torch.log(torch.where(s > 0, s, torch.ones_like(s)))


def lower(layer: Any, program: Program, notes: list[PassNote]) -> CompiledPlan:
    """The plan for a compiled ``program``."""
    return CompiledPlan(layer, program, notes)


def _shaped(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``t.reshape(shape)``, or ``t`` itself when it has that shape already: a same-shape
    reshape is still a view under autograd, and a gradient that arrives through a view
    is one autograd cannot add the term's other gradients into in place (one
    ``N x H x D`` tensor more at a GAT layer's backward peak, one fresh ``N x F`` sum
    for G-GCN's input, read by its two linears and its edge kernel)."""
    return t if tuple(t.shape) == tuple(shape) else t.reshape(shape)
