"""Out-of-device-memory layers: vertex data in host memory, every stage on the device.

Inside :func:`ngra.runtime.device_schedule.device_streaming` a SAGA layer whose input
lives in host memory runs as :class:`StreamedLayer`, an autograd Function over a
:class:`~ngra.runtime.device_schedule.Schedule` of ``k`` vertex intervals
(NGra's chunk streaming; HongTu's host-resident vertex data). Copies go through a
:class:`~ngra.runtime.transfer.Link` (host-to-device on one side stream, device-to-host on
another), so a chunk arrives while the previous one computes and a finished column
leaves while the next one computes.

Forward:

1. **pre**, a row chunk at a time: the chunk of the input arrives, the layer's input
   dropout and vertex-side stage run on it, and its terms either stay on the device
   (the schedule keeps every chunk) or go back to page-locked host memory.
2. **columns**: column ``c``'s accumulator stays on the device while its tiles stream
   by; tile ``(c, q)`` reads source chunk ``q``, taken from the device when an earlier
   tile left it there (the schedule's LRU of ``cache`` chunks; columns walk the chunks in
   a zigzag so each starts with the ones the last one ended with), else copied in. Then
   the column's ``apply_vertex`` (and the activation the model applies next, handed in
   as ``activation``) runs on the device and the output, with the gathered value that
   backward needs, returns to host memory.

Backward mirrors it:

1. per **column**: the output gradient and the saved value arrive, ``apply_vertex``
   (and the activation) are differentiated, and the gathered value's gradient returns to
   the host;
2. per **source chunk** (NGra's row-major backward): the chunk's input arrives and its
   ``pre`` is recomputed under autograd; every tile of the chunk's row differentiates its
   share of the destinations' gradients (:func:`ngra.runtime.stream.tile_gradients`: a
   fused softmax's direct rule, else a recomputed edge stage), accumulating the chunk's
   term gradients on the device; then ``pre``'s backward gives the chunk's input
   gradient, which returns to the host. A layer whose edge stage differentiates
   destination terms too (GAT's destination scores) keeps their gradient on the device
   until every row is done, and runs ``pre``'s backward in a third pass.

Parameters, their gradients and optimizer state live on the device; only vertex arrays
travel. The input dropout draws one mask for the whole input with counter-based hashing
by global row (:func:`ngra.kernels.dropout_rows`), replayed wherever a chunk is
recomputed; an attention dropout hashes each edge's counter, so every schedule draws the
masks the resident layer would.
"""

from __future__ import annotations

import collections
import weakref
from typing import Any

import torch
from torch.profiler import record_function

from ngra import kernels
from ngra.compiler.plan import Plan
from ngra.compiler.tile import TileView
from ngra.graph import EdgeFactors, Graph
from ngra.kernels.checks import vouch
from ngra.kernels.dropout import EdgeDropout, seed_device
from ngra.kernels.lean import vjp
from ngra.runtime.budget import row_bytes
from ngra.runtime.device_schedule import (
    RowBytes,
    Schedule,
    StreamingSettings,
    choose_schedule,
    host_tiles,
    streaming_settings,
)
from ngra.runtime.staging import Staged, flatten, plan_parameters, read_slots, unflatten
from ngra.runtime.stream import tile_gradients
from ngra.runtime.transfer import Link, pinned, pinned_empty

__all__ = ["StreamedLayer", "last_schedule", "run_streamed_layer", "schedule_for",
           "settings_for", "wants_streaming"]


def settings_for(plan: Plan) -> StreamingSettings | None:
    """The device streaming in force for ``plan``: the active
    :func:`~ngra.runtime.device_schedule.device_streaming` block's, else, for a layer
    whose parameters all live on one CUDA device, streaming through that device within
    its free memory (a model moved to the GPU with its data left in host memory)."""
    st = streaming_settings()
    if st is not None:
        return st
    devices = {p.device for p in plan.layer.parameters()}
    if len(devices) == 1 and next(iter(devices)).type == "cuda":
        return StreamingSettings(next(iter(devices)), None, None, None)
    return None


def wants_streaming(plan: Plan, graph: Any, x: Any) -> bool:
    """Whether a layer call of ``plan`` on ``graph`` with input ``x`` streams through a
    device (:func:`settings_for`): the graph is a whole :class:`~ngra.Graph` and ``x``
    lives in host memory."""
    if not isinstance(graph, Graph) or settings_for(plan) is None:
        return False
    leaves, _ = flatten(x)
    return bool(leaves) and all(t.device.type == "cpu" for t in leaves)


def _get_rng(device: torch.device) -> tuple:
    """The generators' states a dropout's seeds come from: the CPU's, and the CUDA
    device's (the gpu kernels draw their seeds there, :func:`ngra.kernels.dropout`)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng(device: torch.device, state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class _Degrees:
    """What ``post`` reads of the graph for one column: its in-degrees."""

    __slots__ = ("_deg",)

    def __init__(self, deg: torch.Tensor) -> None:
        self._deg = deg

    def in_degrees(self) -> torch.Tensor:
        return self._deg


def _layer_params(plan: Plan) -> list[torch.Tensor]:
    return [p for p in plan.layer.parameters() if p.requires_grad]


class _Call:
    """One layer call's schedule, host arrays and device-side state."""

    def __init__(self, plan: Plan, graph: Graph, x: Any, edata: Any, dropout: float,
                 drop: EdgeDropout | None, activation: Any, schedule: Schedule) -> None:
        self.plan, self.graph, self.s = plan, graph, schedule
        self.device = schedule.device
        self.link = Link(self.device)
        self.tiles = host_tiles(graph, schedule.bounds, self.device)
        self.p, self.drop, self.act = dropout, drop, activation
        self.b = schedule.bounds
        self.x_leaves, self.x_spec = flatten(x)
        # pinned() remembers the copy per tensor: pin x itself, not a fresh detached view
        # (a view dies with the call, and the features were copied again every step)
        self.x_host = [pinned(t, self.device).detach() for t in self.x_leaves]
        self.x_grad = [t.requires_grad for t in self.x_leaves]
        self.e_leaves, self.e_spec = flatten(edata)
        for t in self.e_leaves:
            if t.requires_grad:
                raise ValueError("device streaming takes edge data that needs no gradient; "
                                 "this layer's edge data requires grad. Train it resident "
                                 "(without a memory budget) or on the CPU.")
        self.params = _layer_params(plan)
        self.reads_x = plan.post_reads_x()
        self.linear = plan.linear_edge
        self.rng: dict[tuple[int, int], torch.Tensor] = {}
        self.drop_seeds: tuple | None = None
        self._inflight: collections.deque = collections.deque()

    # ------------------------------------------------------------ small pieces
    def rows(self, r: int) -> tuple[int, int]:
        return self.b[r], self.b[r + 1]

    def pace(self) -> None:
        """Keep the host at most two tiles ahead of the device (each queued copy holds
        device memory until its kernels ran)."""
        if not self.link.cuda:
            return
        self._inflight.append(torch.cuda.current_stream(self.device).record_event())
        if len(self._inflight) > 2:
            self._inflight.popleft().synchronize()

    def x_chunk(self, r: int, grad: bool = False) -> tuple[list[torch.Tensor], Any]:
        """Row chunk ``r`` of the input on the device: ``(raw leaves, dropped input)``;
        with ``grad`` the raw leaves require grad where the input does."""
        lo, hi = self.rows(r)
        raw = self.link.h2d(*[t[lo:hi] for t in self.x_host]).ready()
        if grad:
            raw = [t.requires_grad_(g) for t, g in zip(raw, self.x_grad)]
        if not self.p:
            return raw, unflatten(self.x_spec, raw)
        _set_rng(self.device, self.rng0)  # every chunk draws the layer's one pair of seeds
        ids = torch.arange(lo, hi, device=self.device)
        with kernels.dropout_rows(ids):
            dropped = [kernels.dropout(t, self.p) for t in raw]
        return raw, unflatten(self.x_spec, dropped)

    def pre(self, xd: Any) -> list[torch.Tensor]:
        # pre's carry is dropped: here pre and post run on different chunks
        terms = self.plan.pre(xd).terms
        leaves, spec = flatten(terms)
        self.t_spec = spec
        return leaves

    def view(self, c: int, q: int, backward: bool = False) -> TileView:
        a = self.tiles.arrays[(c, q)]
        names = ("indptr", "src", "rev_ptr", "rev_idx", "rev_perm") if backward else \
            ("indptr", "src")
        got = self.link.h2d(*[a[n] for n in names]).ready()
        lo, hi = self.rows(c)
        s_lo, s_hi = self.rows(q)
        e = got[1].numel()
        vouch(got[0], ("indptr", e))
        vouch(got[1], ("range", s_hi - s_lo))
        rev = None
        if backward:
            vouch(got[2], ("indptr", e))
            vouch(got[3], ("range", hi - lo))
            vouch(got[4], ("range", e))
            rev = (got[2], got[3], got[4])
        return TileView(lo, hi, got[0], got[1], None, rev, key=(c, q))

    def empty_view(self, c: int) -> TileView:
        lo, hi = self.rows(c)
        z = torch.zeros(hi - lo + 1, dtype=torch.int32, device=self.device)
        return TileView(lo, hi, z, torch.zeros(0, dtype=torch.int32, device=self.device),
                        None, key=(c, -1))

    def edata(self, c: int, q: int) -> Any:
        if self.e_spec is None:
            return None
        if self.e_spec == "factors":
            s_lo, s_hi = self.rows(q)
            lo, hi = self.rows(c)
            return EdgeFactors(self.factors[0][s_lo:s_hi], self.factors[1][lo:hi])
        per_tile = [self.tiles.gathered(f"edata{j}", t, self.device)[(c, q)]
                    for j, t in enumerate(self.e_leaves)]
        return unflatten(self.e_spec, self.link.h2d(*per_tile).ready())

    def tile_drop(self, c: int, q: int) -> EdgeDropout | None:
        d = self.drop
        if d is None:
            return None
        if d.counter is None:
            counters = self.tiles.edge_counters(self.device)[(c, q)]
        else:
            counters = self.tiles.gathered("counter", d.counter, self.device)[(c, q)]
        (dev,) = self.link.h2d(counters).ready()
        if self.drop_seeds is None:  # the kernels on the device take their seeds there
            where = seed_device(self.device, "softmax_aggregate_fwd")
            self.drop_seeds = tuple(
                s if where is None or isinstance(s, torch.Tensor) else
                torch.tensor(int(s), dtype=torch.int64, device=where) for s in (d.s1, d.s2))
        return EdgeDropout(d.p, dev, *self.drop_seeds)

    def degrees(self, c: int) -> torch.Tensor:
        lo, hi = self.rows(c)
        return self.in_deg[lo:hi]

    def post(self, xd: Any, acc: torch.Tensor, c: int) -> torch.Tensor:
        out = self.plan.post(xd if self.reads_x else None, acc, _Degrees(self.degrees(c)))
        if not isinstance(out, torch.Tensor):
            raise NotImplementedError(
                "device streaming supports layers whose apply_vertex returns a tensor; "
                f"this one returns {type(out).__name__}.")
        return out if self.act is None else self.act(out)

    def setup(self) -> None:
        """What every stage reads whole: in-degrees and per-vertex edge factors."""
        # page-locked, made once per array: a pageable copy would make the host wait
        deg = self.graph.cached(f"ngra.pinned-in-degrees-{self.device.type}",
                                lambda: pinned(self.graph.in_degrees(), self.device))
        factors = self.e_leaves if self.e_spec == "factors" else []
        got = self.link.h2d(deg, *[pinned(t, self.device) for t in factors]).ready()
        self.in_deg = got[0]
        self.factors = got[1:]


class _Chunks:
    """Source chunks on the device: every chunk (resident terms), or an LRU of
    ``cache`` chunks copied in from the host terms."""

    def __init__(self, call: _Call, slots: list[int]) -> None:
        self.call, self.slots = call, slots
        self.resident: dict[int, list[torch.Tensor]] = {}
        self.lru: collections.OrderedDict = collections.OrderedDict()
        self.host: dict[int, torch.Tensor] = {}
        self.fetches = self.reuses = 0

    def get(self, q: int) -> dict[int, torch.Tensor]:
        c = self.call
        if c.s.resident_terms:
            self.reuses += 1
            return self.resident[q]
        if q in self.lru:
            self.lru.move_to_end(q)
            self.reuses += 1
            return self.lru[q]
        lo, hi = c.rows(q)
        got = c.link.h2d(*[self.host[s][lo:hi] for s in self.slots]).ready()
        self.fetches += 1
        self.lru[q] = dict(zip(self.slots, got))
        if len(self.lru) > c.s.cache:
            self.lru.popitem(last=False)
        return self.lru[q]


def _tree(spec: Any, chunk: dict[int, torch.Tensor], slots: frozenset[int], n: int) -> Any:
    return unflatten(spec, [chunk.get(i) for i in range(n)], keep=slots)


def _final(name: str, acc: torch.Tensor, lse: torch.Tensor | None) -> Any:
    if name in ("sum", "mean"):
        return None
    if name == "softmax":
        return lse, acc
    return acc


class StreamedLayer(torch.autograd.Function):
    """One layer call streamed through the device (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, call: _Call, *inputs: torch.Tensor) -> torch.Tensor:
        c, link, k = call, call.link, call.s.k
        c.setup()
        acc_rule = c.plan.accumulator
        c.rng0 = _get_rng(c.device)
        # 1. pre, a row chunk at a time
        chunks: _Chunks | None = None
        dst_host: dict[int, torch.Tensor] = {}
        with record_function("ngra.stream.forward.pre"):
            for r in range(k):
                lo, hi = c.rows(r)
                _, xd = c.x_chunk(r)
                if r == 0:
                    rng_after = _get_rng(c.device)
                leaves = c.pre(xd)
                if chunks is None:
                    src_slots, dst_slots = read_slots(c.plan, c.t_spec, len(leaves))
                    c.src_slots, c.dst_slots, c.nt = src_slots, dst_slots, len(leaves)
                    chunks = _Chunks(c, sorted(src_slots | dst_slots))
                    n = c.graph.num_nodes
                    for s in chunks.slots:
                        shape = (n,) + tuple(leaves[s].shape[1:])
                        if not c.s.resident_terms:
                            chunks.host[s] = pinned_empty(shape, leaves[s].dtype, c.device)
                        if s in dst_slots:
                            dst_host[s] = pinned_empty(shape, leaves[s].dtype, c.device)
                for s in chunks.slots:
                    if c.s.resident_terms:
                        chunks.resident.setdefault(r, {})[s] = leaves[s]
                    else:
                        link.d2h(leaves[s], chunks.host[s][lo:hi])
                    if s in c.dst_slots:
                        link.d2h(leaves[s], dst_host[s][lo:hi])
                c.pace()
            if k and c.p:
                _set_rng(c.device, rng_after)  # as after one draw of the input dropout
            link.fence()  # the host terms are written before a column copies them back
        # 2. columns
        with record_function("ngra.stream.forward.columns"):
            out_host = acc_host = lse_host = None
            for col in range(k):
                lo, hi = c.rows(col)
                dst = _tree(c.t_spec, chunks.get(col), c.dst_slots, c.nt)
                state = None
                for q in c.s.order(col):
                    src = _tree(c.t_spec, chunks.get(q), c.src_slots, c.nt)
                    view = c.view(col, q)
                    c.rng[(col, q)] = torch.get_rng_state()
                    part = c.plan.edge(view, src, dst, c.edata(col, q), c.tile_drop(col, q))
                    state = acc_rule.combine(state, part, in_place=True)
                    c.pace()
                if state is None:  # no edges into this column: an empty tile shapes its state
                    src = _tree(c.t_spec, chunks.get(col), c.src_slots, c.nt)
                    state = c.plan.edge(c.empty_view(col), src, dst, None, None)
                acc = acc_rule.finalize(state, c.degrees(col), in_place=True)
                if not isinstance(acc, torch.Tensor):
                    raise NotImplementedError(
                        "device streaming supports tensor-valued accumulators; this layer's "
                        f"apply_edge returns {type(acc).__name__}. Train it resident.")
                final = acc_rule.final_stats(state, acc)
                xd = c.x_chunk(col)[1] if c.reads_x else None
                out = c.post(xd, acc, col)
                if out_host is None:
                    n = c.graph.num_nodes
                    out_host = pinned_empty((n,) + tuple(out.shape[1:]), out.dtype, c.device)
                    acc_host = pinned_empty((n,) + tuple(acc.shape[1:]), acc.dtype, c.device)
                    if acc_rule.name == "softmax":
                        lse_host = pinned_empty((n,) + tuple(final[0].shape[1:]), final[0].dtype,
                                                c.device)
                link.d2h(out, out_host[lo:hi])
                link.d2h(acc, acc_host[lo:hi])
                if lse_host is not None:
                    link.d2h(final[0].contiguous(), lse_host[lo:hi])
                c.pace()
            link.drain()
        c.acc_host, c.lse_host, c.dst_host = acc_host, lse_host, dst_host
        ctx.call = c
        return out_host

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        c: _Call = ctx.call
        link, k, name = c.link, c.s.k, c.plan.accumulator.name
        grad_out = pinned(grad_out.contiguous(), c.device)
        n = c.graph.num_nodes
        g_params: list[torch.Tensor | None] = [None] * len(c.params)
        g_x = [pinned_empty(tuple(t.shape), t.dtype, c.device) if g else None
               for t, g in zip(c.x_leaves, c.x_grad)]
        wants_x = any(c.x_grad)

        def add_params(gs: Any) -> None:
            for i, g in enumerate(gs):
                if g is not None:
                    g_params[i] = g if g_params[i] is None else g_params[i].add_(g)

        # 1. per column: apply_vertex's backward
        with record_function("ngra.stream.backward.columns"):
            g_acc_host = pinned_empty(tuple(c.acc_host.shape), c.acc_host.dtype, c.device)
            g_x_post = {}
            for col in range(k):
                lo, hi = c.rows(col)
                g, a = link.h2d(grad_out[lo:hi], c.acc_host[lo:hi]).ready()
                a.requires_grad_()
                with torch.enable_grad():
                    raw, xd = c.x_chunk(col, grad=True) if c.reads_x else ([], None)
                    y = c.post(xd, a, col)
                xs = [t for t in raw if t.requires_grad]
                gs = vjp(y, [a, *xs, *c.params], g, allow_unused=True)
                link.d2h(gs[0] if gs[0] is not None else torch.zeros_like(a),
                         g_acc_host[lo:hi])
                if xs:
                    g_x_post[col] = [t for t in gs[1:1 + len(xs)]]
                add_params(gs[1 + len(xs):])
                c.pace()
            link.fence()
        # 2. per source chunk: the tiles of its row, then (when no destination term
        # needs a gradient) pre's backward right away
        g_src_host: dict[int, torch.Tensor] = {}
        g_dst: dict[int, torch.Tensor] = {}
        # what the probe found (so the copies are the ones moved_bytes counts): whether any
        # term needs a gradient (GCN's first layer: none), and any destination-side term
        propagate, fused = c.s.rows.propagate, not c.s.rows.dst_grad
        # max/min: which extremes a tile has taken (gather.py), on the host beside acc
        taken_host = (torch.zeros(tuple(c.acc_host.shape), dtype=torch.bool)
                      if name in ("max", "min") else None)
        with record_function("ngra.stream.backward.rows"):
            for q in range(k if propagate or wants_x else 0):
                q_lo, q_hi = c.rows(q)
                with torch.enable_grad():
                    raw, xd = c.x_chunk(q, grad=True)
                    terms = c.pre(xd)
                if q == 0 and not fused:
                    for s in c.dst_slots:
                        if terms[s].requires_grad:
                            g_dst[s] = torch.zeros((n,) + tuple(terms[s].shape[1:]),
                                                   dtype=terms[s].dtype, device=c.device)
                leaves = {s: terms[s].detach().requires_grad_(terms[s].requires_grad)
                          for s in c.src_slots}
                g_src: dict[int, torch.Tensor] = {}
                for col in range(k):
                    if not propagate or not c.s.tile_edges[col][q]:
                        continue
                    lo, hi = c.rows(col)
                    hosts = [g_acc_host[lo:hi]]
                    if name not in ("sum", "mean"):
                        hosts.append(c.acc_host[lo:hi])
                    if c.lse_host is not None:
                        hosts.append(c.lse_host[lo:hi])
                    dst_slots = sorted(c.dst_slots)
                    hosts += [c.dst_host[s][lo:hi] for s in dst_slots]
                    fetch = link.h2d(*hosts).ready()
                    g_col = fetch[0]
                    i = 1
                    acc = lse = None
                    if name not in ("sum", "mean"):
                        acc, i = fetch[i], i + 1
                    if c.lse_host is not None:
                        lse, i = fetch[i], i + 1
                    dst = {s: t.requires_grad_(s in g_dst) for s, t in zip(dst_slots, fetch[i:])}
                    st = Staged(c.view(col, q, backward=True), "span")
                    st.src = _tree(c.t_spec, leaves, c.src_slots, c.nt)
                    st.dst = _tree(c.t_spec, dst, c.dst_slots, c.nt)
                    st.edata, st.drop = c.edata(col, q), c.tile_drop(col, q)
                    st.leaves = [(("src", s), t, None) for s, t in leaves.items()
                                 if t.requires_grad]
                    st.leaves += [(("dst", s), t, None) for s, t in dst.items() if t.requires_grad]
                    final = _final(name, acc, lse)
                    if taken_host is not None:
                        final = (acc, taken_host[lo:hi].to(c.device))
                    pairs, pgs = tile_gradients(c.plan, st, final, g_col,
                                                c.degrees(col), c.params, c.linear,
                                                c.rng.get((col, q)))
                    if taken_host is not None:
                        taken_host[lo:hi].copy_(final[1])
                    for ((side, s), _, _), g in pairs:
                        if side == "src":
                            g_src[s] = g if s not in g_src else g_src[s].add_(g)
                        else:
                            g_dst[s][lo:hi].add_(g)
                    add_params(pgs)
                    c.pace()
                if fused:
                    _pre_backward(c, q, raw, terms, g_src, {}, g_x, g_x_post, add_params)
                else:
                    for s, leaf in leaves.items():
                        if not leaf.requires_grad:
                            continue
                        if s not in g_src_host:
                            g_src_host[s] = pinned_empty((n,) + tuple(leaf.shape[1:]),
                                                         leaf.dtype, c.device)
                        g = g_src[s] if s in g_src else torch.zeros_like(leaf)
                        link.d2h(g, g_src_host[s][q_lo:q_hi])
        # 3. pre's backward, once the destination terms' gradients are complete
        with record_function("ngra.stream.backward.pre"):
            if not fused:
                link.fence()
                for r in range(k):
                    lo, hi = c.rows(r)
                    with torch.enable_grad():
                        raw, xd = c.x_chunk(r, grad=True)
                        terms = c.pre(xd)
                    g_src = dict(zip(g_src_host, link.h2d(*[h[lo:hi] for h in
                                                             g_src_host.values()]).ready()))
                    _pre_backward(c, r, raw, terms, g_src,
                                  {s: g[lo:hi] for s, g in g_dst.items()}, g_x, g_x_post,
                                  add_params)
        link.drain()
        if wants_x:
            link.compute_done()
        return (None, *g_x, *g_params)


def _pre_backward(c: _Call, r: int, raw: list[torch.Tensor], terms: list[torch.Tensor],
                  g_src: dict[int, torch.Tensor], g_dst: dict[int, torch.Tensor],
                  g_x: list[torch.Tensor | None], g_x_post: dict[int, list], add_params: Any
                  ) -> None:
    """``pre``'s backward on row chunk ``r`` given its terms' gradients; the input's
    gradient (with ``apply_vertex``'s share, if any) goes back to the host."""
    lo, hi = c.rows(r)
    outs, grads = [], []
    for s, t in enumerate(terms):
        g = g_src.get(s)
        if s in g_dst:
            g = g_dst[s] if g is None else g + g_dst[s]
        if g is not None and t.requires_grad:
            outs.append(t)
            grads.append(g)
    xs = [t for t in raw if t.requires_grad]
    gx: list[torch.Tensor | None] = [None] * len(xs)
    if outs:
        gs = vjp(outs, [*xs, *c.params], grads, allow_unused=True)
        gx = list(gs[:len(xs)])
        add_params(gs[len(xs):])
    post = g_x_post.pop(r, None)
    j = 0
    for i, t in enumerate(raw):
        if not t.requires_grad:
            continue
        g = gx[j]
        if post is not None and post[j] is not None:
            g = post[j] if g is None else g + post[j]
        if g is None:
            g = torch.zeros_like(t)
        c.link.d2h(g, g_x[i][lo:hi])
        j += 1
    c.pace()


def _probe_rows(plan: Plan, graph: Graph, x: Any, edata: Any, device: torch.device,
                activation: Any, drop: EdgeDropout | None) -> RowBytes:
    """What a layer call moves per row and edge, and how its backward runs, from its
    stages run on one vertex with one edge on the device."""
    leaves, spec = flatten(x)
    x_grad = any(t.requires_grad for t in leaves)
    one = unflatten(spec, [t[:1].detach().to(device).requires_grad_(t.requires_grad)
                           for t in leaves])
    with torch.enable_grad():  # which terms need gradients
        terms = plan.pre(one).terms  # its carry is for one call's post: not this probe's
    t_leaves, t_spec = flatten(terms)
    src_slots, dst_slots = read_slots(plan, t_spec, len(t_leaves))
    used = sorted(src_slots | dst_slots)
    edge_params = any(p.requires_grad for p in plan_parameters(plan))
    with torch.no_grad():
        z = torch.tensor([0, 1], dtype=torch.int32, device=device)
        e0 = torch.zeros(1, dtype=torch.int32, device=device)
        view = TileView(0, 1, z, e0, None, key=(0, 0))
        e_leaves, e_spec = flatten(edata)
        if e_spec == "factors":
            ed = EdgeFactors(*(t[:1].to(device) for t in e_leaves))
        else:
            ed = unflatten(e_spec, [t[:1].to(device) for t in e_leaves])

        def side(slots: frozenset[int]) -> Any:
            return unflatten(t_spec, [t.detach() if i in slots else None
                                      for i, t in enumerate(t_leaves)], keep=slots)

        part = plan.edge(view, side(src_slots), side(dst_slots), ed, None)
        rule = plan.accumulator
        state = rule.combine(None, part)
        deg = torch.ones(1, dtype=torch.int64, device=device)
        acc = rule.finalize(state, deg)
        stats = rule.final_stats(state, acc)
        xd = unflatten(spec, [t.detach() for t in flatten(one)[0]])
        try:
            out = plan.post(xd if plan.post_reads_x() else None, acc, _Degrees(deg))
        except ValueError as err:  # a wrong result's rows: say why a 1 is expected
            raise ValueError(f"{err} (This ran on one vertex: device streaming runs a layer's "
                             "stages on one vertex first, to size its copies.)") from err
        if activation is not None:
            out = activation(out)
    fused = all(kind != "interp" for kind in plan.edge_kinds)
    params = sum(p.numel() * p.element_size() for p in _layer_params(plan))
    counter = 0
    if drop is not None:
        counter = (drop.counter.element_size() if drop.counter is not None else
                   4 if graph.num_edges < 2**31 else 8)
    grads = [row_bytes(t_leaves[s]) if t_leaves[s].requires_grad else 0
             for s in range(len(t_leaves))]
    return RowBytes(
        x=sum(row_bytes(t) for t in leaves),
        terms=sum(row_bytes(t_leaves[s]) for s in used),
        dst_terms=sum(row_bytes(t_leaves[s]) for s in dst_slots),
        acc=row_bytes(acc),
        stats=row_bytes(stats[0]) if rule.name == "softmax" else 0,
        out=row_bytes(out),
        deg=graph.indptr.element_size(),
        factors=sum(row_bytes(t) for t in e_leaves) if e_spec == "factors" else 0,
        edge=0 if e_spec in (None, "factors") else sum(row_bytes(t) for t in e_leaves),
        counter=counter,
        edge_temp=0 if fused else 4 * row_bytes(acc),
        params=4 * params,
        gather=rule.name,
        post_reads_x=plan.post_reads_x(),
        x_grad=x_grad,
        propagate=edge_params or any(grads[s] for s in used),
        src_grad=sum(grads[s] for s in src_slots),
        dst_grad=sum(grads[s] for s in dst_slots),
    )


#: layer -> {call key: Schedule}: the schedules of each layer's last call shape
_SCHEDULES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def last_schedule(layer: Any) -> Schedule | None:
    """The schedule of ``layer``'s last streamed call (``None`` if it never streamed)."""
    cache = _SCHEDULES.get(layer)
    return next(reversed(cache.values())) if cache else None


def schedule_for(plan: Plan, graph: Graph, x: Any, edata: Any, activation: Any = None,
                 drop: EdgeDropout | None = None) -> Schedule:
    """The schedule the active :func:`~ngra.runtime.device_schedule.device_streaming`
    block gives this layer call (cached per layer, graph and input widths)."""
    st = settings_for(plan)
    assert st is not None
    leaves, _ = flatten(x)
    key = (id(graph), graph.num_nodes, graph.num_edges,
           tuple((tuple(t.shape[1:]), t.requires_grad) for t in leaves), st, activation,
           None if drop is None else (drop.counter is None or drop.counter.dtype))
    layer = plan.layer
    cache = _SCHEDULES.get(layer)
    if cache is None:
        cache = _SCHEDULES[layer] = {}
    if key not in cache:  # training and evaluation calls alternate: keep a few
        budget = st.budget
        if budget is None and st.device.type == "cuda":
            from ngra.runtime.placement import device_memory

            budget = device_memory(st.device)
        rows = _probe_rows(plan, graph, x, edata, st.device, activation, drop)
        while len(cache) >= 4:
            cache.pop(next(iter(cache)))
        cache[key] = choose_schedule(graph, rows, st.device, budget, st.parts, st.cache)
    else:
        cache[key] = cache.pop(key)  # the most recent call's schedule comes last
    return cache[key]


def run_streamed_layer(plan: Plan, graph: Graph, x: Any, edata: Any, dropout: float,
                       drop: EdgeDropout | None, activation: Any = None) -> torch.Tensor:
    """``activation(post(gather(edge(pre(dropout(x))))))`` of one layer, streamed through
    the active block's device (see the module docstring); returns the output in host
    memory (page-locked on a CUDA device)."""
    schedule = schedule_for(plan, graph, x, edata, activation, drop)
    call = _Call(plan, graph, x, edata, dropout, drop, activation, schedule)
    return StreamedLayer.apply(call, *call.x_leaves, *call.params)

