"""The overlapped halo exchange: a rank computes its inner edges while its halo arrives.

A rank's in-edges split in two tiles over its ``D`` owned destinations
(:func:`build_split`): the **inner** tile, whose sources the rank owns, and the
**boundary** tile, whose sources are halo rows. Forward starts the halo exchange
asynchronously (:func:`~ngra.distributed.halo.start_exchange`: gloo's threads move
the rows), runs the inner tile's edge stage on the owned rows, waits for the halo,
runs the boundary tile, and merges the two partial states with the gather's own
combine rule (sum, mean, max, min and softmax merge tiles as a chunked column does),
then finalizes. Backward (:class:`OverlappedPropagation`) differentiates the boundary
tile first, starts the reverse exchange of the halo rows' gradients
(:func:`~ngra.distributed.halo.start_reverse`), differentiates the inner tile
meanwhile, then waits and adds the returned gradients into the owned rows they were
sent from. Each tile is differentiated as a chunked stream does
(:func:`ngra.runtime.stream.tile_gradients`: a direct rule for softmax, else a
recomputation), so no edge-level tensor outlives its tile.

The result is the blocking halo's (:meth:`ngra.distributed.DistGraph.propagate`) to
float tolerance: the same edges, summed in two tiles instead of one. The bytes are the
blocking exchange's too; what changes is how long the rank waits for them
(:class:`~ngra.distributed.halo.ExchangeRecord`).
"""

from __future__ import annotations

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

__all__ = ["NotTensorAccumulator", "OverlappedPropagation", "SplitPlan", "build_split",
           "overlapped_propagate"]


class NotTensorAccumulator(Exception):
    """The layer's accumulator is not one tensor (a dict of fields): the overlapped
    backward does not cover it, and the caller runs the blocking halo instead."""


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
                 "src", "dst", "drop", "record")

    def __init__(self, plan, halo, split, in_deg, t_spec, nt, e_spec, ne, np_, src, dst, drop,
                 record):
        self.plan, self.halo, self.split, self.in_deg = plan, halo, split, in_deg
        self.t_spec, self.nt, self.e_spec, self.ne, self.np = t_spec, nt, e_spec, ne, np_
        self.src, self.dst = sorted(src), dst
        self.drop, self.record = drop, record

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
    for view in (split.inner, split.boundary):
        if view is split.inner:
            src = c.side(t_leaves, c.src)
        else:  # the halo must be here now
            halo = [None] * c.nt
            for i, t in zip(c.src, pending.wait()):
                halo[i] = t
            src = c.side(halo, c.src)
        edata = unflatten(c.e_spec, _tile_edges(c, e_leaves, view))
        if keep:
            rng[view.key[1]] = torch.get_rng_state()
        state = acc.combine(state, plan.edge(view, src, dst, edata, c.drop_of(view)),
                            in_place=True)
    out = acc.finalize(state, c.in_deg, in_place=True)
    return out, state, rng, [halo[i] for i in c.src]


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
        if not isinstance(out, torch.Tensor):
            raise NotTensorAccumulator(type(out).__name__)
        ctx.c, ctx.rng, ctx.halo = c, rng, halo
        ctx.final = c.plan.accumulator.final_stats(state, out)
        ctx.save_for_backward(*leaves[: c.nt + c.ne])
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        c: _Context = ctx.c
        plan, split = c.plan, c.split
        saved = ctx.saved_tensors
        t_vals, e_vals = list(saved[: c.nt]), list(saved[c.nt:])
        params = [p for p in plan_parameters(plan) if p.requires_grad][: c.np]
        grads: list[torch.Tensor | None] = [None] * (len(saved) + len(params))
        wants = [i for i in c.src if t_vals[i].requires_grad and t_vals[i].is_floating_point()]
        linear = plan.linear_edge
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
            leaf_grads, param_grads = tile_gradients(plan, st, ctx.final, grad_out, c.in_deg,
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
        g_halo = tile(split.boundary, halo_rows)
        pending = None
        if wants:
            pending = start_reverse(c.halo, [g_halo[i] if i in g_halo
                                             else torch.zeros_like(halo_rows[i])
                                             for i in wants], record=c.record)
        g_own = tile(split.inner, {i: t_vals[i] for i in c.src})
        for i, g in g_own.items():
            grads[i] = g if grads[i] is None else grads[i].add_(g)
        if pending is not None:
            idx = c.halo.send_idx
            for i, g in zip(wants, pending.wait()):
                if grads[i] is None:
                    grads[i] = torch.zeros_like(t_vals[i])
                elif not grads[i].is_contiguous():
                    grads[i] = grads[i].contiguous()
                d = grads[i].shape[0]
                grads[i].reshape(d, -1).index_add_(0, idx, g.reshape(g.shape[0], -1))
        torch.set_rng_state(rng_now)
        return (None, *grads)


def overlapped_propagate(halo: HaloPlan, split: SplitPlan, plan: Plan, terms: Any,
                         edata: Any, in_deg: torch.Tensor, drop: Any = None,
                         record: ExchangeRecord | None = None) -> Any:
    """The accumulator ``[D, ...]`` of ``plan`` over this rank's in-edges, the halo
    arriving while the inner edges compute (differentiable; see the module docstring).
    ``terms``: the owned rows of ``pre``'s terms; ``edata``: edge data in local CSC
    order, or factored weights over the local rows (not differentiable); ``drop``: a softmax gather's attention dropout over
    the local CSC edges, or ``None``; ``record``: where bytes and waits are added.

    Raises :class:`NotTensorAccumulator` after the forward walk when a differentiable
    call's accumulator is a dict of fields: every rank runs the same layer, so every rank
    raises at the same point, and the caller may run the blocking halo instead."""
    t_leaves, t_spec = flatten(terms)
    e_leaves, e_spec = flatten(edata)
    src, dst = read_slots(plan, t_spec, len(t_leaves))
    params = [p for p in plan_parameters(plan) if p.requires_grad]
    c = _Context(plan, halo, split, in_deg, t_spec, len(t_leaves), e_spec, len(e_leaves),
                 len(params), src, dst, drop, record)
    if torch.is_grad_enabled() and (params or any(t.requires_grad for t in t_leaves + e_leaves)):
        return OverlappedPropagation.apply(c, *t_leaves, *e_leaves, *params)
    with torch.no_grad():
        return _walk(c, t_leaves, e_leaves, keep=False)[0]
