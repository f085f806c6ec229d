"""The overlapped halo exchange: a rank computes its inner edges while its halo arrives.

A rank's in-edges split in two tiles over its ``D`` owned destinations
(:func:`build_split`): the **inner** tile, whose sources the rank owns, and the
**boundary** tile, whose sources are halo rows. Forward starts the halo exchange
asynchronously (:func:`~ngra.distributed.halo.start_exchange`: gloo's threads move
the rows), runs the inner tile's edge stage on the owned rows, waits for the halo,
runs the boundary tile, and merges the two partial states with the gather's own
combine rule (sum, mean, max, min and softmax merge tiles as a chunked column does; a
gather per field merges field by field and returns its dict of fields), then
finalizes. Backward (:class:`OverlappedPropagation`) differentiates the boundary tile
first, starts the reverse exchange of the halo rows' gradients
(:func:`~ngra.distributed.halo.start_reverse`), differentiates the inner tile
meanwhile, then waits and adds the returned gradients into the owned rows they were
sent from. Each tile is differentiated as a chunked stream does
(:func:`ngra.runtime.stream.tile_gradients`: a direct rule for softmax, else a
recomputation), so no edge-level tensor outlives its tile.

The result is the blocking halo's (:meth:`ngra.distributed.DistGraph.propagate`) to
float tolerance: the same edges, summed in two tiles instead of one. Forward sends the
blocking exchange's bytes, backward only the gradients of terms that have one (the
blocking exchange returns zeros for the others, e.g. G-GCN's raw source features); what
changes is how long the rank waits for them (:class:`~ngra.distributed.halo.ExchangeRecord`).

**Stale halos** (``--halo-staleness 1``, PipeGCN's bounded staleness; off by default,
not exact): a training step's boundary tile reads the halo rows the *previous* step
exchanged, and its owned rows receive the halo gradients the previous step sent back,
so each exchange has a whole step (and the evaluation after it) to travel
(:class:`StaleHalo`, one per layer). The first step after the start or a change of
shape waits for its own rows, exactly; an evaluation (no autograd) reads exact rows and
first settles what is still in flight, so no exchange outlives the step's evaluation,
a checkpoint or the run. A checkpoint keeps each rank's stale rows and gradients
(:meth:`~ngra.distributed.graph.DistGraph.stale_state`), and a run resumed on the same
ranks and partition reads them at its first step (:meth:`StaleHalo.restore`), so it
trains as the uninterrupted run; resumed on another partition (another process count,
method or graph) its first step is exact (:mod:`ngra.training.ranks` says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ngra import kernels
from ngra.compiler.plan import Plan
from ngra.compiler.tile import TileView
from ngra.distributed.halo import ExchangeRecord, HaloPlan, start_exchange, start_reverse
from ngra.graph import segment_ids
from ngra.idtype import narrow
from ngra.runtime.staging import Staged, flatten, plan_parameters, read_slots, unflatten
from ngra.runtime.stream import tile_gradients

__all__ = ["NotTensorAccumulator", "OverlappedPropagation", "SplitPlan", "StaleHalo",
           "build_split", "overlapped_propagate"]


class _Received:
    """Rows already here, with a :class:`~ngra.distributed.halo.PendingRows`' ``wait``."""

    def __init__(self, rows: list[torch.Tensor]) -> None:
        self.rows = rows

    def wait(self) -> list[torch.Tensor]:
        return self.rows


class StaleHalo:
    """One layer's exchanges a step late (module docs): the halo rows and the returned
    halo gradients of the last training step, in flight or arrived."""

    def __init__(self) -> None:
        self.rows: Any = None
        self.grads: Any = None

    def swap(self, which: str, pending: Any, like: list[torch.Tensor]) -> list[torch.Tensor]:
        """Keep ``pending`` (this step's exchange) for the next step and return the
        previous step's rows, or this step's own (waited now) when there are none of the
        shapes of ``like``."""
        prev = getattr(self, which)
        got = prev.wait() if prev is not None else None
        if got is not None and [(t.shape, t.dtype) for t in got] == \
                [(t.shape, t.dtype) for t in like]:
            setattr(self, which, pending)
            return got
        got = pending.wait()
        setattr(self, which, _Received(got))
        return got

    def restore(self, rows: list[torch.Tensor] | None,
                grads: list[torch.Tensor] | None) -> None:
        """Take up a checkpoint's rows and gradients (:meth:`DistGraph.stale_state
        <ngra.distributed.graph.DistGraph.stale_state>`) as the previous step's."""
        self.rows = None if rows is None else _Received(rows)
        self.grads = None if grads is None else _Received(grads)

    def settle(self) -> None:
        """Wait for whatever is still in flight (before an exact exchange, an evaluation
        or the end of the run)."""
        for which in ("rows", "grads"):
            prev = getattr(self, which)
            if prev is not None and not isinstance(prev, _Received):
                setattr(self, which, _Received(prev.wait()))


class NotTensorAccumulator(Exception):
    """The layer's accumulator is neither one tensor nor a dict of them (a gather per
    field's): the overlapped backward does not cover it, and the caller runs the blocking
    halo instead."""


@dataclass
class SplitPlan:
    """A rank's in-edges as two tiles over its owned destinations.

    Attributes:
        inner: sources owned by the rank; ``src_idx`` are owned rows ``[0, D)``.
        boundary: sources in the halo; ``src_idx`` are rows of the halo block ``[0, H)``.
        Both tiles' ``edge_ids`` are positions in the local CSC edge order.
    """

    inner: TileView
    boundary: TileView

    def to(self, device: torch.device) -> SplitPlan:
        def move(v: TileView) -> TileView:
            rev = None if v.rev is None else tuple(t.to(device) for t in v.rev)
            return TileView(v.dst_lo, v.dst_hi, v.indptr.to(device), v.src_idx.to(device),
                            v.edge_ids.to(device), rev, v.key, v.whole)

        if self.inner.indptr.device == device:
            return self
        return SplitPlan(move(self.inner), move(self.boundary))


def build_split(num_own: int, num_halo: int, indptr: torch.Tensor,
                indices: torch.Tensor) -> SplitPlan:
    """The inner and boundary tiles of a rank's local CSC (``indptr [D + 1]`` over the
    owned destinations, ``indices`` local source rows: owned ``< D``, then halo rows),
    with 32-bit arrays where they fit and each tile's reverse structure for backward."""
    d = int(num_own)
    indptr, indices = indptr.to(torch.int64), indices.to(torch.int64)
    dst = segment_ids(indptr, dtype=torch.int64)
    inner = indices < d
    views = []
    for key, mask, base, rows in ((0, inner, 0, d), (1, ~inner, d, int(num_halo))):
        pos = mask.nonzero().flatten()
        counts = torch.bincount(dst[pos], minlength=d)
        ip = torch.zeros(d + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=ip[1:])
        sidx = narrow(indices[pos] - base, max(rows - 1, 0))
        ip, pos = narrow(ip, pos.numel()), narrow(pos, indices.numel())
        views.append(TileView(0, d, ip, sidx, pos, kernels.transpose_csc(ip, sidx, rows),
                              key=(0, key)))
    return SplitPlan(views[0], views[1])


class _Context:
    __slots__ = ("plan", "halo", "split", "in_deg", "t_spec", "nt", "e_spec", "ne", "np",
                 "src", "dst", "drop", "record", "stale", "out_spec")

    def __init__(self, plan, halo, split, in_deg, t_spec, nt, e_spec, ne, np_, src, dst, drop,
                 record, stale=None):
        self.plan, self.halo, self.split, self.in_deg = plan, halo, split, in_deg
        self.t_spec, self.nt, self.e_spec, self.ne, self.np = t_spec, nt, e_spec, ne, np_
        self.src, self.dst = sorted(src), dst
        self.drop, self.record, self.stale = drop, record, stale
        self.out_spec: Any = None  # the accumulator's flatten spec (forward sets it)

    def drop_of(self, view: TileView) -> Any:
        return None if self.drop is None else self.drop.take(view.edge_ids)

    def side(self, leaves: list[Any], slots: Any) -> Any:
        return unflatten(self.t_spec, [leaves[i] if i in slots else None
                                       for i in range(self.nt)], keep=slots)


def _walk(c: _Context, t_leaves: list, e_leaves: list,
          keep: bool) -> tuple[Any, Any, dict, list]:
    """The forward: returns the accumulator, its final state, the RNG state before each
    tile (for recomputation) and the halo rows received (``[H, ...]`` per source slot)."""
    plan, acc, split = c.plan, c.plan.accumulator, c.split
    pending = start_exchange(c.halo, [t_leaves[i] for i in c.src], record=c.record)
    dst = c.side(t_leaves, c.dst)
    rng: dict[int, torch.Tensor] = {}
    state = None
    halo: list[Any] = []
    waited = []

    def arrived() -> list[Any]:  # the halo must be here now (the previous step's, when stale)
        if not waited:
            waited.append(True)
            like = [t_leaves[i] for i in c.src]
            got = pending.wait() if c.stale is None else c.stale.swap("rows", pending, [
                t.new_empty((c.halo.num_halo,) + tuple(t.shape[1:])) for t in like])
            halo.extend([None] * c.nt)
            for i, t in zip(c.src, got):
                halo[i] = t
        return halo

    for view in _views(split):
        src = c.side(t_leaves if view is split.inner else arrived(), c.src)
        edata = unflatten(c.e_spec, _tile_edges(c, e_leaves, view))
        if keep:
            rng[view.key[1]] = torch.get_rng_state()
        state = acc.combine(state, plan.edge(view, src, dst, edata, c.drop_of(view)),
                            in_place=True)
    halo = arrived()  # waited for even when no edge reads it: every rank takes part
    out = acc.finalize(state, c.in_deg, in_place=True)
    return out, state, rng, [halo[i] for i in c.src]


def _views(split: SplitPlan) -> list[TileView]:
    """The tiles to run: those with edges (a rank alone has no halo edges), or the inner
    one when neither has (the accumulator of a rank without in-edges)."""
    return [v for v in (split.inner, split.boundary) if v.num_edges] or [split.inner]


def _tile_edges(c: _Context, e_leaves: list[torch.Tensor], view: TileView) -> list:
    """The edge data leaves of tile ``view``: factored weights (``src`` and ``dst`` factors
    of the local rows, never differentiated) as the tile's source rows and the owned
    destinations' rows, no ``[E]`` array made; per-edge data gathered by the tile's edge
    positions."""
    if c.e_spec == "factors":
        src, dst = e_leaves
        d = view.num_dst
        rows = src[:d] if view is c.split.inner else src[d:]
        return [rows, dst[:d]]
    return [e.index_select(0, view.edge_ids) for e in e_leaves]


class OverlappedPropagation(torch.autograd.Function):
    """The overlapped halo's walk; backward overlaps the reverse exchange likewise."""

    @staticmethod
    def forward(ctx: Any, c: _Context, *leaves: torch.Tensor) -> torch.Tensor:
        t_leaves = list(leaves[: c.nt])
        e_leaves = list(leaves[c.nt: c.nt + c.ne])
        with torch.no_grad():
            out, state, rng, halo = _walk(c, t_leaves, e_leaves, keep=True)
        try:  # one tensor, or a gather per field's dict: one output a field
            outs, c.out_spec = flatten(out)
        except TypeError:
            raise NotTensorAccumulator(type(out).__name__) from None
        ctx.c, ctx.rng, ctx.halo = c, rng, halo
        ctx.final = c.plan.accumulator.final_stats(state, out)
        ctx.save_for_backward(*leaves[: c.nt + c.ne])
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grad_outs: torch.Tensor) -> tuple[Any, ...]:
        c: _Context = ctx.c
        grad_out = unflatten(c.out_spec, list(grad_outs))
        plan, split = c.plan, c.split
        saved = ctx.saved_tensors
        t_vals, e_vals = list(saved[: c.nt]), list(saved[c.nt:])
        params = [p for p in plan_parameters(plan) if p.requires_grad][: c.np]
        grads: list[torch.Tensor | None] = [None] * (len(saved) + len(params))
        wants = [i for i in c.src if t_vals[i].requires_grad and t_vals[i].is_floating_point()]
        linear = plan.linear_edge
        final = plan.accumulator.for_backward(ctx.final)
        rng_now = torch.get_rng_state()
        halo_rows = dict(zip(c.src, ctx.halo))

        def tile(view: TileView, src_rows: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
            """Differentiate one tile; adds its dst / edge-data / parameter gradients to
            ``grads`` and returns its source gradients by slot."""
            st = Staged(view, "halo")
            st.drop = c.drop_of(view)
            src = [None] * c.nt
            for i in c.src:
                src[i] = src_rows[i].detach().requires_grad_(i in wants)
                if i in wants:
                    st.leaves.append((("src", i), src[i], None))
            dst = [None] * c.nt
            for i in c.dst:
                dst[i] = t_vals[i].detach().requires_grad_(t_vals[i].requires_grad)
                if dst[i].requires_grad:
                    st.leaves.append((("dst", i), dst[i], None))
            edata = []
            for i, (e, rows) in enumerate(zip(e_vals, _tile_edges(c, e_vals, view))):
                rows = rows.detach().requires_grad_(e.requires_grad)
                if e.requires_grad:
                    st.leaves.append((("edata", i), rows, None))
                edata.append(rows)
            st.src = c.side(src, c.src)
            st.dst = c.side(dst, c.dst)
            st.edata = unflatten(c.e_spec, edata)
            leaf_grads, param_grads = tile_gradients(plan, st, final, grad_out, c.in_deg,
                                                     params, linear, ctx.rng[view.key[1]])
            mine: dict[int, torch.Tensor] = {}
            for ((kind, i), _, _), g in leaf_grads:
                if kind == "src":
                    mine[i] = g
                elif kind == "dst":
                    grads[i] = g if grads[i] is None else grads[i].add_(g)
                else:
                    slot = c.nt + i
                    if grads[slot] is None:
                        grads[slot] = torch.zeros_like(e_vals[i])
                    grads[slot].index_add_(0, view.edge_ids, g)
            for n, g in enumerate(param_grads):
                slot = len(saved) + n
                if g is not None:
                    grads[slot] = g if grads[slot] is None else grads[slot].add_(g)
            return mine

        # the boundary first: its halo rows' gradients travel while the inner tile runs
        views = _views(split)
        g_halo = tile(split.boundary, halo_rows) if split.boundary in views else {}
        pending = None
        if wants:
            pending = start_reverse(c.halo, [g_halo[i] if i in g_halo
                                             else torch.zeros_like(halo_rows[i])
                                             for i in wants], record=c.record)
        g_own = (tile(split.inner, {i: t_vals[i] for i in c.src}) if split.inner in views
                 else {})
        for i, g in g_own.items():
            grads[i] = g if grads[i] is None else grads[i].add_(g)
        if pending is not None:
            idx = c.halo.send_idx
            like = [t_vals[i].new_empty((idx.numel(),) + tuple(t_vals[i].shape[1:]))
                    for i in wants]
            got = pending.wait() if c.stale is None else c.stale.swap("grads", pending, like)
            for i, g in zip(wants, got):
                if grads[i] is None:
                    grads[i] = torch.zeros_like(t_vals[i])
                elif not grads[i].is_contiguous():
                    grads[i] = grads[i].contiguous()
                d, w = grads[i].shape[0], math.prod(grads[i].shape[1:])
                grads[i].view(d, w).index_add_(0, idx, g.reshape(g.shape[0], w))
        torch.set_rng_state(rng_now)
        return (None, *grads)


def overlapped_propagate(halo: HaloPlan, split: SplitPlan, plan: Plan, terms: Any,
                         edata: Any, in_deg: torch.Tensor, drop: Any = None,
                         record: ExchangeRecord | None = None,
                         stale: StaleHalo | None = None) -> Any:
    """The accumulator ``[D, ...]`` of ``plan`` over this rank's in-edges, the halo
    arriving while the inner edges compute (differentiable; see the module docstring).
    ``terms``: the owned rows of ``pre``'s terms; ``edata``: edge data in local CSC
    order, or factored weights over the local rows (not differentiable); ``drop``: a
    softmax gather's attention dropout over the local CSC edges, or ``None``; ``record``:
    where bytes and waits are added;
    ``stale``: the layer's :class:`StaleHalo` for a step one exchange late (a call
    without autograd settles it and runs exact).

    A per-field accumulator (a gather per field: a dict of tensors) comes back as that
    dict. Raises :class:`NotTensorAccumulator` after the forward walk when a differentiable
    call's accumulator is anything else: every rank runs the same layer, so every rank
    raises at the same point, and the caller may run the blocking halo instead."""
    t_leaves, t_spec = flatten(terms)
    e_leaves, e_spec = flatten(edata)
    src, dst = read_slots(plan, t_spec, len(t_leaves))
    params = [p for p in plan_parameters(plan) if p.requires_grad]
    training = torch.is_grad_enabled() and (
        bool(params) or any(t.requires_grad for t in t_leaves + e_leaves))
    if stale is not None and not training:
        stale.settle()
        stale = None
    c = _Context(plan, halo, split, in_deg, t_spec, len(t_leaves), e_spec, len(e_leaves),
                 len(params), src, dst, drop, record, stale)
    if training:
        outs = OverlappedPropagation.apply(c, *t_leaves, *e_leaves, *params)
        return unflatten(c.out_spec, list(outs))
    with torch.no_grad():
        return _walk(c, t_leaves, e_leaves, keep=False)[0]
