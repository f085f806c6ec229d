"""The edge stage of a compiled plan: one staged tile through the kernels it was lowered to.

:class:`EdgeStage` runs each lowered output of the edge stage
(``Program.lowering``, the fuse pass's matches) on a tile:

* :class:`~ngra.compiler.passes.fuse.GspmmMatch`: :func:`~ngra.kernels.gspmm` of a source
  term, scaled per edge by the message's factors (or per vertex, by an
  :class:`~ngra.graph.EdgeFactors`); a typed message runs over ``N * T`` virtual sources;
* :class:`~ngra.compiler.passes.fuse.FusedEdgeMatch`:
  :func:`~ngra.kernels.fused_edge.fused_edge_aggregate` of its expression; the fields of a
  per-field gather's group (``FusedEdgeMatch.group``) all from one
  :func:`~ngra.kernels.fused_edge.fused_edge_aggregate_multi` walk, each with its reducer
  (one ``fused_edge_aggregate`` per field where the device's backend has no multi-output
  kernel: the GPU's);
* :class:`~ngra.compiler.passes.fuse.SoftmaxMatch`: :func:`~ngra.kernels.softmax_aggregate`;
  on the whole-graph tile, when its scores are rowdots of its own value (GAT),
  :func:`~ngra.kernels.attention_aggregate`, which may make the value again in backward
  from the recipe ``pre`` handed on;
* :class:`~ngra.compiler.passes.fuse.SoftmaxScoreMatch`: :func:`~ngra.kernels.edge_score`
  (the ``[E, H]`` scores), :func:`~ngra.kernels.edge_softmax` and a per-head
  :func:`~ngra.kernels.gspmm` of the value: no ``[E, H, D]`` tensor;
* :class:`~ngra.compiler.passes.fuse.InterpMatch`: the interpreted edge IR and
  :func:`~ngra.kernels.segment_reduce`; on the whole-graph tile, when every output is
  interpreted, a chunk of edges at a time (:mod:`ngra.compiler.chunked`: no ``[E, F]``
  tensor outlives a chunk, backward recomputes each chunk).

Source-side rows are indexed with the tile's local source ids; destination-side rows are
the tile's interval ``[dst_lo, dst_hi)``, indexed with local destination ids. The stage
holds the program and reads the layer's parameters when it runs; its one piece of state
is a cache of typed tiles' virtual source ids, checked against the tile's content.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

import torch

from ngra import kernels
from ngra.compiler import chunked
from ngra.compiler.gather import PerFieldAccumulator, make_accumulator
from ngra.compiler.interp import Resolver, evaluate
from ngra.compiler.ir import Node, Op, Program, map_refs
from ngra.compiler.passes.fuse import (
    FusedEdgeMatch,
    GspmmMatch,
    InterpMatch,
    SoftmaxMatch,
    SoftmaxScoreMatch,
)
from ngra.compiler.plan import StagedTile
from ngra.compiler.tile import TileView
from ngra.graph import EdgeFactors
from ngra.kernels.fused_edge import fused_edge_aggregate, fused_edge_aggregate_multi
from ngra.kernels.registry import backend_for

__all__ = ["EdgeStage", "shaped"]

# ops that only reshape a per-edge scalar ([E] <-> [E, 1, ...])
_SHAPE_OPS = (Op.UNSQUEEZE, Op.VIEW, Op.RESHAPE, Op.SQUEEZE, Op.FLATTEN)


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



class EdgeStage:
    """A compiled program's edge stage (see the module docstring)."""

    def __init__(self, program: Program, resolver: Resolver) -> None:
        self.program = program
        self.resolver = resolver
        self.gather = program.gather
        self.layer_name = program.layer_name
        self.accumulator = make_accumulator(program.gather)
        #: no output runs on a kernel: the whole-graph tile runs in chunks of edges
        self.interpreted = all(isinstance(m, InterpMatch) for m in program.lowering.values())
        # typed tiles' virtual source ids: (weak src_idx, num_src, types, vidx, vrev)
        self._typed_cache: list[tuple] = []
        self._typed_lock = threading.Lock()

    def run(self, tile: TileView, src: Any, dst: Any, edata: Any, drop: Any = None,
            recompute: tuple | None = None) -> Any:
        """The accumulator's partial state of one staged tile (see
        :meth:`ngra.compiler.plan.Plan.edge`); ``recompute``: how pre's softmax value can
        be made again (:meth:`ngra.compiler.compiled.CompiledPlan.pre`), or ``None``."""
        chunks = self.chunks(tile, src, dst, edata)
        if chunks is not None:
            return chunked.run_chunked(chunks, tile, self.accumulator, self._chunk_messages,
                                       _terms(src, dst), edata, self.parameters(), drop)
        ctx = _Tile(tile, src, dst, edata)
        lowering = self.program.lowering
        if self.gather == "softmax":
            m = lowering[None]
            if isinstance(m, SoftmaxMatch):
                return self._softmax(ctx, m, drop, recompute)
            if isinstance(m, SoftmaxScoreMatch):
                return self._softmax_score(ctx, m, drop)
            out = self.program.edge.outputs
            env = evaluate(self.program.edge, [out[0].id, out[1].id], ctx, self.resolver)
            return self.accumulator.partial(tile.indptr, (env[out[0].id], env[out[1].id]), drop)
        interp = [k for k, m in lowering.items() if isinstance(m, InterpMatch)]
        env = {}
        if interp:
            roots = [self._root(k) for k in interp]
            env = evaluate(self.program.edge, roots, ctx, self.resolver)
        if isinstance(self.accumulator, PerFieldAccumulator):
            # the fields apply_edge returns are the gather's (else a clear error)
            self.accumulator.check(self.program.edge.outputs, "one tensor")
        parts: dict[Any, Any] = {}
        for k, m in lowering.items():
            reduce = _kernel_reduce(self.gather_of(k))
            if k in parts:
                continue  # made by its group's walk
            if isinstance(m, InterpMatch):
                parts[k] = kernels.segment_reduce(tile.indptr, env[self._root(k)], reduce)
            elif isinstance(m, GspmmMatch):
                parts[k] = self._gspmm(ctx, m, reduce)
            elif m.group:
                parts.update(self._fused_group(ctx, m))
            else:
                parts[k] = self._fused(ctx, m, reduce)
        has = tile.indptr[1:] > tile.indptr[:-1]
        if not isinstance(self.gather, str):  # per field: each its accumulator's partial
            return {k: (v, has) if self.gather[k] in ("max", "min") else v
                    for k, v in parts.items()}
        value = parts[None] if set(parts) == {None} else parts
        if self.gather in ("max", "min"):
            return value, has
        return value

    def gather_of(self, key: Any) -> str:
        """The reducer of output ``key`` (the layer's gather, or its field's)."""
        return self.gather if isinstance(self.gather, str) else self.gather[key]

    def chunks(self, tile: TileView, src: Any, dst: Any, edata: Any) -> chunked.Chunks | None:
        """How the tile's edges run in chunks (:mod:`ngra.compiler.chunked`), or ``None``:
        all at once (a fused kernel, a partial tile, a graph that fits one chunk)."""
        if not (tile.whole and self.interpreted) or _factors_want_grad(edata):
            return None
        src_keys, dst_keys = self.reads()
        rows = chunked.row_bytes([src[k] for k in src_keys], [dst[k] for k in dst_keys],
                                 edata)
        return chunked.chunks_for(tile.indptr, tile.num_edges, rows)

    def _chunk_messages(self, rows: chunked.Rows) -> Any:
        """The edge stage's outputs on one chunk (its inputs gathered by ``rows``)."""
        def inputs(n: Node) -> Any:
            k = n.attrs["key"]
            if n.op == Op.SRC:
                return rows.src(k)
            if n.op == Op.DST:
                return rows.dst(k)
            return rows.data(k)

        stage = self.program.edge
        env = evaluate(stage, stage.output_ids(), inputs, self.resolver)
        return map_refs(stage.outputs, lambda r: env[r.id])

    def reads(self) -> tuple[set, set]:
        """``(src_keys, dst_keys)``: the terms the edge stage reads from sources / destinations."""
        side: dict[Op, set] = {Op.SRC: set(), Op.DST: set()}
        for n in self.program.edge.nodes.values():
            if n.op in side:
                side[n.op].add(n.attrs["key"])
        return side[Op.SRC], side[Op.DST]

    def parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the edge stage reads."""
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

    def _root(self, key: Any) -> int:
        out = self.program.edge.outputs
        return (out if key is None else out[key]).id

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
        return shaped(prod.expand(full), (rows,) + keep)

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
            return shaped(out, (ctx.num_dst,) + m.out)
        ef = self._factor(ctx, m, tile.num_edges, src.dtype)
        out = kernels.gspmm(tile.indptr, indices, src, ef, reduce=reduce, rev=rev)
        return shaped(out, (ctx.num_dst,) + m.out)

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
        with self._typed_lock:
            cache = list(self._typed_cache)
        for ref, ns, cached, vidx, vrev in cache:
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
        with self._typed_lock:
            self._typed_cache.insert(0, (weakref.ref(tile.src_idx), num_src, types.clone(),
                                         vidx, vrev))
            del self._typed_cache[4:]
        return vidx, vrev

    def _vertex_terms(self, ctx: _Tile, m: FusedEdgeMatch) -> tuple[list, list]:
        """``(src_terms, dst_terms)`` of an element-wise match, ``[rows, F]`` or
        ``[rows, 1]``; a parameter is one row every destination reads."""
        rest = m.out
        src_terms = [_term(ctx.src[k], rest, lay) for k, lay in m.src]
        dst_terms = []
        params = [i for kind, i, _ in m.dst if kind == "param"]
        penv = evaluate(self.program.edge, params, ctx, self.resolver) if params else {}
        for kind, k, lay in m.dst:
            if kind == "term":
                dst_terms.append(_term(ctx.dst[k], rest, lay))
            else:
                # one row every destination reads (fused_edge_aggregate's shared rows)
                dst_terms.append(_const_term(penv[k], rest, lay).to(ctx.tile.indptr.device))
        return src_terms, dst_terms

    def _fused(self, ctx: _Tile, m: FusedEdgeMatch, reduce: str) -> torch.Tensor:
        tile = ctx.tile
        rest, width = m.out, math.prod(m.out) if m.out else 1
        src_terms, dst_terms = self._vertex_terms(ctx, m)
        edge_terms = self._edge_terms(ctx, m)
        out = fused_edge_aggregate(tile.indptr, tile.src_idx, m.expr, src_terms, dst_terms,
                                   edge_terms, reduce=reduce, rev=tile.rev if src_terms else None)
        if out.shape[1] != width:  # only width-1 terms: broadcast to the message width
            out = out.expand(out.shape[0], width)
        return shaped(out, (ctx.num_dst,) + rest)

    def _fused_group(self, ctx: _Tile, m: FusedEdgeMatch) -> dict[Any, torch.Tensor]:
        """The fields of ``m.group`` from one :func:`fused_edge_aggregate_multi` walk (their
        matches share leaves); where the device's backend has no multi-output kernel (the
        GPU's), one :func:`fused_edge_aggregate` per field."""
        lowering = self.program.lowering
        keys = m.group
        tile = ctx.tile
        device = tile.indptr.device
        if backend_for("fused_edge_multi_fwd", device) != backend_for("fused_edge_fwd", device):
            return {k: self._fused(ctx, lowering[k], _kernel_reduce(self.gather_of(k)))
                    for k in keys}
        rest, width = m.out, math.prod(m.out) if m.out else 1
        src_terms, dst_terms = self._vertex_terms(ctx, m)
        edge_terms = self._edge_terms(ctx, m)
        outs = fused_edge_aggregate_multi(
            tile.indptr, tile.src_idx,
            [(lowering[k].expr, _kernel_reduce(self.gather_of(k))) for k in keys],
            src_terms, dst_terms, edge_terms, rev=tile.rev if src_terms else None)
        return {k: shaped(o.expand(o.shape[0], width), (ctx.num_dst,) + rest)
                for k, o in zip(keys, outs)}

    def _edge_terms(self, ctx: _Tile, m: FusedEdgeMatch) -> list[torch.Tensor]:
        if not m.edge:
            return []
        env = evaluate(self.program.edge, [i for i, _ in m.edge], ctx, self.resolver)
        return [_term(env[i], m.out, lay) for i, lay in m.edge]

    def _softmax_score(self, ctx: _Tile, m: SoftmaxScoreMatch, drop: Any = None) -> tuple:
        """The softmax state of a tile whose scores come from :func:`~ngra.kernels.edge_score`:
        ``[E_t, H]`` scores and weights, the value read per head by gspmm."""
        tile, nd = ctx.tile, ctx.num_dst
        h = math.prod(m.heads) if m.heads else 1
        src_terms, dst_terms = self._vertex_terms(ctx, m.score)
        score = kernels.edge_score(tile.indptr, tile.src_idx, m.score.expr, src_terms,
                                   dst_terms, heads=h, scale=m.scale)
        p = kernels.edge_softmax(tile.indptr, score)
        if drop is not None:
            p = p * drop.factors(h, p.dtype, p.device).view(p.shape)
        value = ctx.src[m.value]
        d = math.prod(m.dims) if m.dims else 1
        out = kernels.gspmm(tile.indptr, tile.src_idx, shaped(value, (value.shape[0], h, d)),
                            p, reduce="sum", rev=tile.rev)
        o = shaped(out, (nd,) + m.heads + m.dims)
        if tile.whole:  # the whole state, as in _softmax
            return out.new_zeros((nd,) + m.heads), None, o
        local = tile.dst_idx
        mx = kernels.segment_reduce(tile.indptr, score.detach(), "max")
        ssum = kernels.segment_reduce(tile.indptr, torch.exp(score - mx.index_select(0, local)),
                                      "sum")
        lse = (mx + torch.log(torch.where(ssum > 0, ssum, torch.ones_like(ssum))))
        lse = lse.reshape((nd,) + m.heads)
        has = (tile.indptr[1:] > tile.indptr[:-1]).to(out.dtype)
        ss = has.view((nd,) + (1,) * len(m.heads)).expand((nd,) + m.heads)
        return torch.where(has.view((nd,) + (1,) * len(m.heads)) > 0, lse,
                           torch.zeros_like(lse)), ss, o

    def _softmax_operands(self, ctx: _Tile, m: SoftmaxMatch) -> tuple:
        """``(score_src [n, H], score_dst [nd, H], value [n, H, D])`` of a staged tile."""
        value = ctx.src[m.value]
        n, nd = value.shape[0], ctx.num_dst
        h = math.prod(m.heads) if m.heads else 1
        d = math.prod(m.dims) if m.dims else 1
        s_src = (shaped(ctx.src[m.score_src], (n, h)) if m.score_src is not None
                 else value.new_zeros(n, h))
        s_dst = (shaped(ctx.dst[m.score_dst], (nd, h)) if m.score_dst is not None
                 else value.new_zeros(nd, h))
        return s_src, s_dst, shaped(value, (n, h, d))

    def _softmax(self, ctx: _Tile, m: SoftmaxMatch, drop: Any = None,
                 recompute: tuple | None = None) -> tuple:
        tile, nd = ctx.tile, ctx.num_dst
        if tile.whole and m.weights is not None and ctx.src[m.value].shape[0] == nd:
            # every edge, scores rowdot(value, w): one op differentiates scores and value
            # (see attention_aggregate; the pre stage's scores go unused here)
            value = ctx.src[m.value]
            shape = (nd, math.prod(m.heads) if m.heads else 1, m.dims[0])
            env = evaluate(self.program.pre, list(m.weights), ctx, self.resolver)
            ws, wd = (env[i] for i in m.weights)  # broadcasting to [H, D], as rowdot takes
            rc = None
            if recompute is not None and recompute[0]() is value and recompute[1]() is not None:
                _, x, fn, params = recompute
                rc = kernels.Recompute(lambda *a: shaped(fn(*a), shape), [x(), *params])
            out = kernels.attention_aggregate(tile.indptr, tile.src_idx, shaped(value, shape),
                                              ws, wd, negative_slope=m.slope, rev=tile.rev,
                                              recompute=rc, dropout=drop)
            return out.new_zeros((nd,) + m.heads), None, shaped(out, (nd,) + m.heads + m.dims)
        s_src, s_dst, v3 = self._softmax_operands(ctx, m)
        out, lse = kernels.softmax_aggregate(tile.indptr, tile.src_idx, s_src, s_dst, v3,
                                             negative_slope=m.slope, rev=tile.rev,
                                             return_lse=True, dropout=drop)
        o = shaped(out, (nd,) + m.heads + m.dims)
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

    def tile_grads(self, staged: StagedTile, final: Any, grad: torch.Tensor) -> list | None:
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



def _terms(src: Any, dst: Any) -> Any:
    """The whole tile's vertex terms, from its source and destination reads (the same
    tensors on the whole-graph tile; each side holds the keys it reads)."""
    if isinstance(src, dict) and isinstance(dst, dict):
        return {**dst, **src}
    return src


def _kernel_reduce(gather: str) -> str:
    """The reducer a kernel runs for ``gather``: a mean's sum is divided by the in-degree
    when the column's accumulator finalizes."""
    return "sum" if gather in ("sum", "mean") else gather


def _factors_want_grad(edata: Any) -> bool:
    """Factored edge weights that require grad (the chunked stage takes per-edge data)."""
    if isinstance(edata, dict):
        return any(_factors_want_grad(v) for v in edata.values())
    return isinstance(edata, EdgeFactors) and (edata.src.requires_grad
                                               or edata.dst.requires_grad)


def _term(t: torch.Tensor, rest: tuple[int, ...], layout: str) -> torch.Tensor:
    rows = t.shape[0]
    if layout == "ones":
        return shaped(t, (rows, 1))
    if layout == "expand":
        t = t.expand((rows,) + rest)
    return shaped(t, (rows, math.prod(rest) if rest else 1))


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



def shaped(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """``t.reshape(shape)``, or ``t`` itself when it has that shape already: a same-shape
    reshape is still a view under autograd, and a gradient that arrives through a view
    is one autograd cannot add the term's other gradients into in place (one
    ``N x H x D`` tensor more at a GAT layer's backward peak, one fresh ``N x F`` sum
    for G-GCN's input, read by its two linears and its edge kernel)."""
    return t if tuple(t.shape) == tuple(shape) else t.reshape(shape)

