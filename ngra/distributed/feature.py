"""Feature-parallel layers: each rank aggregates a slice of the columns over the whole graph.

A vertex-partitioned rank ``r`` holds ``D_r`` owned rows of the terms a layer's edge stage
reads (``[D_r, F]``). Under the ``feature`` exchange (:mod:`ngra.distributed.cost`):

1. one ``all_to_all`` transposes them to ``[N, F_r]``: every vertex of the graph, the
   rank's column slice (``sum_r F_r = F``, slices as even as possible;
   :func:`column_slices`). The ranks own consecutive row ranges of the partition order,
   so rank ``r`` receives ``[D_j, F_r]`` from each rank ``j`` and stacks them in rank
   order: the whole graph's rows in the partition's (new-id) order;
2. the rank runs the layer's (fused) aggregation over the whole graph's structure
   (:class:`WholeGraph`) for its columns only: an ``[N, F_r]`` accumulator;
3. one ``all_to_all`` transposes the result back to the owned rows, ``[D_r, F]``.

Backward runs the adjoint transposes (:class:`_Transpose`: each direction is the other's
backward), so gradients are exact. The bytes moved are independent of the cut:
a rank sends ``D_r (F - F_r)`` values and receives ``(N - D_r) F_r`` each way, against a
halo's ``S_r F`` / ``H_r F`` that approach the whole graph on a power-law graph.

Which layers split (:func:`column_split`, decided per compiled plan from the fuse pass's
match, and said in ``ngra explain``):

* a g-SpMM (sum, mean, max, min) of a source term scaled by a per-edge scalar: its
  columns are independent;
* a softmax aggregation (GAT): split by whole heads (the scores of a head and its value
  columns stay on one rank); a single-head score is kept whole on every rank and the
  value's columns split;
* a fused element-wise edge expression over vertex terms: column by column;
* not: a generic or interpreted edge UDF (it may mix columns), an edge stage reading
  per-column parameters or edge data with feature columns, a typed message, a
  dict-valued accumulator, or fewer columns (heads) than ranks.

A term the edge stage reads whole (a per-edge scalar score) travels whole to every rank
(an all-gather inside the same ``all_to_all``); its gradients add up on the way back.

The rank runs a copy of the plan whose fuse-pass match has its shapes cut to the slice
(:func:`sliced_plan`); a GAT's copy runs ``softmax_aggregate`` on the scores pre made
(``attention_aggregate`` reads whole-width score weights). A term without a gradient (a
first layer's input) is transposed forward only.

The whole graph's CSC (in partition order), its edge weights (or factors) and, for an
attention dropout, its edges' ids are gathered from the ranks once, at a layer's first
feature call (every rank makes it together), and kept: about ``16 (N + E)`` bytes a rank
(:func:`~ngra.distributed.cost.structure_bytes`, with the transpose backward builds),
which the cost model checks against a memory budget. Edge data the layer reads is
gathered once per tensor.

Bytes: a transpose moves ``N F (K - 1) / K`` values over all ranks, a halo exchange
``sum_r H_r F``; feature moves fewer only where the halos add up to more than about
``2 N (K - 1) / K`` rows (both transposes of a layer against its one exchange): a
partition whose halos stay near ``N`` in total (METIS on R-MAT 2^20 at 4 ranks) keeps
the halo ahead (``experiments/results/distributed_feature.md``).

Attention dropout: the masks hash ``counter * H + h`` (:class:`~ngra.kernels.EdgeDropout`);
a rank holding heads ``[r H / K, (r + 1) H / K)`` draws the same masks as one process
with the counters ``counter * K + r`` over its ``H / K`` heads, so a layer with attention
dropout splits only where ``K`` divides its heads.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ngra.compiler.plan import Plan
from ngra.distributed.halo import ExchangeRecord, Traffic
from ngra.graph import EdgeFactors, Graph
from ngra.runtime.staging import flatten, read_slots, unflatten
from ngra.runtime.stream import walk
from ngra.runtime.tiles import whole_graph_grid

__all__ = ["ColumnSplit", "WholeGraph", "column_slices", "column_split", "feature_propagate",
           "sliced_plan"]


def column_slices(width: int, k: int) -> list[tuple[int, int]]:
    """``k`` consecutive ranges covering ``[0, width)``, as even as possible (the first
    ``width % k`` one wider)."""
    q, rem = divmod(int(width), int(k))
    out, lo = [], 0
    for j in range(k):
        hi = lo + q + (j < rem)
        out.append((lo, hi))
        lo = hi
    return out


@dataclass(frozen=True)
class ColumnSplit:
    """How a plan's terms split by columns (:func:`column_split`).

    Attributes:
        sliced: term keys split along feature dimension ``axis``.
        whole: term keys every rank reads whole.
        width: that dimension's size (columns, or heads).
        unit: ``"columns"`` or ``"heads"``.
        axis: the dimension past the rows that is cut (0; 1 for a one-head attention's
            value ``[N, 1, C]``, whose columns split); the ones before it are of size 1.
        heads_dropout: the layer drops attention weights per head (its heads must split
            evenly; module docs).
    """

    sliced: frozenset
    whole: frozenset
    width: int
    unit: str
    axis: int = 0
    heads_dropout: bool = False

    def describe(self, k: int) -> str:
        sizes = sorted({hi - lo for lo, hi in column_slices(self.width, k)})
        return (f"{self.width} {self.unit} split {'/'.join(map(str, sizes))} a rank over {k} "
                f"ranks")


def _message_shape(m: Any) -> tuple[int, ...]:
    """A match's message shape past the rows (what a column slice cuts)."""
    if m.kind in ("softmax_aggregate", "softmax_score"):
        return tuple(m.heads) + tuple(m.dims)
    return tuple(m.out)


def column_split(plan: Plan, terms: Any, k: int) -> ColumnSplit | str:
    """How ``plan``'s edge stage splits by columns over ``k`` ranks, or why it cannot
    (a sentence; module docs)."""
    from ngra.compiler.passes.fuse import (  # lazy: the fuse pass's matches, only here
        FusedEdgeMatch, GspmmMatch, SoftmaxMatch, SoftmaxScoreMatch)

    if plan.program is None:
        return ("its edge stage is a generic UDF (apply_edge as written), whose columns may "
                "mix")
    low = plan.program.lowering
    if set(low) != {None}:
        return "its edge stage has several outputs (a dict accumulator)"
    if not isinstance(terms, dict):
        return "its terms are not a dict of tensors"
    m = low[None]
    sliced: set = set()
    whole: set = set()
    expand: set = set()
    unit, axis = "columns", 0
    if isinstance(m, GspmmMatch):
        if m.typed:
            return "its message is typed (one weight per edge type and column block)"
        if m.edge_dims:
            return "its edge weights have feature columns ([E, ...]): they would split too"
        sliced.add(m.src)
    elif isinstance(m, SoftmaxMatch):
        scores = {m.score_src, m.score_dst} - {None}
        if math.prod(m.heads) == 1:  # one head: scores whole, the value's columns split
            whole |= scores
            sliced.add(m.value)
            axis = len(m.heads)
        elif m.heads[0] >= k:
            sliced |= scores | {m.value}
            unit = "heads"
        else:
            return f"it has {m.heads[0]} heads, fewer than the {k} ranks"
    elif isinstance(m, (SoftmaxScoreMatch, FusedEdgeMatch)):
        fe = m.score if isinstance(m, SoftmaxScoreMatch) else m
        if isinstance(m, SoftmaxScoreMatch) and math.prod(m.heads) == 1:
            return "its attention score sums over every feature column (one head)"
        for _, layout in fe.edge:
            if layout != "ones":
                return "it reads edge data with feature columns, which would split too"
        if any(kind != "term" for kind, _, _ in fe.dst):
            return "its edge expression reads a parameter per column"
        leaves = list(fe.src) + [(key, layout) for _, key, layout in fe.dst]
        for key, layout in leaves:
            {"full": sliced, "ones": whole}.get(layout, expand).add(key)
        if isinstance(m, SoftmaxScoreMatch):
            sliced.add(m.value)
            unit = "heads"
    else:
        return (f"its edge stage runs interpreted ({getattr(m, 'reason', m.kind)}): a generic "
                "edge UDF may mix columns")
    missing = (sliced | whole | expand) - set(terms)
    if missing:
        return f"it reads terms {sorted(map(str, missing))} pre did not make"
    widths = set()
    for key in sliced:
        sh = tuple(terms[key].shape[1:])
        widths.add(sh[axis] if len(sh) > axis and math.prod(sh[:axis]) == 1 else None)
    if len(widths) != 1 or None in widths:
        return (f"the terms it would split differ in width ({sorted(map(str, widths))}), so "
                "no one column slice fits them all")
    width = int(widths.pop())
    for key in expand:  # broadcast on the vertex side: split if it has the columns
        t = terms[key]
        if t.dim() > 1 and t.shape[1] == width and axis == 0:
            sliced.add(key)
        elif t.dim() == 1 or t.shape[1] == 1:
            whole.add(key)
        else:
            return f"term {key} broadcasts over the columns in a way a slice cannot follow"
    if sliced & whole:
        return "a term is read both per column and whole"
    shape = _message_shape(m)
    if len(shape) <= axis or shape[axis] != width:
        return (f"its message's shape {list(shape)} does not have its terms' {width} "
                f"{unit} where they split")
    if width < k:
        return f"it has {width} {unit}, fewer than the {k} ranks"
    p = float(getattr(plan.layer, "attention_dropout", 0.0) or 0.0)
    heads_dropout = p > 0 and unit == "heads"
    if heads_dropout and width % k:
        return (f"its attention dropout draws masks per head, which split exactly only when "
                f"the {k} ranks divide its {width} heads")
    return ColumnSplit(frozenset(sliced), frozenset(whole), width, unit, axis, heads_dropout)


def _sliced_match(m: Any, w: int, axis: int) -> Any:
    """``m`` for a slice of ``w`` columns (heads) of its message's dimension ``axis``."""
    def cut(shape: tuple, at: int = 0) -> tuple:
        return tuple(shape[:at]) + (w,) + tuple(shape[at + 1:])

    if m.kind == "gspmm":
        return dataclasses.replace(m, feat=cut(m.feat), out=cut(m.out))
    if m.kind == "softmax_aggregate":  # the scores pre made, not attention_aggregate's
        if axis < len(m.heads):
            return dataclasses.replace(m, heads=cut(m.heads), weights=None)
        return dataclasses.replace(m, dims=cut(m.dims, axis - len(m.heads)), weights=None)
    if m.kind == "softmax_score":
        return dataclasses.replace(m, heads=cut(m.heads),
                                   score=dataclasses.replace(m.score, out=cut(m.score.out)))
    return dataclasses.replace(m, out=cut(m.out))


_SLICED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def sliced_plan(plan: Plan, width: int, axis: int = 0) -> Plan:
    """A copy of compiled ``plan`` whose edge stage runs ``width`` of its columns (heads)
    at its message's dimension ``axis``: the fuse pass's match with its shapes cut (kept
    per plan, width and axis)."""
    from ngra.compiler.edge_stage import EdgeStage  # lazy: the compiler's edge stage

    per = _SLICED.setdefault(plan, {})
    hit = per.get((width, axis))
    if hit is None:
        program = copy.copy(plan.program)
        program.lowering = {None: _sliced_match(plan.program.lowering[None], width, axis)}
        hit = copy.copy(plan)
        hit.program = program
        hit.edges = EdgeStage(program, plan.resolver)
        hit.accumulator = hit.edges.accumulator
        per[(width, axis)] = hit
    return hit


# ------------------------------------------------------------------ the whole graph
def _gather_var(t: torch.Tensor, counts: list[int], group: Any) -> torch.Tensor:
    """Every rank's ``t`` (``counts[j]`` rows on rank ``j``), stacked in rank order."""
    k = len(counts)
    if k == 1:
        return t.contiguous()
    most = max(max(counts), 1)
    pad = t.new_zeros((most,) + tuple(t.shape[1:]))
    pad[: t.shape[0]] = t
    out = [torch.empty_like(pad) for _ in range(k)]
    dist.all_gather(out, pad, group=group)
    return torch.cat([o[:c] for o, c in zip(out, counts)])


class WholeGraph:
    """The whole graph's structure on a rank, gathered from every rank's local CSC once
    (module docs), and the edge data a feature layer reads, gathered once per tensor."""

    def __init__(self, local: Graph, num_own: int, halo_ids: torch.Tensor,
                 bounds: torch.Tensor, rank: int, rows: list[int], edges: list[int],
                 group: Any, edge_ids: torch.Tensor) -> None:
        self.rank, self.rows, self.edges, self.group = rank, rows, edges, group
        d = int(num_own)
        lo = int(bounds[rank])
        ip = local.indptr[: d + 1].to(torch.int64)
        e = int(ip[d])
        dev = ip.device
        gid = torch.cat([torch.arange(lo, lo + d, dtype=torch.int64, device=dev),
                         halo_ids.to(dev, torch.int64)])
        n = int(sum(rows))
        idtype = torch.int32 if n < 2 ** 31 else torch.int64
        src = gid.index_select(0, local.indices[:e].to(torch.int64)).to(idtype)
        counts = _gather_var(ip[1:] - ip[:-1], rows, group)
        indptr = torch.zeros(n + 1, dtype=torch.int64, device=dev)
        torch.cumsum(counts, 0, out=indptr[1:])
        indices = _gather_var(src, edges, group)
        weight = factors = None
        if local.edge_factors is not None:
            factors = self._factors(local.edge_factors, d)
        elif local.edge_weight is not None:
            weight = _gather_var(local.edge_weight[:e], edges, group)
        self.graph = Graph(indptr, indices, None, n, weight, factors)
        self._local_ids = edge_ids
        self._ids: torch.Tensor | None = None
        self._num_own = d
        self._edata: dict[int, tuple[Any, Any]] = {}

    def _factors(self, f: EdgeFactors, d: int) -> EdgeFactors:
        return EdgeFactors(_gather_var(f.src[:d], self.rows, self.group),
                           _gather_var(f.dst[:d], self.rows, self.group))

    @property
    def edge_ids(self) -> torch.Tensor:
        """``[E]`` each whole-graph CSC edge's id in the prepared graph (attention dropout's
        counters), int64; gathered on first use."""
        if self._ids is None:
            self._ids = _gather_var(self._local_ids.to(torch.int64), self.edges, self.group)
        return self._ids

    def edata(self, edata: Any) -> Any:
        """The whole graph's counterpart of the local edge data ``edata`` (CSC order)."""
        if edata is None:
            return None
        if isinstance(edata, dict):
            return {key: self.edata(v) for key, v in edata.items()}
        key = edata.src if isinstance(edata, EdgeFactors) else edata
        hit = self._edata.get(id(key))
        if hit is not None and hit[0]() is key:
            return hit[1]
        if isinstance(edata, EdgeFactors):
            if edata.src.requires_grad or edata.dst.requires_grad:
                raise ValueError("the feature exchange gathers the whole graph's edge weights "
                                 "once; these are learned (they require grad). Use "
                                 "--exchange halo or ring for this layer.")
            whole = self._factors(edata, self._num_own)
        else:
            if not isinstance(edata, torch.Tensor):
                raise TypeError(f"edge data must be tensors; got {type(edata).__name__}.")
            if edata.requires_grad:
                raise ValueError("the feature exchange gathers the whole graph's edge data "
                                 "once; this layer's edge data requires grad (made per call). "
                                 "Use --exchange halo or ring for this layer.")
            whole = _gather_var(edata, self.edges, self.group)
        self._edata[id(key)] = (weakref.ref(key), whole)
        return whole


# ------------------------------------------------------------------ the transposes
@dataclass
class _Layout:
    """One transpose's shape: this rank, the ranks' owned rows, and per tensor the column
    range each rank takes (``cols[i][j]``) with the tensor's trailing shape."""

    rank: int
    rows: list[int]
    cols: list[list[tuple[int, int]]]
    shapes: list[tuple[int, ...]]  # per tensor: its whole shape past the rows (or ())
    axes: list[int]  # per tensor: the dimension of shapes[i] the slices cut (leading 1s)
    group: Any
    traffic: Traffic
    record: ExchangeRecord | None

    def rest(self, i: int) -> int:
        return math.prod(self.shapes[i][self.axes[i] + 1:]) if self.shapes[i] else 1

    def shape(self, i: int, w: int) -> tuple[int, ...]:
        """Tensor ``i``'s shape past the rows with ``w`` columns at the cut."""
        if not self.shapes[i]:
            return ()
        sh = list(self.shapes[i])
        sh[self.axes[i]] = w
        return tuple(sh)

    def view(self, t: torch.Tensor, i: int) -> torch.Tensor:
        """``t`` (tensor ``i``, any width at the cut) as ``[rows, columns, rest]``."""
        return t.reshape(t.shape[0], -1, self.rest(i))

    def width(self, i: int, j: int) -> int:
        lo, hi = self.cols[i][j]
        return hi - lo


def _a2a(lay: _Layout, send: torch.Tensor, out_counts: list[int], in_counts: list[int],
         phase: str) -> torch.Tensor:
    recv = send.new_empty(sum(out_counts))
    t0 = time.perf_counter()
    if len(lay.rows) == 1:
        recv.copy_(send)
    else:
        dist.all_to_all_single(recv, send, output_split_sizes=out_counts,
                               input_split_sizes=in_counts, group=lay.group)
    mine = in_counts[lay.rank] if len(lay.rows) > 1 else 0
    nbytes = (send.numel() - mine) * send.element_size()
    lay.traffic.add("feature", nbytes)
    if lay.record is not None:
        lay.record.add(phase, nbytes, time.perf_counter() - t0)
    return recv


def _to_columns(lay: _Layout, ts: list[torch.Tensor], phase: str) -> list[torch.Tensor]:
    """Owned rows ``[D_r, S, ...]`` -> ``[N, S_r, ...]`` (rank ``r``'s columns)."""
    k, r = len(lay.rows), lay.rank
    parts, in_counts = [], []
    for j in range(k):
        n = 0
        for i, t in enumerate(ts):
            lo, hi = lay.cols[i][j]
            p = lay.view(t, i)[:, lo:hi].reshape(-1)
            parts.append(p)
            n += p.numel()
        in_counts.append(n)
    send = torch.cat(parts) if parts else ts[0].new_empty(0)
    out_counts = [sum(lay.rows[j] * lay.width(i, r) * lay.rest(i) for i in range(len(ts)))
                  for j in range(k)]
    recv = _a2a(lay, send, out_counts, in_counts, phase)
    pieces: list[list[torch.Tensor]] = [[] for _ in ts]
    off = 0
    for j in range(k):
        for i in range(len(ts)):
            n = lay.rows[j] * lay.width(i, r) * lay.rest(i)
            pieces[i].append(recv[off:off + n].view(lay.rows[j], lay.width(i, r), lay.rest(i)))
            off += n
    out = []
    for i, t in enumerate(ts):
        full = torch.cat(pieces[i])
        out.append(full.reshape((sum(lay.rows),) + lay.shape(i, lay.width(i, r))))
    return out


def _to_rows(lay: _Layout, ts: list[torch.Tensor], phase: str) -> list[torch.Tensor]:
    """The adjoint of :func:`_to_columns`: ``[N, S_r, ...]`` -> ``[D_r, S, ...]``, each
    rank's column slice put back in place (slices that overlap, whole terms, add up)."""
    k, r = len(lay.rows), lay.rank
    bounds = [0]
    for n in lay.rows:
        bounds.append(bounds[-1] + n)
    parts, in_counts = [], []
    for j in range(k):
        n = 0
        for i, t in enumerate(ts):
            p = lay.view(t, i)[bounds[j]:bounds[j + 1]].reshape(-1)
            parts.append(p)
            n += p.numel()
        in_counts.append(n)
    send = torch.cat(parts) if parts else ts[0].new_empty(0)
    d = lay.rows[r]
    out_counts = [sum(d * lay.width(i, j) * lay.rest(i) for i in range(len(ts)))
                  for j in range(k)]
    recv = _a2a(lay, send, out_counts, in_counts, phase)
    out = []
    for i, t in enumerate(ts):
        s = lay.shapes[i][lay.axes[i]] if lay.shapes[i] else 1
        out.append(t.new_zeros((d, s, lay.rest(i))))
    off = 0
    for j in range(k):
        for i in range(len(ts)):
            lo, hi = lay.cols[i][j]
            n = d * (hi - lo) * lay.rest(i)
            out[i][:, lo:hi] += recv[off:off + n].view(d, hi - lo, lay.rest(i))
            off += n
    return [o.reshape((d,) + tuple(lay.shapes[i])) for i, o in enumerate(out)]


def _fill(grads: tuple, like: list[tuple[tuple[int, ...], torch.dtype, torch.device]]) -> list:
    return [g if g is not None else torch.zeros(s, dtype=dt, device=dev)
            for g, (s, dt, dev) in zip(grads, like)]


class _Transpose(torch.autograd.Function):
    """One transpose (``forward``: :func:`_to_columns` or :func:`_to_rows`); backward runs
    the other on the gradients: each is the other's adjoint."""

    @staticmethod
    def forward(ctx: Any, lay: _Layout, to_columns: bool,
                *ts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = (_to_columns if to_columns else _to_rows)(lay, list(ts), "forward")
        ctx.lay, ctx.to_columns = lay, to_columns
        ctx.like = [(o.shape, o.dtype, o.device) for o in out]
        return tuple(out)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        back = _to_rows if ctx.to_columns else _to_columns
        return (None, None, *back(ctx.lay, _fill(grads, ctx.like), "backward"))


def _apply(to_columns: bool, lay: _Layout, ts: list[torch.Tensor]) -> list[torch.Tensor]:
    ts = [t.contiguous() for t in ts]
    if torch.is_grad_enabled() and any(t.requires_grad for t in ts):
        return list(_Transpose.apply(lay, to_columns, *ts))
    with torch.no_grad():
        return (_to_columns if to_columns else _to_rows)(lay, ts, "forward")


# ------------------------------------------------------------------ the layer
def feature_propagate(whole: WholeGraph, split: ColumnSplit, plan: Plan, terms: Any,
                      edata: Any, drop: Any, *, rank: int, rows: list[int], group: Any,
                      traffic: Traffic, record: ExchangeRecord | None = None) -> Any:
    """The accumulator ``[D_r, ...]`` of ``plan`` over the whole graph, this rank's
    columns aggregated here and the others' brought in (module docs; differentiable).
    ``drop``: the executor's attention dropout over the rank's local edges (its seeds are
    reused over the whole graph's edges), or ``None``."""
    k = len(rows)
    leaves, spec = flatten(terms)
    keys = spec if isinstance(spec, tuple) else (None,)
    src, dst = read_slots(plan, spec, len(leaves))
    moved = sorted(src | dst)
    slices = column_slices(split.width, k)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i in moved:
        by_dtype.setdefault(leaves[i].dtype, []).append(i)
    full: list[Any] = list(leaves)
    for _, idx in by_dtype.items():
        cols, shapes, axes = [], [], []
        for i in idx:
            t = leaves[i]
            shapes.append(tuple(t.shape[1:]))
            if keys[i] in split.sliced:
                cols.append(slices)
                axes.append(split.axis)
            else:
                cols.append([(0, t.shape[1] if t.dim() > 1 else 1)] * k)  # the whole row
                axes.append(0)
        lay = _Layout(rank, rows, cols, shapes, axes, group, traffic, record)
        for i, t in zip(idx, _apply(True, lay, [leaves[i] for i in idx])):
            full[i] = t
    n = whole.graph.num_nodes
    for i in range(len(full)):
        if i not in src and i not in dst:  # not read by the edge stage: no copy
            t = full[i]
            full[i] = t.new_zeros(()).expand((n,) + tuple(t.shape[1:]))
    if drop is not None and split.heads_dropout:
        from ngra.kernels import EdgeDropout  # lazy: the kernels package, only with dropout

        counter = whole.edge_ids * k + rank
        drop = EdgeDropout(drop.p, counter, drop.s1, drop.s2)
    elif drop is not None:
        from ngra.kernels import EdgeDropout  # lazy: the kernels package, only with dropout

        drop = EdgeDropout(drop.p, whole.edge_ids, drop.s1, drop.s2)
    lo, hi = slices[rank]
    acc = walk(sliced_plan(plan, hi - lo, split.axis), whole.graph, whole_graph_grid(whole.graph),
               unflatten(spec, full), whole.edata(edata), drop)
    ax = split.axis
    if not isinstance(acc, torch.Tensor) or acc.dim() < ax + 2:
        raise NotImplementedError(f"the feature exchange needs an accumulator with columns; "
                                  f"this layer's is {_what(acc)}.")
    if acc.shape[ax + 1] != hi - lo:
        raise AssertionError(f"the accumulator has {acc.shape[ax + 1]} columns, not the "
                             f"rank's slice [{lo}, {hi})")
    whole_shape = list(acc.shape[1:])
    whole_shape[ax] = split.width
    lay = _Layout(rank, rows, [slices], [tuple(whole_shape)], [ax], group, traffic, record)
    return _apply(False, lay, [acc])[0]


def _what(acc: Any) -> str:
    if isinstance(acc, torch.Tensor):
        return f"a tensor of shape {list(acc.shape)}"
    return f"a {type(acc).__name__}"
