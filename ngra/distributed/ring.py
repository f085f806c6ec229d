"""Ring streaming (NGra's chain streaming): source chunks passed rank to rank.

Rank ``r`` walks ``K`` steps. At step ``s`` it holds the source chunk of rank
``j = (r - s) mod K`` (every owned row of ``j``, of each term the edge stage reads on the
source side) and runs the edge stage of its tile ``j``: its owned destinations x the
sources owned by ``j`` (:class:`RingPlan`), merging the partial into its accumulator
(the same partial / combine / finalize as a tile column). Meanwhile the chunk it holds
is already on its way to rank ``r + 1`` and the next one is arriving from ``r - 1``
(async send/recv), so the transfer overlaps the tile's compute.

Backward (:class:`RingPropagation`) walks the ring again: the chunks travel as in
forward, and each chunk's gradient travels with it. The rank holding chunk ``j`` adds
its tile's source gradient to what the previous holders accumulated and passes the sum
on; after ``K`` hops the sum is back at ``j``. Destination, edge-data and parameter
gradients stay local. Each tile is differentiated as in chunked streaming
(:func:`ngra.runtime.stream.tile_gradients`: a direct rule for softmax, else a
recomputation), so no edge-level tensor outlives its tile.

Bytes a rank sends per layer: forward ``(K - 1)`` chunks; backward ``K - 1`` chunks
and ``K`` chunk gradients. More than a halo exchange moves when the halo is small, but
overlapped with compute; the cost model (:mod:`ngra.distributed.cost`) chooses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import time

import torch
import torch.distributed as dist

from ngra import kernels
from ngra.compiler.plan import Plan
from ngra.compiler.tile import TileView
from ngra.distributed.halo import ExchangeRecord, Traffic
from ngra.graph import segment_ids
from ngra.idtype import narrow
from ngra.runtime.staging import Staged, flatten, plan_parameters, read_slots, unflatten
from ngra.runtime.stream import tile_gradients

__all__ = ["RingPlan", "build_ring", "ring_propagate"]

_GRAD_TAG = 1 << 10


@dataclass
class RingPlan:
    """One rank's side of the ring.

    Attributes:
        rank, world_size: this rank and ``K``. group: the process group.
        chunk_rows: ``[K]`` owned rows of each rank (the size of its chunk).
        views: ``[K]`` tile ``j``: owned destinations x sources owned by ``j``, source ids
            local to ``j``'s chunk, ``edge_ids`` the tile's positions in the local CSC.
        traffic: where sent bytes are counted.
    """

    rank: int
    world_size: int
    group: Any
    chunk_rows: list[int]
    views: list[TileView]
    traffic: Traffic

    def to(self, device: torch.device) -> RingPlan:
        """The tiles' index arrays on ``device``."""
        def move(v: TileView) -> TileView:
            rev = None if v.rev is None else tuple(t.to(device) for t in v.rev)
            return TileView(v.dst_lo, v.dst_hi, v.indptr.to(device), v.src_idx.to(device),
                            v.edge_ids.to(device), rev, v.key, v.whole)

        views = self.views if device.type == "cpu" else [move(v) for v in self.views]
        return RingPlan(self.rank, self.world_size, self.group, self.chunk_rows, views,
                        self.traffic)


def build_ring(rank: int, world_size: int, num_own: int, indptr: torch.Tensor,
               indices: torch.Tensor, halo: torch.Tensor, bounds: torch.Tensor, group: Any,
               traffic: Traffic) -> RingPlan:
    """The ring tiles of a rank from its local CSC (``indptr [D + 1]`` over the owned
    destinations, ``indices`` local source rows: owned ``< D``, then halo rows), its halo
    (new ids) and the ranks' destination ranges ``bounds [K + 1]`` (new ids).

    Lean: per-edge work goes through ``[D + H]`` row tables (each local row's owner and
    row in the owner's chunk), and every tile array is 32-bit where it fits, so a rank's
    tiles cost about 16 bytes an edge (sources, positions, and the reverse for backward)."""
    bounds = bounds.to(torch.int64)
    d, lo = num_own, int(bounds[rank])
    gid = torch.cat([torch.arange(lo, lo + d, dtype=torch.int64), halo.to(torch.int64)])
    row_owner = torch.searchsorted(bounds, gid, right=True) - 1  # [D + H] owner of each row
    row_chunk = gid - bounds[row_owner]  # [D + H] its row in the owner's chunk
    del gid
    owner = row_owner.to(torch.int32)[indices]  # [E]
    dst = segment_ids(indptr, dtype=torch.int32)  # [E] destination of each edge
    views = []
    for j in range(world_size):
        pos = (owner == j).nonzero().flatten()
        counts = torch.bincount(dst[pos], minlength=d)
        ip = torch.zeros(d + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=ip[1:])
        rows = int(bounds[j + 1] - bounds[j])
        sidx = narrow(row_chunk[indices[pos]], max(rows - 1, 0))
        ip, pos = narrow(ip, pos.numel()), narrow(pos, indices.numel())
        views.append(TileView(0, d, ip, sidx, pos, kernels.transpose_csc(ip, sidx, rows),
                              key=(0, j)))
    chunk_rows = (bounds[1:] - bounds[:-1]).tolist()
    return RingPlan(rank, world_size, group, chunk_rows, views, traffic)


def _shift(ring: RingPlan, tensors: dict[int, torch.Tensor], rows: int, tag: int = 0,
           record: ExchangeRecord | None = None,
           phase: str = "forward") -> tuple[dict[int, torch.Tensor], list[Any]]:
    """Send ``tensors`` to the next rank and receive same-shaped ones of ``rows`` rows
    from the previous rank (async; wait on the returned requests); the bytes sent are
    added to ``record`` too."""
    k, r = ring.world_size, ring.rank
    if k == 1:  # a ring of one: the next rank is this one (gloo cannot send to itself)
        return {i: t.contiguous() for i, t in tensors.items()}, []
    nxt, prev = (r + 1) % k, (r - 1) % k
    if ring.group is not None:  # p2p names global ranks; the ring's are its group's
        nxt, prev = dist.get_global_rank(ring.group, nxt), dist.get_global_rank(ring.group, prev)
    out, reqs = {}, []
    for i in sorted(tensors):
        t = tensors[i].contiguous()
        buf = t.new_empty((rows,) + tuple(t.shape[1:]))
        reqs.append(dist.isend(t, nxt, group=ring.group, tag=tag + i))
        reqs.append(dist.irecv(buf, prev, group=ring.group, tag=tag + i))
        ring.traffic.add("ring", t.numel() * t.element_size())
        if record is not None:
            record.add(phase, t.numel() * t.element_size(), 0.0)
        out[i] = buf
    return out, reqs


def _wait(reqs: list[Any], record: ExchangeRecord | None = None,
          phase: str = "forward") -> None:
    t0 = time.perf_counter()
    for q in reqs:
        q.wait()
    if record is not None and reqs:
        record.add(phase, 0, time.perf_counter() - t0)


class _Context:
    __slots__ = ("ring", "plan", "in_deg", "t_spec", "nt", "e_spec", "ne", "np", "src", "dst",
                 "drop", "record", "out_spec")

    def __init__(self, ring, plan, in_deg, t_spec, nt, e_spec, ne, np_, src, dst, drop,
                 record=None):
        self.ring, self.plan, self.in_deg = ring, plan, in_deg
        self.t_spec, self.nt, self.e_spec, self.ne, self.np = t_spec, nt, e_spec, ne, np_
        self.src, self.dst, self.drop = src, dst, drop
        self.record = record
        self.out_spec: Any = None  # the accumulator's flatten spec (forward sets it)

    def drop_of(self, view: TileView) -> Any:
        """The attention dropout on tile ``view``'s edges (its counters), or ``None``."""
        return None if self.drop is None else self.drop.take(view.edge_ids)


def _walk(c: _Context, t_leaves: list, e_leaves: list, keep: bool) -> tuple[Any, Any, dict]:
    """The forward ring: returns the accumulator, its final state and the RNG state
    before each tile (for recomputation)."""
    ring, plan, acc = c.ring, c.plan, c.plan.accumulator
    k, r = ring.world_size, ring.rank
    dst = unflatten(c.t_spec, [t_leaves[i] if i in c.dst else None for i in range(c.nt)],
                    keep=c.dst)
    cur = {i: t_leaves[i] for i in c.src}
    state, rng = None, {}
    for s in range(k):
        j = (r - s) % k
        reqs: list[Any] = []
        if s < k - 1:
            nxt, reqs = _shift(ring, cur, ring.chunk_rows[(j - 1) % k], record=c.record)
        view = ring.views[j]
        src = unflatten(c.t_spec, [cur.get(i) for i in range(c.nt)], keep=c.src)
        edata = unflatten(c.e_spec, [e.index_select(0, view.edge_ids) for e in e_leaves])
        if keep:
            rng[j] = torch.get_rng_state()
        # no_grad: the partials are this walk's own, merged in place
        state = acc.combine(state, plan.edge(view, src, dst, edata, c.drop_of(view)),
                            in_place=True)
        _wait(reqs, c.record)
        if s < k - 1:
            cur = nxt
    out = acc.finalize(state, c.in_deg, in_place=True)
    return out, state, rng


class RingPropagation(torch.autograd.Function):
    """The ring walk; backward walks it again with each chunk's gradient travelling along."""

    @staticmethod
    def forward(ctx: Any, c: _Context, *leaves: torch.Tensor) -> torch.Tensor:
        t_leaves = list(leaves[: c.nt])
        e_leaves = list(leaves[c.nt: c.nt + c.ne])
        with torch.no_grad():
            out, state, rng = _walk(c, t_leaves, e_leaves, keep=True)
        try:  # one tensor, or a gather per field's dict: one output a field
            outs, c.out_spec = flatten(out)
        except TypeError:
            raise NotImplementedError(
                "ring streaming supports accumulators of one tensor or a dict of tensors; "
                f"this layer's gather makes {type(out).__name__}. Use the halo exchange "
                "(--exchange halo).") from None
        ctx.c, ctx.rng = c, rng
        ctx.final = c.plan.accumulator.final_stats(state, out)
        ctx.save_for_backward(*leaves[: c.nt + c.ne])
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grad_outs: torch.Tensor) -> tuple[Any, ...]:
        c: _Context = ctx.c
        grad_out = unflatten(c.out_spec, list(grad_outs))
        ring, plan = c.ring, c.plan
        k, r = ring.world_size, ring.rank
        saved = ctx.saved_tensors
        t_vals, e_vals = list(saved[: c.nt]), list(saved[c.nt:])
        params = [p for p in plan_parameters(plan) if p.requires_grad][: c.np]
        grads: list[torch.Tensor | None] = [None] * (len(saved) + len(params))
        wants = {i for i in c.src if saved[i].requires_grad}  # chunk slots with a gradient
        linear = plan.linear_edge
        final = plan.accumulator.for_backward(ctx.final)
        rng_now = torch.get_rng_state()
        cur = {i: t_vals[i] for i in c.src}
        g_reqs: list[Any] = []
        g_in: dict[int, torch.Tensor] = {}
        for s in range(k):
            j = (r - s) % k
            v_reqs: list[Any] = []
            if s < k - 1:
                nxt, v_reqs = _shift(ring, cur, ring.chunk_rows[(j - 1) % k],
                                     record=c.record, phase="backward")
            view = ring.views[j]
            st = Staged(view, "ring")
            st.drop = c.drop_of(view)
            src = [None] * c.nt
            for i in c.src:
                src[i] = cur[i].detach().requires_grad_(i in wants)
                if i in wants:
                    st.leaves.append((("src", i), src[i], None))
            dst = [None] * c.nt
            for i in c.dst:
                dst[i] = t_vals[i].detach().requires_grad_(t_vals[i].requires_grad)
                if dst[i].requires_grad:
                    st.leaves.append((("dst", i), dst[i], None))
            edata = []
            for i, e in enumerate(e_vals):
                rows = e.index_select(0, view.edge_ids).requires_grad_(e.requires_grad)
                if e.requires_grad:
                    st.leaves.append((("edata", i), rows, None))
                edata.append(rows)
            st.src = unflatten(c.t_spec, src, keep=c.src)
            st.dst = unflatten(c.t_spec, dst, keep=c.dst)
            st.edata = unflatten(c.e_spec, edata)
            leaf_grads, param_grads = tile_gradients(plan, st, final, grad_out, c.in_deg,
                                                     params, linear, ctx.rng[j])
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
            if wants:
                _wait(g_reqs, c.record, "backward")
                total = {}
                for i in wants:
                    g = mine.get(i)
                    if g is None:
                        g = torch.zeros_like(cur[i])
                    total[i] = g if i not in g_in else g_in[i].add_(g)
                g_in, g_reqs = _shift(ring, total, ring.chunk_rows[(j - 1) % k], _GRAD_TAG,
                                      c.record, "backward")
            _wait(v_reqs, c.record, "backward")
            if s < k - 1:
                cur = nxt
        # the last hop brings each rank its own chunk's whole gradient
        _wait(g_reqs, c.record, "backward")
        for i in wants:
            grads[i] = g_in[i] if grads[i] is None else grads[i].add_(g_in[i])
        torch.set_rng_state(rng_now)
        return (None, *grads)


def ring_propagate(ring: RingPlan, plan: Plan, terms: Any, edata: Any,
                   in_deg: torch.Tensor, drop: Any = None, *,
                   record: ExchangeRecord | None = None) -> Any:
    """The accumulator ``[D, ...]`` of ``plan`` over this rank's in-edges, streaming the
    source chunks around the ring (differentiable; see the module docstring). ``drop``: a
    softmax gather's attention dropout over the local CSC edges (each tile takes its
    edges' counters), or ``None``; ``record``: where the bytes sent and the seconds
    blocked waiting for a hop are added."""
    t_leaves, t_spec = flatten(terms)
    e_leaves, e_spec = flatten(edata)
    src, dst = read_slots(plan, t_spec, len(t_leaves))
    params = [p for p in plan_parameters(plan) if p.requires_grad]
    c = _Context(ring, plan, in_deg, t_spec, len(t_leaves), e_spec, len(e_leaves),
                 len(params), src, dst, drop, record)
    if torch.is_grad_enabled() and (params or any(t.requires_grad for t in t_leaves + e_leaves)):
        outs = RingPropagation.apply(c, *t_leaves, *e_leaves, *params)
        return unflatten(c.out_spec, list(outs))
    with torch.no_grad():
        return _walk(c, t_leaves, e_leaves, keep=False)[0]
