"""Chunked streaming: the column walk, tile staging and prefetch, and recompute-in-backward.

Forward walks destination columns; within a column the tiles stream by and
their partial results merge into the column's resident accumulator. Each tile
is staged first (:mod:`ngra.runtime.staging`: the vertex rows it touches, with
local ids) by a background thread while the previous tile computes.

When the grid has more than one tile (and autograd is on), propagation runs
inside :class:`StreamedPropagation`, a custom autograd Function: forward keeps
no edge-level tensor, and backward walks the columns again, restaging each tile as
fresh leaves, recomputing its edge stage with autograd and adding the gradient
of that tile's contribution into the vertex terms, edge data and parameters
before the next tile. A plan with a direct rule (``plan.tile_grads``: a fused
softmax aggregation, whose gradient on a tile follows from the whole
aggregation's log-sum-exp and output) skips the recomputation; a compiled plan
with a linear Gather (sum, mean) recomputes under
:func:`ngra.kernels.backward_only`, which skips its g-SpMM and fused-edge
kernels' forward (their outputs enter the accumulator linearly, so only their
backward is needed). Edge-level memory is therefore O(tile), never O(E x F),
and no gradient of size N x F is made per tile. This holds for fused kernels
too, although they save no per-edge activations: under plain autograd every
tile's staged rows and source gradient would stay alive together (the engine
runs all tile kernels' backward before any staging node's), which grew a
chunked GCN's peak past the unchunked one (R-MAT 2^18, 128 MB budget: 1.29x;
1.05x recomputing). The 1 x 1 grid runs the same column walk under plain
autograd (staging is the identity, and no recomputation is needed).

A softmax gather's attention dropout (:class:`~ngra.kernels.EdgeDropout`) is drawn
once per layer call, before the walk: each tile is staged with its edges' counters,
so the forward, the direct rule and a recomputed tile all hash the same masks.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import Any

import torch

from ngra import kernels, probes
from ngra.compiler.plan import Plan
from ngra.graph import Graph
from ngra.kernels.lean import vjp
from ngra.kernels.transpose import prefer_csc_walk
from ngra.memstat import malloc_trim, release_large_frees
from ngra.runtime.staging import (
    Staged,
    Stager,
    flatten,
    forced_mode,
    plan_parameters,
    unflatten,
)
from ngra.runtime.tiles import WalkGrid

__all__ = ["walk", "propagate", "run_streamed", "prefetched", "stager_for",
           "StreamedPropagation", "tile_gradients"]


def prefetched(makers: Iterable[Callable[[], Any]], depth: int = 1) -> Iterator[Any]:
    """Yield each maker's result, building the next ``depth`` in a background thread.

    The thread runs with the caller's grad mode (staging under autograd records
    its graph there).
    """
    makers = list(makers)
    if len(makers) <= 1:
        for make in makers:
            yield make()
        return
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    grad = torch.is_grad_enabled()

    def work() -> None:
        torch.set_grad_enabled(grad)
        for make in makers:
            if stop.is_set():
                return
            try:
                item = (make(), None)
            except BaseException as exc:  # hand the error to the consumer
                item = (None, exc)
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if item[1] is not None:
                return

    thread = threading.Thread(target=work, name="ngra-prefetch", daemon=True)
    thread.start()
    try:
        for _ in makers:
            item, exc = q.get()
            if exc is not None:
                raise exc
            yield item
    finally:
        stop.set()
        thread.join()


def staged(stager: Stager, tiles: Iterable[Any]) -> Iterator[Staged]:
    """``tiles`` staged one ahead by the prefetch thread."""
    return prefetched(partial(stager.stage, t) for t in tiles)


def stager_for(plan: Plan, terms: Any, edata: Any, **kw: Any) -> Stager:
    """The :class:`Stager` of one propagation of ``plan``: the side(s) each term is
    read on (``plan.edge_reads()``, when the plan knows) and the forced staging mode."""
    kw.setdefault("mode", forced_mode())
    return Stager(terms, edata, plan.edge_reads(), **kw)


def walk(plan: Plan, graph: Graph, grid: WalkGrid, terms: Any, edata: Any, drop: Any = None,
         walk_csc: bool = False, carry: Any = None) -> Any:
    """Propagate over ``grid``: :func:`run_streamed` for several tiles under autograd, else
    :func:`propagate`. ``walk_csc`` runs it under
    :func:`~ngra.kernels.transpose.prefer_csc_walk` (a budget too tight for the backward's
    transpose). A grid of several tiles first makes glibc return freed large blocks to
    the OS at once (:func:`ngra.memstat.release_large_frees`, for the rest of the process):
    the tiles' temporaries would otherwise stay in its heap arenas. ``carry`` is what
    ``plan.pre`` handed on for this call's edge stage (read only by a whole-graph tile,
    so the recomputing walk of several tiles does without it)."""
    if grid.num_tiles > 1:
        release_large_frees()
    with prefer_csc_walk() if walk_csc else contextlib.nullcontext():
        if grid.num_tiles > 1 and torch.is_grad_enabled():
            return run_streamed(plan, graph, grid, terms, edata, drop)
        return propagate(plan, graph, grid, terms, edata, drop=drop, carry=carry)


def propagate(plan: Plan, graph: Graph, grid: WalkGrid, terms: Any, edata: Any,
              keep_state: bool = False, drop: Any = None, carry: Any = None) -> Any:
    """The column walk: per column, stage and merge tile partials, then finalize.

    ``drop`` is a softmax gather's attention dropout over the graph's CSC edges (an
    :class:`~ngra.kernels.EdgeDropout`): the stager hands each tile its edges' share.
    ``carry``: what ``plan.pre`` handed on to the edge stage.

    Returns the accumulator ``[N, ...]`` (and, with ``keep_state``, each
    column's final accumulator state, the RNG state before each tile, so that
    backward recomputes random ops such as dropout identically, and the stager).
    """
    acc = plan.accumulator
    in_deg = graph.in_degrees()
    stager = stager_for(plan, terms, edata, drop=drop)
    cols, states, rng = [], [], {}
    for column in grid.columns:
        state, lo, hi = None, None, None
        for st in staged(stager, column):
            lo, hi = st.view.dst_lo, st.view.dst_hi
            if keep_state:
                rng[st.view.key] = torch.get_rng_state()
            with probes.stage("edge") as s:
                part = s.outputs(st.run(plan, carry))
            with probes.stage("combine") as s:
                state = s.outputs(acc.combine(state, part))
        with probes.stage("finalize") as s:
            # the state is kept for backward, or is this column's alone to overwrite
            cols.append(s.outputs(acc.finalize(state, in_deg[lo:hi], in_place=not keep_state)))
        if keep_state:
            states.append((lo, hi, state))
        if len(grid.columns) > 1:
            malloc_trim()  # hand the column's freed temporaries back (see release_large_frees)
    out = cols[0] if len(cols) == 1 else _cat(cols)
    return (out, states, rng, stager) if keep_state else out


def run_streamed(plan: Plan, graph: Graph, grid: WalkGrid, terms: Any, edata: Any,
                 drop: Any = None) -> torch.Tensor:
    """Propagate over a multi-tile ``grid`` with O(tile) edge memory in backward (``drop``:
    as for :func:`propagate`; backward draws the same masks from its seeds)."""
    t_leaves, t_spec = flatten(terms)
    e_leaves, e_spec = flatten(edata)
    params = [p for p in plan_parameters(plan) if p.requires_grad]
    ctx = _Context(plan, graph, grid, t_spec, len(t_leaves), e_spec, len(e_leaves), len(params),
                   drop)
    out = StreamedPropagation.apply(ctx, *t_leaves, *e_leaves, *params)
    return out[0] if ctx.keys is None else dict(zip(ctx.keys, out))


class _Context:
    __slots__ = ("plan", "graph", "grid", "t_spec", "nt", "e_spec", "ne", "np", "drop", "keys")

    def __init__(self, plan, graph, grid, t_spec, nt, e_spec, ne, np_, drop):
        self.plan, self.graph, self.grid = plan, graph, grid
        self.t_spec, self.nt, self.e_spec, self.ne, self.np = t_spec, nt, e_spec, ne, np_
        self.drop = drop
        self.keys: tuple | None = None  # a dict accumulator's keys (the outputs' order)


class StreamedPropagation(torch.autograd.Function):
    """Propagation over a tile grid; backward restages and recomputes one tile at a time.
    Its outputs are the accumulator, or a dict accumulator's values (``c.keys``)."""

    @staticmethod
    def forward(ctx: Any, c: _Context, *leaves: torch.Tensor) -> tuple[torch.Tensor, ...]:
        terms = unflatten(c.t_spec, list(leaves[: c.nt]))
        edata = unflatten(c.e_spec, list(leaves[c.nt: c.nt + c.ne]))
        with torch.no_grad():
            out, states, rng, stager = propagate(c.plan, c.graph, c.grid, terms, edata,
                                                 keep_state=True, drop=c.drop)
        if isinstance(out, Mapping) and all(isinstance(v, torch.Tensor) for v in out.values()):
            c.keys = tuple(out)
        elif not isinstance(out, torch.Tensor):
            raise NotImplementedError(
                "chunked streaming supports tensor-valued accumulators (or dicts of them); "
                f"this layer's apply_edge returns {type(out).__name__}. Run it without a "
                "memory budget.")
        ctx.c, ctx.rng = c, rng
        ctx.staging = {"mode": stager.mode}  # backward restages alike
        ctx.final = [(lo, hi, c.plan.accumulator.final_stats(st, _rows(out, lo, hi)))
                     for lo, hi, st in states]
        ctx.save_for_backward(*leaves[: c.nt + c.ne])
        return (out,) if c.keys is None else tuple(out.values())

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        c: _Context = ctx.c
        grad_out: Any = grads[0] if c.keys is None else dict(zip(c.keys, grads))
        saved = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in saved]
        params = [p for p in plan_parameters(c.plan) if p.requires_grad][: c.np]
        grads: list[torch.Tensor | None] = [None] * (len(saved) + len(params))
        terms = unflatten(c.t_spec, inputs[: c.nt])
        edata = unflatten(c.e_spec, inputs[c.nt: c.nt + c.ne])
        stager = stager_for(c.plan, terms, edata, leaves=True, drop=c.drop, **ctx.staging)
        rule = c.plan.accumulator
        final = {lo: (hi, rule.for_backward(st)) for lo, hi, st in ctx.final}
        in_deg = c.graph.in_degrees()
        rng_now = torch.get_rng_state()
        linear = c.plan.linear_edge

        def add_rows(slot: int, rows: Any, g: torch.Tensor) -> None:
            if grads[slot] is None:
                grads[slot] = torch.zeros_like(saved[slot])
            rows.add_into(grads[slot], g)

        # Backward walks columns, like forward: the gradients accumulate into whole-term
        # sinks either way, and a lazy grid builds each column's tiles once per walk.
        for col in c.grid.columns:
            for st in staged(stager, [t for t in col if t.num_edges]):
                lo, hi = st.view.dst_lo, st.view.dst_hi
                leaf_grads, param_grads = tile_gradients(
                    c.plan, st, final[lo][1], _rows(grad_out, lo, hi), in_deg[lo:hi], params,
                    linear,
                    ctx.rng[st.view.key])
                for (slot, _, rows), g in leaf_grads:
                    add_rows(slot, rows, g)
                for k, g in enumerate(param_grads):
                    slot = len(saved) + k
                    if g is not None:
                        grads[slot] = g if grads[slot] is None else grads[slot].add_(g)
            malloc_trim()
        torch.set_rng_state(rng_now)
        return (None, *grads)


def tile_gradients(plan: Plan, st: Staged, final: Any, grad: Any,
                   in_deg: torch.Tensor, params: list[torch.Tensor], linear: bool,
                   rng_state: torch.Tensor | None = None) -> tuple[list, list]:
    """Gradients of one staged tile's share of the accumulator.

    ``st.leaves`` holds ``(slot, leaf, rows)`` entries: the staged rows that want
    gradients, as fresh leaves. ``final`` is the accumulator's
    :meth:`~ngra.compiler.gather.Accumulator.final_stats` for the tile's destinations and
    ``grad`` the output gradient of those rows (a dict of them for a dict
    accumulator). A plan with a direct rule
    (``plan.tile_grads``) differentiates the tile without recomputing it; otherwise the
    tile's edge stage runs again under autograd (with the RNG state it first ran with,
    and, for a ``linear`` plan, its kernels' forward skipped).

    Returns:
        ``([(entry, gradient), ...], [gradient or None per parameter])``.
    """
    pairs = plan.tile_grads(st, final, grad)
    if pairs is not None:
        entries = {id(e[1]): e for e in st.leaves}
        return [(entries[id(x)], g) for x, g in pairs if id(x) in entries], [None] * len(params)
    if rng_state is not None:
        torch.set_rng_state(rng_state)
    skip = kernels.backward_only if linear else contextlib.nullcontext
    with torch.enable_grad(), skip():
        part = st.run(plan)
        contrib = plan.accumulator.contribution(part, final, in_deg)
    if isinstance(contrib, Mapping):
        pairs = [(contrib[k], grad[k]) for k in contrib if contrib[k].requires_grad]
    else:
        pairs = [(contrib, grad)] if contrib.requires_grad else []
    if not pairs:
        return [], [None] * len(params)
    leaves = [x for _, x, _ in st.leaves]
    gs = vjp([t for t, _ in pairs], leaves + list(params), [g for _, g in pairs],
             allow_unused=True)
    return ([(e, g) for e, g in zip(st.leaves, gs) if g is not None],
            list(gs[len(leaves):]))


# ------------------------------------------------------------- helpers
def _rows(x: Any, lo: int, hi: int) -> Any:
    """Rows ``[lo, hi)`` of a tensor or of each tensor of a dict."""
    if isinstance(x, Mapping):
        return {k: v[lo:hi] for k, v in x.items()}
    return x[lo:hi]


def _cat(cols: list[Any]) -> Any:
    if isinstance(cols[0], Mapping):
        return {k: torch.cat([c[k] for c in cols]) for k in cols[0]}
    return torch.cat(cols)
