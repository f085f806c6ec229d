"""Chunked streaming: the column walk, tile prefetch, and recompute-in-backward.

Forward walks destination columns; within a column the tiles stream by and
their partial results merge into the column's resident accumulator. A
background thread builds the next tile's view (global ids, reverse structure)
while the current tile computes.

When the grid has more than one tile, propagation runs inside
:class:`StreamedPropagation`, a custom autograd Function: forward keeps no
edge-level tensor, and backward walks source rows, recomputing each tile's edge
stage with autograd and pulling the gradient of that tile's contribution back
to the vertex terms, edge data and parameters. Edge-level memory is therefore
O(tile), never O(E x F). The 1 x 1 grid runs the same column walk under plain
autograd (there is nothing to bound, and no recomputation is needed).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch

from ngra.graph import Graph
from ngra.runtime import probes
from ngra.runtime.tiles import Grid, TileView

__all__ = ["propagate", "run_streamed", "prefetched", "StreamedPropagation"]


def prefetched(makers: Iterable[Callable[[], TileView]], depth: int = 1) -> Iterator[TileView]:
    """Yield each maker's tile, building the next ``depth`` tiles in a background thread."""
    makers = list(makers)
    if len(makers) <= 1:
        for make in makers:
            yield make()
        return
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work() -> None:
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
            tile, exc = q.get()
            if exc is not None:
                raise exc
            yield tile
    finally:
        stop.set()
        thread.join()


def propagate(plan: Any, graph: Graph, grid: Grid, terms: Any, edata: Any,
              keep_state: bool = False) -> Any:
    """The column walk: per column, merge tile partials, then finalize.

    Returns the accumulator ``[N, ...]`` (and, with ``keep_state``, each
    column's final accumulator state and the RNG state before each tile, so that
    backward recomputes random ops such as dropout identically).
    """
    acc = plan.accumulator
    in_deg = graph.in_degrees()
    cols, states, rng = [], [], {}
    for column in grid.columns:
        state, lo, hi = None, None, None
        for tile in prefetched(column):
            lo, hi = tile.dst_lo, tile.dst_hi
            if keep_state:
                rng[tile.key] = torch.get_rng_state()
            with probes.stage("edge") as s:
                part = s.outputs(plan.edge(tile, terms, edata))
            with probes.stage("combine") as s:
                state = s.outputs(acc.combine(state, part))
        with probes.stage("finalize") as s:
            cols.append(s.outputs(acc.finalize(state, in_deg[lo:hi])))
        if keep_state:
            states.append((lo, hi, state))
    out = cols[0] if len(cols) == 1 else _cat(cols)
    return (out, states, rng) if keep_state else out


def run_streamed(plan: Any, graph: Graph, grid: Grid, terms: Any, edata: Any) -> torch.Tensor:
    """Propagate over a multi-tile ``grid`` with O(tile) edge memory in backward."""
    t_leaves, t_spec = _flatten(terms)
    e_leaves, e_spec = _flatten(edata)
    params = [p for p in plan_parameters(plan) if p.requires_grad]
    ctx = _Context(plan, graph, grid, t_spec, len(t_leaves), e_spec, len(e_leaves), len(params))
    return StreamedPropagation.apply(ctx, *t_leaves, *e_leaves, *params)


def plan_parameters(plan: Any) -> list[torch.Parameter]:
    """Parameters the plan's edge stage may read (the whole layer's, to be safe)."""
    fn = getattr(plan, "edge_parameters", None)
    if fn is not None:
        return list(fn())
    layer = getattr(plan, "layer", None)
    return list(layer.parameters()) if layer is not None else []


class _Context:
    __slots__ = ("plan", "graph", "grid", "t_spec", "nt", "e_spec", "ne", "np")

    def __init__(self, plan, graph, grid, t_spec, nt, e_spec, ne, np_):
        self.plan, self.graph, self.grid = plan, graph, grid
        self.t_spec, self.nt, self.e_spec, self.ne, self.np = t_spec, nt, e_spec, ne, np_


class StreamedPropagation(torch.autograd.Function):
    """Propagation over a tile grid; backward recomputes one tile at a time."""

    @staticmethod
    def forward(ctx: Any, c: _Context, *leaves: torch.Tensor) -> torch.Tensor:
        terms = _unflatten(c.t_spec, leaves[: c.nt])
        edata = _unflatten(c.e_spec, leaves[c.nt: c.nt + c.ne])
        with torch.no_grad():
            out, states, rng = propagate(c.plan, c.graph, c.grid, terms, edata, keep_state=True)
        if not isinstance(out, torch.Tensor):
            raise NotImplementedError(
                "chunked streaming supports tensor-valued accumulators; this layer's "
                f"apply_edge returns {type(out).__name__}. Run it without a memory budget.")
        ctx.c, ctx.rng = c, rng
        ctx.final = [(lo, hi, c.plan.accumulator.final_stats(st, out[lo:hi]))
                     for lo, hi, st in states]
        ctx.save_for_backward(*leaves[: c.nt + c.ne])
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        c: _Context = ctx.c
        saved = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in saved]
        wanted = [i for i, t in enumerate(saved) if t.requires_grad and t.is_floating_point()]
        params = [p for p in plan_parameters(c.plan) if p.requires_grad][: c.np]
        grads: list[torch.Tensor | None] = [None] * (len(saved) + len(params))
        terms = _unflatten(c.t_spec, inputs[: c.nt])
        edata = _unflatten(c.e_spec, inputs[c.nt: c.nt + c.ne])
        final = {lo: (hi, st) for lo, hi, st in ctx.final}
        targets = [inputs[i] for i in wanted] + params
        acc = c.plan.accumulator
        in_deg = c.graph.in_degrees()
        rng_now = torch.get_rng_state()
        for row in c.grid.rows:  # backward walks source rows
            for tile in prefetched(row):
                if tile.num_edges == 0:
                    continue
                lo, hi = tile.dst_lo, tile.dst_hi
                torch.set_rng_state(ctx.rng[tile.key])
                with torch.enable_grad():
                    part = c.plan.edge(tile, terms, edata)
                    contrib = acc.contribution(part, final[lo][1], in_deg[lo:hi])
                if not contrib.requires_grad:
                    continue
                gs = torch.autograd.grad(contrib, targets, grad_out[lo:hi], allow_unused=True)
                for k, g in enumerate(gs):
                    if g is None:
                        continue
                    slot = wanted[k] if k < len(wanted) else len(saved) + (k - len(wanted))
                    grads[slot] = g if grads[slot] is None else grads[slot].add_(g)
        torch.set_rng_state(rng_now)
        return (None, *grads)


# ------------------------------------------------------------- pytrees
def _flatten(x: Any) -> tuple[list[torch.Tensor], Any]:
    if x is None:
        return [], None
    if isinstance(x, torch.Tensor):
        return [x], "t"
    if isinstance(x, Mapping):
        keys = list(x)
        leaves, specs = [], []
        for k in keys:
            lv, sp = _flatten(x[k])
            leaves += lv
            specs.append((k, sp, len(lv)))
        return leaves, ("d", specs)
    if isinstance(x, (tuple, list)):
        leaves, specs = [], []
        for v in x:
            lv, sp = _flatten(v)
            leaves += lv
            specs.append((None, sp, len(lv)))
        return leaves, ("l", specs, type(x))
    raise TypeError(f"streaming: unsupported vertex/edge data of type {type(x).__name__}.")


def _unflatten(spec: Any, leaves: Any) -> Any:
    leaves = list(leaves)
    if spec is None:
        return None
    if spec == "t":
        return leaves[0]
    out, i = [], 0
    for key, sp, n in spec[1]:
        out.append((key, _unflatten(sp, leaves[i: i + n])))
        i += n
    if spec[0] == "d":
        return dict(out)
    return spec[2](v for _, v in out)


def _cat(cols: list[Any]) -> Any:
    if isinstance(cols[0], Mapping):
        return {k: torch.cat([c[k] for c in cols]) for k in cols[0]}
    return torch.cat(cols)
