"""Chunked edge stages: an edge stage no kernel fuses, run a chunk of edges at a time.

An edge stage that is not lowered to a kernel (the interpreted edge IR of a compiled plan,
:class:`~ngra.compiler.passes.fuse.InterpMatch`; the generic plan's ``apply_edge``) would
make its per-edge tensors for every edge at once and keep them for backward. On the
whole-graph tile it runs here instead, over chunks of the destination-sorted (CSC) edges:

* **Chunks** are edge ranges ``[b0, b1)`` of about ``C`` edges (``NGRA_EDGE_CHUNK``; auto:
  as few equal chunks as keep the widest per-edge input row of a chunk within
  :data:`CHUNK_BYTES`, :data:`CHUNK_BYTES_CUDA` on a GPU), cut at a destination's first
  edge where one lies in reach, so only a destination with more than about ``C`` in-edges
  is split; each chunk covers a contiguous range of destination rows ``[lo, hi)`` (the
  rows of consecutive chunks share at most the split row; together they cover every row).
* **Forward** (no autograd, but for the last chunk: see backward) gathers each chunk's
  source/destination rows, runs the edge stage, reduces the chunk's messages with the
  gather's accumulator
  (:meth:`~ngra.compiler.gather.Accumulator.partial`) and merges the partial state into
  one ``[N, ...]`` state: a sum into its rows; max/min keeps, per row and feature, the
  extreme and the chunk that holds it (the first chunk on a tie: the kernels' rule, "the
  first extreme row wins"); a per-field gather does either per field; softmax merges
  online ``(max, sum, weighted sum)``. Only that
  state, the chunk of each extreme and the softmax's log-sum-exp survive the chunk.
* **Backward** recomputes each chunk under autograd (same RNG state as the forward, so a
  dropout inside the UDF draws the same masks), except the last: the forward runs that
  one under autograd and keeps its graph (one chunk's tensors), so backward starts with it
  and frees it before recomputing the others. It differentiates the chunk's share of the
  output (the partial itself for sum/mean; the extremes the chunk holds for max/min;
  :meth:`~ngra.compiler.gather.SoftmaxAccumulator.contribution` for softmax) with respect
  to the layer's parameters and the chunk's edge data. The gathered vertex rows are made
  by :class:`_GatherInto`, whose backward adds their gradient into one ``[N, ...]`` sink
  per term: no ``[N, F]`` gradient per chunk.

No ``[E, F]`` tensor outlives a chunk, in forward or in backward; the recomputation costs
one more forward of the edge stage on all chunks but one. Results equal the whole-edge
path's (sum orders aside). Not chunked: a graph whose edges fit one chunk,
``NGRA_EDGE_CHUNK=0``, factored edge weights that require grad, a partial tile of a grid
(the streaming runtime recomputes tiles itself).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from ngra import settings
from ngra.compiler.gather import Accumulator, PerFieldAccumulator
from ngra.compiler.tile import TileView
from ngra.edge import Edge
from ngra.graph import EdgeFactors
from ngra.kernels.lean import vjp

__all__ = ["CHUNK_BYTES", "CHUNK_BYTES_CUDA", "Chunks", "chunk_edges", "chunk_line",
           "chunks_for", "run_chunked"]

#: ``NGRA_EDGE_CHUNK=auto``: edges per chunk such that the widest per-edge input row of a
#: chunk takes about this many bytes (its UDF temporaries are a few such rows): on the CPU
#: a few MB (cache-sized), on a GPU far more (each chunk costs its kernel launches and a
#: few host syncs: cache-sized chunks were many times the whole-edge step's time there).
CHUNK_BYTES = 4 << 20
CHUNK_BYTES_CUDA = 256 << 20
#: ``auto`` never makes chunks smaller than this many edges (per-chunk overhead).
MIN_AUTO_CHUNK = 2048


class Chunks(NamedTuple):
    """A chunking of the whole graph's CSC edges.

    Attributes:
        size: the target edges per chunk.
        bounds: ``[(b0, b1, lo, hi), ...]``: each chunk's edge range and destination rows.
    """

    size: int
    bounds: list[tuple[int, int, int, int]]

    def __len__(self) -> int:
        return len(self.bounds)


def chunk_edges(row_bytes: int, num_edges: int, device: torch.device | None = None) -> int | None:
    """Edges per chunk for per-edge input rows of ``row_bytes`` on ``device``
    (``NGRA_EDGE_CHUNK``), or ``None``: run over every edge at once (the setting is 0, or
    the edges fit one chunk)."""
    want = settings.get("NGRA_EDGE_CHUNK")
    auto = want == "auto"
    if auto:
        budget = CHUNK_BYTES_CUDA if device is not None and device.type == "cuda" else CHUNK_BYTES
        want = max(MIN_AUTO_CHUNK, budget // max(int(row_bytes), 1))
    if not want or num_edges <= want:
        return None
    if auto:  # as few chunks as the budget allows, of equal size (no small last chunk)
        want = -(-num_edges // -(-num_edges // want))
    return int(want)


def chunk_bounds(indptr: torch.Tensor, size: int) -> list[tuple[int, int, int, int]]:
    """The chunks of about ``size`` edges of the CSC ``indptr`` (see the module docstring)."""
    ip = indptr.detach().cpu().numpy()
    n, e = ip.size - 1, int(ip[-1])
    cuts = [0]
    while cuts[-1] < e:
        b, t = cuts[-1], cuts[-1] + size
        if t >= e:
            cuts.append(e)
            break
        start = int(ip[np.searchsorted(ip, t, side="right") - 1])  # the row holding edge t
        cuts.append(start if start > b else t)
    out, lo = [], 0
    for b0, b1 in zip(cuts[:-1], cuts[1:]):
        r = n
        if b1 < e:
            r = int(np.searchsorted(ip, b1, side="right")) - 1  # the row holding edge b1
        hi = r if b1 == e or ip[r] == b1 else r + 1  # a split row belongs to both chunks
        out.append((b0, b1, lo, hi))
        lo = r
    return out


def chunks_for(indptr: torch.Tensor, num_edges: int, row_bytes: int) -> Chunks | None:
    """The chunking of a whole-graph tile, or ``None`` (see :func:`chunk_edges`)."""
    size = chunk_edges(row_bytes, num_edges, indptr.device)
    return None if size is None else Chunks(size, chunk_bounds(indptr, size))


def chunk_line(chunks: Chunks | None, num_edges: int) -> str:
    """The explain line of an unfused edge stage on the whole graph: how it is chunked."""
    setting = settings.get("NGRA_EDGE_CHUNK")
    if chunks is None:
        why = "NGRA_EDGE_CHUNK=0" if setting == 0 else \
            f"they fit one chunk, NGRA_EDGE_CHUNK={setting}"
        return (f"chunks  none: the edge stage runs over all {num_edges} edges at once "
                f"({why}); its [E, F] tensors are kept for backward")
    return (f"chunks  chunked generic path: {len(chunks)} chunks of about {chunks.size} edges "
            f"(NGRA_EDGE_CHUNK={setting}), each recomputed in backward; no [E, F] tensor "
            "outlives a chunk")


def row_bytes(*trees: Any) -> int:
    """The widest row (bytes) of the tensors in ``trees`` (tensors, dicts, EdgeFactors)."""
    widest = 0
    for tree in trees:
        for t in _leaves(tree):
            if t.dim():
                widest = max(widest, t[:1].numel() * t.element_size())
    return widest


# ------------------------------------------------------------------ per-chunk inputs
class Rows:
    """One chunk's per-edge inputs, each gathered at most once.

    ``take(t, idx)`` gathers rows (an ``index_select``; in backward, :class:`_GatherInto`).
    """

    def __init__(self, terms: Any, edata: Any, src_idx: torch.Tensor, dst_idx: torch.Tensor,
                 take: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.terms, self.edata, self.src_idx, self.dst_idx = terms, edata, src_idx, dst_idx
        self._take = take
        self._cache: dict[Any, Any] = {}

    def src(self, key: Any) -> Any:
        return self._rows("src", key, self.src_idx)

    def dst(self, key: Any) -> Any:
        return self._rows("dst", key, self.dst_idx)

    def _rows(self, side: str, key: Any, idx: torch.Tensor) -> Any:
        if (side, key) not in self._cache:
            t = self.terms if key is None else self.terms[key]
            self._cache[side, key] = (
                {k: self._take(v, idx) for k, v in t.items()} if isinstance(t, Mapping)
                else self._take(t, idx))
        return self._cache[side, key]

    def data(self, key: Any = None) -> Any:
        d = self.edata if key is None else self.edata[key]
        if isinstance(d, EdgeFactors):  # one weight per edge, made from vertex factors
            return d.per_edge(self.src_idx, self.dst_idx)
        if isinstance(d, Mapping):
            return {k: self.data(k) for k in d} if key is None else d
        return d


class ChunkEdge(Edge):
    """The :class:`~ngra.edge.Edge` the generic plan's ``apply_edge`` sees on a chunk."""

    __slots__ = ("_chunk",)

    def __init__(self, rows: Rows) -> None:
        super().__init__(None, None, None, None, rows.data())
        self._chunk = rows

    @property
    def src(self) -> Any:
        return self._chunk.src(None)

    @property
    def dst(self) -> Any:
        return self._chunk.dst(None)


class _Sinks:
    """The gradient of each vertex term (by its slot among the term leaves), one
    ``[N, ...]`` tensor filled chunk by chunk."""

    def __init__(self) -> None:
        self.total: dict[int, torch.Tensor] = {}

    def add(self, slot: int, t: torch.Tensor, idx: torch.Tensor, g: torch.Tensor) -> None:
        if slot not in self.total:
            self.total[slot] = torch.zeros_like(t)
        self.total[slot].index_add_(0, idx, g.to(t.dtype))


class _GatherInto(torch.autograd.Function):
    """``t[idx]``, whose backward adds the rows' gradient into ``sinks`` (``token``, a
    scalar that requires grad, puts it on the recomputed chunk's autograd graph)."""

    @staticmethod
    def forward(ctx: Any, token: torch.Tensor, t: torch.Tensor, idx: torch.Tensor,
                sinks: _Sinks, slot: int) -> torch.Tensor:
        ctx.t, ctx.sinks, ctx.slot, ctx.token = t, sinks, slot, (token.dtype, token.device)
        ctx.save_for_backward(idx)
        return t.index_select(0, idx)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        (idx,) = ctx.saved_tensors
        ctx.sinks.add(ctx.slot, ctx.t, idx, g)
        dtype, device = ctx.token
        return torch.zeros((), dtype=dtype, device=device), None, None, None, None


def _plain_take(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return t.index_select(0, idx)


# ------------------------------------------------------------------ the runner
#: ``messages(rows) -> the chunk's per-edge messages`` (the stage's output structure).
Messages = Callable[[Rows], Any]


def run_chunked(chunks: Chunks, tile: TileView, acc: Accumulator, messages: Messages,
                terms: Any, edata: Any, params: list[torch.Tensor], drop: Any = None) -> Any:
    """The whole-graph tile's accumulator state, its edges run in ``chunks``.

    ``terms``: the vertex terms (``[N, ...]`` tensors, dicts of them), read per edge through
    :class:`Rows`; ``edata``: the edge data in CSC order; ``params``: the parameters the
    edge stage may read; ``drop``: a softmax gather's attention dropout, or ``None``.
    Returns the state the whole tile's edge stage returns: the sum (a dict of sums for a
    dict message); ``(extremes, has edges)``; softmax's ``(0, None, normalized output)``.
    """
    run = _Run(chunks, tile, acc, messages, terms, edata, drop)
    t_leaves, e_leaves = _leaves(terms), _leaves(edata, grads_only=True)
    params = [p for p in params if p.requires_grad]
    wants = torch.is_grad_enabled() and any(t.requires_grad for t in t_leaves + e_leaves
                                            + params)
    if wants:
        run.leaves = (len(t_leaves), len(e_leaves))
        outs = _ChunkedEdges.apply(run, *t_leaves, *e_leaves, *params)
    else:
        with torch.no_grad():
            outs = run.forward(keep=False)
    return run.state_of(list(outs))


class _Run:
    """One call's chunked edge stage: its forward state and the recomputing backward."""

    def __init__(self, chunks: Chunks, tile: TileView, acc: Accumulator, messages: Messages,
                 terms: Any, edata: Any, drop: Any) -> None:
        self.chunks, self.tile, self.acc, self.messages = chunks, tile, acc, messages
        self.terms, self.edata, self.drop = terms, edata, drop
        # the message structure: None (a tensor) or its dict keys; softmax: the per-row
        # shape of the log-sum-exp
        self.spec: Any = None
        # max/min: the chunk holding each extreme (None for a sum/mean field)
        self.winner: list[torch.Tensor | None] = []
        self.final: Any = None  # softmax: the log-sum-exp per row
        self.out: Any = None  # softmax, in backward: the output
        self.rng: tuple = ()
        self.leaves = (0, 0)
        self.kept: _Kept | None = None  # the last chunk, run under autograd in forward

    # .............................................................. forward
    def chunk(self, k: int, terms: Any, edata: Any, take: Callable) -> Any:
        """Chunk ``k``'s partial state (the accumulator's, over the chunk's rows)."""
        b0, b1, lo, hi = self.chunks.bounds[k]
        tile = self.tile
        indptr = tile.indptr[lo:hi + 1].clamp(b0, b1) - b0
        rows = Rows(terms, edata, tile.src_idx[b0:b1], tile.dst_idx[b0:b1], take)
        msg = self.messages(rows)
        drop = None if self.drop is None else self.drop.take(
            torch.arange(b0, b1, device=indptr.device))
        return self.acc.partial(indptr, msg, drop)

    def forward(self, keep: bool, grad: tuple | None = None) -> list[torch.Tensor]:
        """Every chunk merged into the state; the tensors the call returns (``keep``:
        keep what backward needs; ``grad``: ``(leaves, needs)`` of the call under autograd,
        whose last chunk runs under autograd and keeps its graph for backward)."""
        self.rng = _rng_state(self.tile.indptr.device)
        name, n = self.acc.name, self.tile.num_dst
        last = len(self.chunks.bounds) - 1
        state: Any = None
        for k, (b0, b1, lo, hi) in enumerate(self.chunks.bounds):
            if grad is not None and k == last and b1 > b0:
                leaves, needs = grad
                nt, ne = self.leaves
                env = _GradEnv(self, leaves[:nt], needs[:nt])
                part, e_rows = self.grad_chunk(k, env, leaves[nt:nt + ne], needs[nt:nt + ne])
                self.kept = _Kept(k, part, e_rows, env)
            else:
                part = self.chunk(k, self.terms, _edge_rows(self.edata, b0, b1), _plain_take)
            if name != "softmax":
                fields = self._fields(part)
                if state is None:
                    self.spec = _spec(part[0] if name in ("max", "min") else part)
                    state = [v.new_zeros((n,) + v.shape[1:]) for v, _, _ in fields]
                    self.winner = [None if has is None else torch.full(
                        s.shape, -1, dtype=torch.int32, device=s.device)
                        for s, (_, has, _) in zip(state, fields)]
                for s, w, (v, has, rule) in zip(state, self.winner, fields):
                    if has is None:
                        s[lo:hi].add_(v)
                    else:
                        _merge_extreme(s[lo:hi], w[lo:hi], v, has, k, rule)
            else:
                if state is None:
                    m, s, o = part
                    self.spec = m.shape[1:]  # the per-row shape of the log-sum-exp
                    state = (m.new_full((n,) + m.shape[1:], -math.inf),
                             s.new_zeros((n,) + s.shape[1:]), o.new_zeros((n,) + o.shape[1:]))
                rows = tuple(x[lo:hi] for x in state)
                for x, y in zip(rows, self.acc.combine(rows, part)):
                    x.copy_(y)
        if name == "softmax":
            out = self.acc.finalize(state, None, in_place=True)
            if keep:  # the output itself is saved by the Function (in-place checks)
                self.final = self.acc.final_stats(state, out)[0]
            return [out]
        if not keep:
            self.winner = []
        return state

    def _fields(self, part: Any) -> list[tuple[torch.Tensor, Any, str]]:
        """``(values, rows with edges or None, reducer)`` of each tensor of a chunk's sum,
        mean, max or min partial state, or of a per-field gather's (a dict of them)."""
        name = self.acc.name
        if name in ("max", "min"):
            values, has = part
            return [(v, has, name) for v in _leaves(values)]
        if isinstance(self.acc, PerFieldAccumulator):
            out: list[tuple[torch.Tensor, Any, str]] = []
            for k, rule in self.acc.fields.items():
                if rule in ("max", "min"):
                    out.append((part[k][0], part[k][1], rule))
                else:
                    out.append((part[k], None, rule))
            return out
        return [(v, None, name) for v in _leaves(part)]

    def state_of(self, outs: list[torch.Tensor]) -> Any:
        """The whole tile's accumulator state from the call's outputs."""
        name, tile = self.acc.name, self.tile
        if name == "softmax":
            out = outs[0]
            return out.new_zeros((tile.num_dst,) + tuple(self.spec)), None, out
        value = _unspec(self.spec, outs)
        has = tile.indptr[1:] > tile.indptr[:-1]
        if name in ("max", "min"):
            return value, has
        if isinstance(self.acc, PerFieldAccumulator):
            return {k: (value[k], has) if rule in ("max", "min") else value[k]
                    for k, rule in self.acc.fields.items()}
        return value

    # .............................................................. backward
    def grad_chunk(self, k: int, env: _GradEnv, e_leaves: Any,
                   needs_e: tuple[bool, ...]) -> tuple[Any, list[torch.Tensor]]:
        """Chunk ``k``'s partial state under autograd, and its edge-data rows (leaves)."""
        b0, b1, _, _ = self.chunks.bounds[k]
        e_rows = [e[b0:b1].detach().requires_grad_(w) for e, w in zip(e_leaves, needs_e)]
        edata = _rebuild_edges(self.edata, e_rows, b0, b1)
        with torch.enable_grad():
            return self.chunk(k, env.terms, edata, env.take), e_rows

    def backward(self, grads: tuple, saved: tuple, params: list[torch.Tensor],
                 needs: tuple[bool, ...]) -> list[Any]:
        """Gradients of the call's inputs: term leaves, edge-data leaves, parameters
        (``saved``: the term and edge-data leaves, then softmax's output). The chunk the
        forward kept under autograd goes first (its graph is freed before any other chunk
        is recomputed); the others are recomputed in order, from the forward's RNG state."""
        nt, ne = self.leaves
        if self.acc.name == "softmax":
            self.out = saved[nt + ne].detach()  # saved outputs keep their grad_fn
        e_saved = saved[nt:nt + ne]
        kept, self.kept = self.kept, None  # a second backward (retain_graph) recomputes it
        env = _GradEnv(self, saved[:nt], needs[:nt], kept.env.sinks if kept else None)
        e_grads: list[Any] = [None] * ne
        p_grads: list[Any] = [None] * len(params)
        want_p = [needs[nt + ne + i] for i in range(len(params))]
        checked = False

        def differentiate(k: int, part: Any, e_rows: list[torch.Tensor],
                          token: torch.Tensor) -> None:
            nonlocal checked
            b0, b1, lo, hi = self.chunks.bounds[k]
            with torch.enable_grad():
                outs, gs = self._shares(k, part, grads, lo, hi)
            if not outs:
                return
            inputs = [token] + [e for e in e_rows if e.requires_grad] \
                + [p for p, w in zip(params, want_p) if w]
            if not checked:
                _check_leaves(outs, [token] + e_rows + params)
                checked = True
            got = vjp(outs, inputs, gs, allow_unused=True)
            it = iter(got[1:])
            for j, e in enumerate(e_rows):
                if e.requires_grad:
                    g = next(it)
                    if g is not None:
                        if e_grads[j] is None:
                            e_grads[j] = torch.zeros_like(e_saved[j])
                        e_grads[j][b0:b1] += g
            for i, w in enumerate(want_p):
                if w:
                    g = next(it)
                    if g is not None:
                        p_grads[i] = g if p_grads[i] is None else p_grads[i].add_(g)

        skip = -1
        if kept is not None:
            skip = kept.k
            differentiate(kept.k, kept.part, kept.e_rows, kept.env.token)
            del kept  # its graph is freed now
        now = _rng_state(self.tile.indptr.device)
        _set_rng_state(self.rng)
        try:
            for k, (b0, b1, _, _) in enumerate(self.chunks.bounds):
                if b1 == b0 or k == skip:
                    continue
                part, e_rows = self.grad_chunk(k, env, e_saved, needs[nt:nt + ne])
                differentiate(k, part, e_rows, env.token)
        finally:
            _set_rng_state(now)
        t_grads = [env.sinks.total.get(i) for i in range(nt)]
        return t_grads + e_grads + p_grads

    def _shares(self, k: int, part: Any, grads: tuple, lo: int, hi: int) -> tuple[list, list]:
        """``(tensors, their gradients)``: chunk ``k``'s share of the output and the
        output's gradient on its rows."""
        name = self.acc.name
        if name == "softmax":
            lse, out = self.final, self.out
            share = self.acc.contribution(part, (lse[lo:hi], out[lo:hi]), None)
            return ([share], [grads[0][lo:hi]]) if share.requires_grad else ([], [])
        outs, gs = [], []
        for (v, _, _), w, g in zip(self._fields(part), self.winner, grads):
            if not v.requires_grad:
                continue
            outs.append(v)
            gs.append(g[lo:hi] if w is None else torch.where(
                w[lo:hi] == k, g[lo:hi], torch.zeros((), dtype=g.dtype, device=g.device)))
        return outs, gs


class _GradEnv:
    """What chunks run under autograd read: the term leaves (detached), gathered by
    :class:`_GatherInto` where their gradient is needed (into ``sinks``, by slot), and the
    token that puts those gathers on each chunk's graph."""

    def __init__(self, run: _Run, t_leaves: Any, needs: tuple[bool, ...],
                 sinks: _Sinks | None = None) -> None:
        leaves = [t.detach() for t in t_leaves]
        self.terms = _rebuild(run.terms, leaves)
        self.sinks = _Sinks() if sinks is None else sinks
        self.token = torch.zeros((), device=run.tile.indptr.device, requires_grad=True)
        self._slot = {id(t): i for i, t in enumerate(leaves)}
        self._needs = needs

    def take(self, t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        slot = self._slot[id(t)]
        if not self._needs[slot]:
            return t.index_select(0, idx)
        return _GatherInto.apply(self.token, t, idx, self.sinks, slot)


class _Kept(NamedTuple):
    """The chunk the forward ran under autograd: its partial state (with its graph), its
    edge-data rows and the environment it read."""

    k: int
    part: Any
    e_rows: list[torch.Tensor]
    env: _GradEnv


class _ChunkedEdges(torch.autograd.Function):
    """The chunked edge stage under autograd: forward keeps the state, backward recomputes."""

    @staticmethod
    def forward(ctx: Any, run: _Run, *leaves: torch.Tensor) -> tuple[torch.Tensor, ...]:
        nt, ne = run.leaves
        ctx.run = run
        ctx.params = list(leaves[nt + ne:])
        needs = tuple(t.requires_grad for t in leaves[:nt + ne])
        with torch.no_grad():
            outs = tuple(run.forward(keep=True, grad=(leaves, needs)))
        # softmax's backward reads its output: saved, so an in-place change of it raises
        ctx.save_for_backward(*leaves[:nt + ne], *(outs if run.acc.name == "softmax" else ()))
        return outs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        run: _Run = ctx.run
        out = run.backward(grads, ctx.saved_tensors, ctx.params, ctx.needs_input_grad[1:])
        return (None, *out)


# ------------------------------------------------------------------ helpers
def _check_leaves(outs: list[torch.Tensor], known: list[torch.Tensor]) -> None:
    """Raise unless every leaf tensor the recomputed chunk reads is one the chunked stage
    differentiates (its edge data, the layer's parameters): another one that requires
    grad, captured by the UDF, would get no gradient."""
    ids = {id(t) for t in known}
    seen, todo = set(), [o.grad_fn for o in outs]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)
        if var is not None and id(var) not in ids:
            raise RuntimeError(
                f"the chunked edge stage differentiates the vertex data, the edge data and "
                f"the layer's parameters; apply_edge also reads a tensor "
                f"{list(var.shape)} that requires grad, which would get no gradient. Pass it "
                "as edge or vertex data, make it a parameter of the layer, or set "
                "NGRA_EDGE_CHUNK=0.")
        todo.extend(f for f, _ in fn.next_functions)


def _merge_extreme(s: torch.Tensor, w: torch.Tensor, v: torch.Tensor, has: torch.Tensor,
                   k: int, name: str) -> None:
    """Merge chunk ``k``'s extremes ``v`` (rows with edges: ``has``) into the state rows
    ``s`` and their winning chunks ``w``: an earlier chunk keeps a tie."""
    better = v > s if name == "max" else v < s
    take = (better | (w < 0)) & has.view((-1,) + (1,) * (v.dim() - 1))
    s.copy_(torch.where(take, v, s))
    w.masked_fill_(take, k)


def _leaves(tree: Any, grads_only: bool = False) -> list[torch.Tensor]:
    """The tensors of a tensor, a dict of tensors or EdgeFactors (``grads_only``: edge data
    that is per edge, not factored; factors never require grad here)."""
    if tree is None:
        return []
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, EdgeFactors):
        return [] if grads_only else [tree.src, tree.dst]
    if isinstance(tree, Mapping):
        return [t for v in tree.values() for t in _leaves(v, grads_only)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in _leaves(v, grads_only)]
    raise TypeError(f"chunked edge stage: expected a tensor or a dict of tensors; got "
                    f"{type(tree).__name__}.")


def _spec(tree: Any) -> Any:
    return tuple(tree) if isinstance(tree, Mapping) else None


def _unspec(spec: Any, leaves: list[torch.Tensor]) -> Any:
    return leaves[0] if spec is None else dict(zip(spec, leaves))


def _rebuild(tree: Any, leaves: list[torch.Tensor]) -> Any:
    """``tree`` (a tensor or a dict of tensors) with its tensors replaced, in order."""
    it = iter(leaves)
    if isinstance(tree, Mapping):
        return {k: next(it) for k in tree}
    return next(it) if tree is not None else None


def _edge_rows(edata: Any, b0: int, b1: int) -> Any:
    if edata is None or isinstance(edata, EdgeFactors):
        return edata
    if isinstance(edata, Mapping):
        return {k: _edge_rows(v, b0, b1) for k, v in edata.items()}
    return edata[b0:b1]


def _rebuild_edges(edata: Any, rows: list[torch.Tensor], b0: int, b1: int) -> Any:
    """The chunk's edge data with its per-edge tensors replaced by ``rows`` (in order)."""
    it = iter(rows)

    def one(d: Any) -> Any:
        if d is None or isinstance(d, EdgeFactors):
            return d
        if isinstance(d, Mapping):
            return {k: one(v) for k, v in d.items()}
        return next(it)

    return one(edata)


def _rng_state(device: torch.device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), device, cuda


def _set_rng_state(state: tuple) -> None:
    cpu, device, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)
