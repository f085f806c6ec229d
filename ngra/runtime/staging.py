"""Tile staging: the vertex rows a tile touches, sliced or gathered, with local ids.

Before its edge stage a partition tile (:class:`ngra.partition.Tile`) is staged:

* source-side term rows are either a contiguous **span** ``terms[s_lo:s_hi]``
  (``s_lo``, ``s_hi - 1``: the smallest and largest source the tile touches; a
  zero-copy view on the same device, one contiguous copy to another device) or a
  **gather** ``terms.index_select(0, src_rows)`` of the tile's unique sources
  (NeuGraph's selective transfer), by the rule of :func:`choose_mode`;
* destination-side term rows are the slice ``terms[dst_lo:dst_hi]``;
* edge data rows are gathered by the tile's edge ids, and so are the edge counters of
  an attention dropout (:class:`~ngra.kernels.EdgeDropout`: the tile's masks are the
  whole graph's, whatever the grid);
* the tile's indices become local to the staged rows (:class:`TileView`): source
  ids index the staged source rows, destination ids are ``dst - dst_lo``, and the
  reverse structure runs over the staged source rows only, built from the
  partition tile's CSR (``O(span + S)``, never ``O(N)``).

The whole-graph tile of the 1 x 1 grid (a :class:`TileView` with global ids) is
staged as the identity: no copies.

Gradients never materialize an ``[N, ...]`` tensor per tile. Under plain
autograd a staged block is a :class:`_Stage` node whose backward adds its rows
into one per-propagation gradient sink (``index_add_`` for a gather, a slice
add for a span); the sink is handed to the term's own gradient once every tile's
backward has run (:class:`_Anchor`). The recomputing backward of
:class:`ngra.runtime.stream.StreamedPropagation` stages fresh leaves instead
(``Stager(..., leaves=True)``) and accumulates their gradients the same way.

Tests and experiments force a mode with :func:`staging_mode`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ngra.graph import EdgeFactors
from ngra.kernels.registry import thread_setting
from ngra.compiler.plan import Plan
from ngra.compiler.tile import TileView
from ngra.runtime.tiles import WalkGrid, TileRef

__all__ = ["GATHER_FRACTION", "Rows", "Staged", "Stager", "choose_mode", "flatten",
           "forced_mode", "local_view", "plan_parameters", "read_slots", "staging_mode",
           "staging_summary", "unflatten"]

# Gather a tile's source rows when it touches fewer than this fraction of its span.
# A span moves every row of [s_lo, s_hi) as one contiguous stream; a gather moves only
# the S touched rows, but as random row reads, which run at about half the bandwidth of
# a contiguous copy (this machine: random 512-byte row gather 13-15 GB/s vs copy 26-29
# GB/s; host gather + PCIe copy vs one PCIe copy is the same trade on a GPU). The two
# cost the same at S / span = 1/2. The same break-even holds for the backward side:
# a span's gradient block (allocated, written, slice-added) costs span contiguous rows,
# a gather's costs S rows with a random-access index_add_. On one device the forward
# span is a free view, which makes gather's break-even lower, but the backward block of
# a sparse span (span >> S) is the O(N x F)-per-tile cost staging exists to remove.
GATHER_FRACTION = 0.5

MODES = ("gather", "span")

_state = threading.local()


@contextlib.contextmanager
def staging_mode(mode: str | None) -> Iterator[None]:
    """Force how every tile's source rows are staged in the block.

    Args:
        mode: ``"gather"`` (selective: only the tile's unique sources), ``"span"``
            (the contiguous span of its sources) or ``None`` (the cost rule of
            :func:`choose_mode`). For tests and experiments.
    """
    if mode is not None and mode not in MODES:
        raise ValueError(f"staging mode must be one of {MODES} or None; got {mode!r}.")
    with thread_setting(_state, "mode", mode):
        yield


def forced_mode() -> str | None:
    """The mode forced by :func:`staging_mode` in this thread, or ``None``."""
    return getattr(_state, "mode", None)


def plan_parameters(plan: Plan) -> list[torch.nn.Parameter]:
    """Parameters the plan's edge stage may read (:meth:`Plan.edge_parameters`)."""
    return plan.edge_parameters()


def choose_mode(num_rows: int, span: int, forced: str | None = None) -> str:
    """``"gather"`` when ``num_rows < GATHER_FRACTION * span`` (or when forced), else ``"span"``."""
    if forced is not None:
        return forced
    return "gather" if num_rows < GATHER_FRACTION * span else "span"


class Rows:
    """Which rows of an ``[N, ...]`` tensor a staged block holds.

    ``index`` (a gather of those rows), else ``[lo, hi)`` (``hi=None``: every row).
    """

    __slots__ = ("hi", "index", "lo")

    def __init__(self, lo: int = 0, hi: int | None = None, index: torch.Tensor | None = None):
        self.lo, self.hi, self.index = lo, hi, index

    def covers(self, t: torch.Tensor) -> bool:
        """Whether these are all of ``t``'s rows, in order (staging is the identity)."""
        return self.index is None and self.lo == 0 and self.hi in (None, t.shape[0])

    def take(self, t: torch.Tensor) -> torch.Tensor:
        if self.index is not None:
            return t.index_select(0, self.index)
        return t if self.covers(t) else t[self.lo:self.hi]

    def add_into(self, total: torch.Tensor, g: torch.Tensor) -> None:
        """``total[rows] += g``: ``index_add_`` for a gather, a slice add for a span."""
        if self.index is not None:
            total.index_add_(0, self.index, g)
        elif self.covers(total):
            total.add_(g)
        else:
            total[self.lo:self.hi].add_(g)


def local_view(tile: Any, mode: str) -> tuple[TileView, Rows]:
    """A partition tile's view with ids local to its staged source rows, and those rows.

    A gathering tile's view uses the tile's own index arrays (no copy, in the
    tile's index dtype; kernels take int32 or int64 ids): autograd keeps the
    views of every tile until backward, so copies here would cost O(E) memory
    per layer. A span remaps source ids (one new ``[E_t]`` array in the tile's
    dtype) and spreads the reverse offsets over the span.
    """
    src_rows, rev_ptr = tile.src_rows, tile.csr_indptr.long()
    if mode == "gather" or src_rows.numel() == 0:
        src_idx, rows = tile.indices, Rows(index=src_rows.long())
    else:
        lo, hi = int(src_rows[0]), int(src_rows[-1]) + 1
        local = (src_rows - lo).to(tile.indices.dtype)
        src_idx, rows = local.index_select(0, tile.indices.long()), Rows(lo, hi)
        per_row = torch.zeros(hi - lo, dtype=torch.int64)
        per_row[local.long()] = rev_ptr[1:] - rev_ptr[:-1]
        rev_ptr = torch.zeros(hi - lo + 1, dtype=torch.int64)
        torch.cumsum(per_row, 0, out=rev_ptr[1:])
    view = TileView(tile.dst_lo, tile.dst_hi, tile.indptr.long(), src_idx, tile.edge_ids,
                    (rev_ptr, tile.csr_indices, tile.csr_perm), key=(tile.col, tile.row))
    return view, rows


class Staged:
    """A tile ready for its edge stage.

    Attributes:
        view: the :class:`TileView` (ids local to the staged rows).
        src, dst: the staged source / destination term rows, shaped like the terms.
        edata: the tile's edge data rows (tile-CSC order), shaped like the edge data.
        drop: the attention dropout on the tile's edges (an
            :class:`~ngra.kernels.EdgeDropout` with their counters), or ``None``.
        mode: ``"whole"`` (identity), ``"span"`` or ``"gather"``.
        leaves: ``(slot, leaf, rows)`` of each staged leaf when staged with
            ``leaves=True`` (``slot`` counts term leaves, then edge-data leaves).
    """

    __slots__ = ("drop", "dst", "edata", "leaves", "mode", "src", "view")

    def __init__(self, view: TileView, mode: str) -> None:
        self.view, self.mode = view, mode
        self.src = self.dst = self.edata = self.drop = None
        self.leaves: list[tuple[int, torch.Tensor, Rows]] = []

    def run(self, plan: Plan, carry: Any = None) -> Any:
        """The plan's edge stage on this tile (``carry``: what ``plan.pre`` handed on)."""
        return plan.edge(self.view, self.src, self.dst, self.edata, self.drop, carry)


class Stager:
    """Stages the tiles of one propagation (see the module docstring).

    Args:
        terms: the vertex terms ``[N, ...]`` (a tensor or a dict of tensors).
        edata: edge data in CSC order (a tensor, a dict of tensors, or ``None``).
        reads: ``(src_keys, dst_keys)``: the term keys the edge stage reads per side
            (``None``: all). Terms a side never reads are not staged for it.
        mode: force ``"gather"`` or ``"span"`` (default ``None``: :func:`choose_mode`).
        leaves: stage fresh leaves that require grad, recorded in
            :attr:`Staged.leaves` (the recomputing backward), instead of tracking
            staging under autograd.
        drop: a softmax gather's attention dropout over the graph's CSC edges (an
            :class:`~ngra.kernels.EdgeDropout`); each tile gets it on its own edges.
    """

    def __init__(self, terms: Any, edata: Any, reads: tuple[Any, Any] | None = None,
                 leaves: bool = False, mode: str | None = None, drop: Any = None) -> None:
        self.t_leaves, self.t_spec = flatten(terms)
        self.e_leaves, self.e_spec = flatten(edata)
        keys = self.t_spec if isinstance(self.t_spec, tuple) else None
        src_keys, dst_keys = reads if reads is not None else (None, None)
        self.src_slots = _slots(keys, src_keys, len(self.t_leaves))
        self.dst_slots = _slots(keys, dst_keys, len(self.t_leaves))
        self.mode = mode
        self.leaves = leaves
        self.drop = drop
        self._sinks: dict[int, tuple[_Sink, torch.Tensor]] = {}
        self._lock = threading.Lock()

    def stage(self, tile: Any) -> Staged:
        """Stage ``tile``: a partition tile, or a :class:`TileView` with global ids (identity)."""
        if isinstance(tile, TileRef):  # a lazy grid's tile: built now, in the prefetch thread
            tile = tile.build()
        if isinstance(tile, TileView):
            view, src_rows, mode = tile, Rows(), "whole"
            dst_rows = Rows(tile.dst_lo, tile.dst_hi)
            edge_rows = Rows(index=tile.edge_ids)
        else:
            mode = "gather"
            if tile.num_src_rows:
                span = int(tile.src_rows[-1]) - int(tile.src_rows[0]) + 1
                mode = choose_mode(tile.num_src_rows, span, self.mode)
            view, src_rows = local_view(tile, mode)
            dst_rows = Rows(tile.dst_lo, tile.dst_hi)
            edge_rows = Rows(index=view.edge_ids)
        st = Staged(view, mode)
        nt = len(self.t_leaves)
        st.src = unflatten(self.t_spec, [
            self._leaf(i, self.t_leaves[i], src_rows, st) if i in self.src_slots else None
            for i in range(nt)], keep=self.src_slots)
        st.dst = unflatten(self.t_spec, [
            self._leaf(i, self.t_leaves[i], dst_rows, st) if i in self.dst_slots else None
            for i in range(nt)], keep=self.dst_slots)
        # factored edge weights stage like vertex data: source and destination factor rows
        e_rows = (src_rows, dst_rows) if self.e_spec == "factors" else (edge_rows,) * 2
        st.edata = unflatten(self.e_spec, [self._leaf(nt + j, t, e_rows[min(j, 1)], st)
                                           for j, t in enumerate(self.e_leaves)])
        if self.drop is not None:
            st.drop = self.drop.take(view.edge_ids)  # keeps the whole graph's reverse counters
        return st

    # ---------------------------------------------------------------- internals
    def _leaf(self, slot: int, t: torch.Tensor, rows: Rows, st: Staged) -> torch.Tensor:
        wants_grad = t.requires_grad and t.is_floating_point()
        if self.leaves and wants_grad:
            x = rows.take(t.detach()).detach().requires_grad_()
            st.leaves.append((slot, x, rows))
            return x
        if wants_grad and torch.is_grad_enabled() and not rows.covers(t):
            sink, token = self._sink(slot, t)
            return _Stage.apply(token, t, rows, sink)
        return rows.take(t)

    def _sink(self, slot: int, t: torch.Tensor) -> tuple[_Sink, torch.Tensor]:
        with self._lock:
            if slot not in self._sinks:
                sink = _Sink()
                self._sinks[slot] = (sink, _Anchor.apply(sink, t))
            return self._sinks[slot]


class _Sink:
    """One propagation's gradient of one term: allocated once, filled tile by tile."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None


class _Anchor(torch.autograd.Function):
    """Hands a term its sink's gradient after every tile's :class:`_Stage` backward has run.

    Its output (a scalar token) feeds each tile's staging, so autograd runs this
    node's backward only once all of them are done.
    """

    @staticmethod
    def forward(ctx: Any, sink: _Sink, t: torch.Tensor) -> torch.Tensor:
        ctx.sink = sink
        return t.new_zeros(())

    @staticmethod
    def backward(ctx: Any, _: torch.Tensor) -> tuple[None, torch.Tensor | None]:
        total, ctx.sink.total = ctx.sink.total, None
        return None, total


class _Stage(torch.autograd.Function):
    """One staged block of a term; backward adds its rows into the term's sink."""

    @staticmethod
    def forward(ctx: Any, token: torch.Tensor, t: torch.Tensor, rows: Rows,
                sink: _Sink) -> torch.Tensor:
        ctx.rows, ctx.sink, ctx.like = rows, sink, (t.shape, t.dtype, t.device)
        ctx.token = (token.dtype, token.device)
        return rows.take(t)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        shape, dtype, device = ctx.like
        if ctx.sink.total is None:
            ctx.sink.total = torch.zeros(shape, dtype=dtype, device=device)
        ctx.rows.add_into(ctx.sink.total, g)
        return torch.zeros((), dtype=ctx.token[0], device=ctx.token[1]), None, None, None


def staging_summary(grid: WalkGrid, mode: str | None = None) -> str:
    """How the cost rule (or a forced ``mode``) stages ``grid``'s tiles, as one line."""
    tiles = [t.build() if isinstance(t, TileRef) else t for col in grid.columns for t in col
             if not isinstance(t, TileView) and t.num_edges]
    if not tiles:
        return "staging: whole graph (identity, no copies)"
    counts = {"gather": 0, "span": 0}
    moved = spans = 0
    for t in tiles:
        span = int(t.src_rows[-1]) - int(t.src_rows[0]) + 1
        m = choose_mode(t.num_src_rows, span, mode)
        counts[m] += 1
        moved += t.num_src_rows if m == "gather" else span
        spans += span
    return (f"staging: {counts['gather']} of {len(tiles)} tiles gather their source rows, "
            f"{counts['span']} slice a span; {moved} source rows staged vs {spans} in spans")


# ---------------------------------------------------------------- flat pytrees
def flatten(tree: Any) -> tuple[list[torch.Tensor], Any]:
    """Leaves and spec of vertex or edge data: ``None``, a tensor, a dict of tensors, or
    :class:`~ngra.graph.EdgeFactors` (two leaves: source and destination factors)."""
    if tree is None:
        return [], None
    if isinstance(tree, torch.Tensor):
        return [tree], "t"
    if isinstance(tree, EdgeFactors):
        return [tree.src, tree.dst], "factors"
    if isinstance(tree, Mapping) and all(isinstance(v, torch.Tensor) for v in tree.values()):
        return list(tree.values()), tuple(tree)
    raise TypeError("streaming: vertex/edge data must be a tensor or a dict of tensors; got "
                    f"{type(tree).__name__}.")


def unflatten(spec: Any, leaves: list[Any], keep: Any = None) -> Any:
    """The inverse of :func:`flatten`; with ``keep``, a dict holds only those leaf slots."""
    if spec is None:
        return None
    if spec == "t":
        return leaves[0]
    if spec == "factors":
        return EdgeFactors(leaves[0], leaves[1])
    return {k: v for i, (k, v) in enumerate(zip(spec, leaves)) if keep is None or i in keep}


def read_slots(plan: Plan, spec: Any, n: int) -> tuple[frozenset[int], frozenset[int]]:
    """``(source slots, destination slots)``: which of the ``n`` flattened term leaves
    (:func:`flatten`'s ``spec``) ``plan``'s edge stage reads on each side (all, when the
    plan does not say)."""
    src_keys, dst_keys = plan.edge_reads() or (None, None)
    keys = spec if isinstance(spec, tuple) else None
    return _slots(keys, src_keys, n), _slots(keys, dst_keys, n)


def _slots(keys: tuple | None, wanted: Any, n: int) -> frozenset[int]:
    if keys is None or wanted is None:
        return frozenset(range(n))
    return frozenset(i for i, k in enumerate(keys) if k in wanted)
