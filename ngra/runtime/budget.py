"""Memory budgets: ``with ngra.memory_budget("1GB"): ...`` streams every layer call.

Inside the context the executor describes the layer's per-tile working set as a
:class:`ngra.partition.TileBytes` and asks :func:`ngra.partition.choose_grid` for
the smallest grid whose largest tile fits. The coefficients are measured, not
guessed: the plan's edge stage runs once on a sample tile (the first ~4096
edges) under autograd with saved-tensor hooks, which count the bytes a tile
keeps per edge and per destination row:

* ``bytes_per_edge = 2 * saved_per_edge + message_per_edge + 40`` -- saved
  activations, their gradients in the recomputing backward, the edge stage's
  result, and five int64 index arrays of the tile view
  (source, destination, edge id, reverse indices, reverse permutation);
* ``bytes_per_dst_row = 4 * partial_per_row`` -- the resident accumulator, the
  tile partial, the merge temporary and the gradient rows;
* ``bytes_per_src_row = (term row + 8) / GATHER_FRACTION`` -- one staged row of
  the vertex-side terms (what a device copy of a source row costs;
  ``prefetch_factor = 2`` for double buffering) and its reverse offset; a tile
  stages at most ``S / GATHER_FRACTION`` rows for ``S`` touched sources (it
  slices a span only when the span is under that, see :mod:`ngra.runtime.staging`);
* ``fixed = 3 * parameter bytes`` -- parameters with their gradients and
  in-flight copies.

The ``1 x 1`` grid is priced apart and taken whenever it fits: it
walks the graph's own arrays, so it stages no source rows, copies no edge data and builds
no tile index arrays (at most the backward's transpose instead: 4 bytes an edge and 4 a
row, 4 more an edge where the backward reads edge data; the sample tile tells which,
:class:`_SampleReverse`). It is priced twice: with that transpose (``LayerTileBytes.whole``),
and with the backward of a sum g-SpMM walking the CSC instead
(``LayerTileBytes.whole_walk``, :func:`ngra.kernels.transpose.prefer_csc_walk`: no transpose,
a slower pass, R-MAT 2^20 GCN epoch 1.12x). The first that fits is run, and only a
layer that needs the walk (or tiles) runs under it. Its
accumulator is the layer's output itself, a vertex array like its gradient (outside the
budget, below). It is charged what autograd saves per destination row and, per edge, all
that the forward and backward create (seen through a dispatch mode, not only what autograd
saves; summed as if alive at once), measured on a graph of its own: the first vertices'
induced subgraph run whole (:func:`_square_sample`), so the price is that of the kernels
the 1 x 1 grid runs (GAT's ``attention_aggregate``, which keeps nothing per edge, where a
tile runs ``softmax_aggregate`` with edge buffers: R-MAT 2^20 GAT under 2 GB tiled 4 x 1
at 1.6x the unbudgeted peak when priced from the tile kernel). A budget the whole layer fits in thus
runs as fast as no budget, and a layer that keeps nothing per edge or row (GCN's g-SpMM)
fits any budget above its parameters (walking the CSC where its transpose does not fit),
since tiling it divides nothing; an
edge program with per-row state (MPNN) or GAT's softmax still tiles under a tight budget.

Vertex arrays of size ``N x F`` (layer inputs, outputs, their gradients) live
outside the budget, as in NeuGraph, where they stay in host memory.

The first walk over a grid of several tiles also makes glibc return freed large blocks
(>= 1 MiB) to the OS at once (:func:`ngra.memstat.release_large_frees`): without it, the heap
arenas keep the per-tile temporaries of a chunked walk and the process peak drifts above
the working set. A budget the whole graph fits leaves the allocator as it is (page-faulting
every large buffer afresh cost the 1 x 1 GCN epoch at R-MAT 2^20 about 1.05x).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch.utils._pytree import tree_leaves

from ngra.compiler.plan import Plan
from ngra.compiler.tile import TileView
from ngra.graph import CSR, DeferredReverse, Graph, segment_ids
from ngra.idtype import idtype_for
from ngra.kernels.lean import vjp
from ngra.kernels.registry import thread_setting
from ngra.kernels.transpose import prefer_csc_walk
from ngra.livetensors import LeanDispatchMode
from ngra.partition import GridChoice, TileBytes, choose_grid, default_bounds, parse_bytes
from ngra.runtime.staging import GATHER_FRACTION, flatten, plan_parameters, unflatten
from ngra.runtime.stream import stager_for
from ngra.runtime.tiles import WalkGrid, lazy_grid, whole_graph_grid
from ngra.kernels import transpose_csc

__all__ = ["memory_budget", "current_budget", "grid_shape", "forced_grid", "measure_tile_cost",
           "LayerTileBytes", "ChosenGrid", "grid_for", "executor_grid", "row_bytes"]

_state = threading.local()
SAMPLE_EDGES = 4096
#: A tile view's five int64 index arrays, per edge (see the module docstring).
INDEX_BYTES_PER_EDGE = 40
#: The whole graph's backward transpose, per edge: int32 reverse indices, and int32
#: positions for a plan whose backward reads them (edge data); per source row, an offset.
TRANSPOSE_BYTES_PER_EDGE = 4
PERM_BYTES_PER_EDGE = 4
TRANSPOSE_BYTES_PER_ROW = 4


@contextlib.contextmanager
def memory_budget(size: int | float | str) -> Iterator[int]:
    """Run every layer call inside the block within ``size`` bytes of tile working set.

    Args:
        size: bytes, or a string such as ``"2GB"``, ``"512MB"``, ``"1.5GiB"``.
    Yields:
        The budget in bytes.
    """
    budget = parse_bytes(size)
    with thread_setting(_state, "budget", budget):
        yield budget


def current_budget() -> int | None:
    """The innermost active budget in bytes, or ``None``."""
    return getattr(_state, "budget", None)


@contextlib.contextmanager
def grid_shape(num_dst_parts: int, num_src_parts: int) -> Iterator[None]:
    """Force a ``P x Q`` grid (edge-balanced intervals) for every layer call in the block.

    For tests, benchmarks and experiments; it takes precedence over a memory budget.
    """
    for name, v in (("num_dst_parts", num_dst_parts), ("num_src_parts", num_src_parts)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1; got {v!r}.")
    with thread_setting(_state, "shape", (num_dst_parts, num_src_parts)):
        yield


def forced_grid(graph: Graph) -> WalkGrid | None:
    """The grid forced by :func:`grid_shape` for ``graph`` (cached on it), or ``None``."""
    shape = getattr(_state, "shape", None)
    if shape is None:
        return None
    p, q = min(shape[0], max(graph.num_nodes, 1)), min(shape[1], max(graph.num_nodes, 1))
    return graph.cached(f"ngra.forced-grid-{p}x{q}",
                        lambda: executor_grid(graph, *default_bounds(graph, p, q)))


def executor_grid(graph: Graph, dst_bounds: torch.Tensor, src_bounds: torch.Tensor) -> WalkGrid:
    """The grid the executor walks for these interval bounds.

    ``1 x 1`` is :func:`whole_graph_grid` over the graph's own arrays (no copy); any
    other shape is partition tiles with int32 indices when the ids fit (half the
    memory of int64; staged views use them as they are, see
    :func:`ngra.runtime.staging.local_view`), built a column at a time while the
    column is walked (:func:`~ngra.runtime.tiles.lazy_grid`), so they are part of the
    budgeted working set instead of resident beside it.
    """
    if dst_bounds.numel() == 2 and src_bounds.numel() == 2:
        return whole_graph_grid(graph)
    return lazy_grid(graph, dst_bounds, src_bounds,
                     idtype_for(max(graph.num_nodes, graph.num_edges)))


class _SampleReverse(DeferredReverse):
    """The sample tile's reverse, built before the measurement (the whole graph's is the
    graph's own CSR, priced apart: ``TRANSPOSE_BYTES_PER_EDGE``). Like the whole graph's,
    it counts as made only once a kernel uses it (:attr:`used`; a g-SpMM under a budget
    walks the CSC instead), and its positions once read (:attr:`read_perm`)."""

    __slots__ = ("_csr", "used")

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, num_src: int) -> None:
        rev_indptr, rev_indices, perm = transpose_csc(indptr, indices, num_src)
        self._csr = CSR(rev_indptr, rev_indices, make_perm=lambda: perm)
        self.used = False
        super().__init__(self._use, lambda: self._csr if self.used else None)

    def _use(self) -> CSR:
        self.used = True
        return self._csr

    @property
    def read_perm(self) -> bool:
        return self.used and self._csr.has_perm


def _sample_tile(graph: Graph, reverse: bool = False) -> TileView:
    """The first destinations holding about ``SAMPLE_EDGES`` edges, with global source ids
    (staged as the identity on sources); with ``reverse``, their reverse
    (:class:`_SampleReverse`: the 1 x 1 price reads whether it was used), else none (a tile's
    price counts its reverse in ``INDEX_BYTES_PER_EDGE``)."""
    indptr = graph.indptr
    m_target = min(graph.num_edges, SAMPLE_EDGES)
    d = int(torch.searchsorted(indptr, torch.tensor(m_target), right=False))
    d = max(1, min(d, graph.num_nodes))
    m = int(indptr[d])
    rev = _SampleReverse(indptr[: d + 1], graph.indices[:m], graph.num_nodes) if reverse else None
    return TileView(0, d, indptr[: d + 1], graph.indices[:m], torch.arange(m), rev)


def _nbytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(v) for v in x)
    return 0


def row_bytes(x: Any) -> int:
    """Bytes of one row of ``x`` (a tensor, a dict or tuple of them; 0 for none or no rows)."""
    if isinstance(x, torch.Tensor):
        return (x[0].numel() * x.element_size()) if x.dim() and x.shape[0] else 0
    if isinstance(x, dict):
        return sum(row_bytes(v) for v in x.values())
    if isinstance(x, (tuple, list)):
        return sum(row_bytes(v) for v in x)
    return 0


class _EdgeTensors(LeanDispatchMode):
    """Counts the bytes of every new (not a view) tensor with ``m`` rows the ops create."""

    def __init__(self, m: int) -> None:
        super().__init__()
        self.m, self.nbytes = m, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == self.m:
                    self.nbytes += _nbytes(t)
        return out


class _Sample(NamedTuple):
    """Bytes per sample-tile edge that autograd saves and that the forward and backward
    create, bytes saved per destination row, the partial, the tile."""

    saved_edge: float
    created_edge: float
    saved_row: float
    part: Any
    tile: TileView


def _saved_bytes(plan: Plan, graph: Graph, terms: Any, edata: Any,
                 whole: bool = False) -> _Sample:
    """What the edge stage of ``plan`` keeps and creates on a sample tile (:class:`_Sample`):
    a tile of the first destinations, or with ``whole`` the first vertices' induced
    subgraph run as a whole graph (:func:`_square_sample`), which runs the kernels the
    1 x 1 grid runs (GAT's ``attention_aggregate`` only there)."""
    sample = _square_sample(graph, terms, edata) if whole else None
    own: tuple = ()
    if sample is not None:
        tile, terms, edata = sample
        own = tuple(flatten(terms)[0])  # vertex arrays: outside the budget
    else:
        tile = _sample_tile(graph, reverse=whole)
    # the sample's backward must stop at the terms: the layer's own graph stays untouched
    terms, edata = _detached(terms), _detached(edata)
    stager = stager_for(plan, terms, edata, mode=None)
    st = stager.stage(tile)
    m, d = tile.num_edges, tile.num_dst
    saved = {"edge": 0, "row": 0}
    # the graph's own arrays (kernels save the tile's indices, a view of them, and its
    # per-vertex edge factors or edge data): not new memory
    factors = graph.edge_factors
    reverse = (tile.rev._csr.indptr, tile.rev._csr.indices) if tile.rev is not None else ()
    structure = {_storage(t) for t in (graph.indptr, graph.indices, tile.indptr, tile.src_idx,
                                       *reverse, *flatten(edata)[0], *own,
                                       *((factors.src, factors.dst) if factors else ()))}

    def pack(t: torch.Tensor) -> torch.Tensor:
        kind = "edge" if t.dim() and t.shape[0] == m else "row" if t.dim() and t.shape[0] == d \
            else None
        if kind is not None and _storage(t) not in structure:
            saved[kind] += _nbytes(t)
        return t

    created = _EdgeTensors(m)
    with torch.enable_grad(), created:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            part = st.run(plan)
        _sample_backward(plan, st, part)
    return _Sample(saved["edge"] / m, created.nbytes / m, saved["row"] / d, part, tile)


def _square_sample(graph: Graph, terms: Any, edata: Any) -> tuple[TileView, Any, Any] | None:
    """The subgraph induced by the first ``k`` vertices (``k`` doubled until it holds about
    ``SAMPLE_EDGES`` edges, or is the graph), as a whole-graph tile with its rows of the
    vertex terms and edge data; ``None`` when it has no edge (then the tile sample stands
    in)."""
    n, indptr, indices = graph.num_nodes, graph.indptr, graph.indices
    want = min(graph.num_edges, SAMPLE_EDGES)
    k = max(1, min(n, int(torch.searchsorted(indptr, torch.tensor(want)))))
    while True:
        ids = indices[: int(indptr[k])]
        keep = ids < k
        if int(keep.sum()) >= want // 4 or k >= n:
            break
        k = min(n, 2 * k)
    if not bool(keep.any()):
        return None
    dst = segment_ids(indptr[: k + 1], dtype=torch.int64)
    counts = torch.bincount(dst[keep], minlength=k)
    sub_indptr = torch.zeros(k + 1, dtype=indptr.dtype)
    torch.cumsum(counts, 0, out=sub_indptr[1:])
    sub_indices = ids[keep].contiguous()
    eids = torch.nonzero(keep).squeeze(1)
    t_leaves, t_spec = flatten(terms)
    terms = unflatten(t_spec, [t[:k] if t.dim() and t.shape[0] == n else t for t in t_leaves])
    e_leaves, e_spec = flatten(edata)
    by_vertex = e_spec == "factors"
    edata = unflatten(e_spec, [t[:k] if by_vertex else t.index_select(0, eids) for t in e_leaves])
    tile = TileView(0, k, sub_indptr, sub_indices, None,
                    _SampleReverse(sub_indptr, sub_indices, k), whole=True)
    return tile, terms, edata


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _detached(tree: Any) -> Any:
    """Vertex or edge data (:func:`~ngra.runtime.staging.flatten`) as new autograd leaves."""
    leaves, spec = flatten(tree)
    return unflatten(spec, [t.detach().requires_grad_(t.requires_grad) for t in leaves])


def _sample_backward(plan: Plan, st: Any, part: Any) -> None:
    """The sample tile's backward, for what it creates per edge (its gradients are
    returned and dropped: nothing accumulates into the parameters)."""
    outs = [t for t in tree_leaves(part) if isinstance(t, torch.Tensor) and t.requires_grad]
    staged = [t for tree in (st.src, st.dst, st.edata) for t in flatten(tree)[0]]
    wrt = [t for t in staged + plan_parameters(plan) if t.requires_grad]
    if outs and wrt:
        vjp(outs, wrt, [torch.ones_like(t) for t in outs], allow_unused=True)


class LayerTileBytes(NamedTuple):
    """A layer's working set on a tile of a grid of several (``tiles``) and on the ``1 x 1``
    grid, with the backward's transpose (``whole``) and with a sum g-SpMM's backward
    walking the CSC instead (``whole_walk``), see the module docstring."""

    tiles: TileBytes
    whole: TileBytes
    whole_walk: TileBytes


def measure_tile_cost(plan: Plan, graph: Graph, terms: Any, edata: Any,
                      params: list[torch.Tensor]) -> LayerTileBytes:
    """The layer's :class:`LayerTileBytes`, measured on a sample tile (see module docs)."""
    fixed = float(3 * _nbytes(params))
    if graph.num_edges == 0:
        none = TileBytes(0, 0, 0, fixed=fixed)
        return LayerTileBytes(none, none, none)
    s = _saved_bytes(plan, graph, terms, edata)
    tiles = TileBytes(
        bytes_per_src_row=float((row_bytes(terms) + 8) / GATHER_FRACTION),
        bytes_per_dst_row=float(4 * max(_nbytes(s.part) / s.tile.num_dst, s.saved_row)),
        bytes_per_edge=float(2 * s.saved_edge + INDEX_BYTES_PER_EDGE + row_bytes(edata)),
        fixed=fixed,
    )
    # the 1 x 1 grid's kernels, measured on a small graph of their own
    whole = _whole_cost(plan, graph, terms, edata, fixed)
    with prefer_csc_walk():
        walk = _whole_cost(plan, graph, terms, edata, fixed)
    return LayerTileBytes(tiles, whole, walk)


def _whole_cost(plan: Plan, graph: Graph, terms: Any, edata: Any, fixed: float) -> TileBytes:
    """The ``1 x 1`` grid's price, from the first vertices' induced subgraph run whole (its
    fused kernels keep the dst partials that they will keep on the whole graph)."""
    with plan.judged_on(graph.indptr):
        s = _saved_bytes(plan, graph, terms, edata, whole=True)
    # staged edge data is a copy on a tile, the graph's own array on the whole graph
    created = max(s.created_edge - row_bytes(edata), 0.0)
    rev = s.tile.rev  # the whole graph's is made only where the sample's was used
    transpose = (TRANSPOSE_BYTES_PER_EDGE + PERM_BYTES_PER_EDGE * rev.read_perm) * rev.used
    return TileBytes(bytes_per_src_row=0.0,
                    bytes_per_dst_row=float(s.saved_row + TRANSPOSE_BYTES_PER_ROW * rev.used),
                    bytes_per_edge=float(max(created, 2 * s.saved_edge) + transpose),
                    fixed=fixed, prefetch_factor=1)


class ChosenGrid(NamedTuple):
    """What :func:`grid_for` picked: the grid, the search's choice, and whether the layer's
    backward must walk the CSC instead of transposing (run it under
    :func:`~ngra.kernels.transpose.prefer_csc_walk`)."""

    grid: WalkGrid
    choice: GridChoice
    walk_csc: bool


def grid_for(plan: Plan, graph: Graph, terms: Any, edata: Any, params: list[torch.Tensor],
             budget: int) -> ChosenGrid:
    """The grid for this layer under ``budget``: the whole graph with its backward's
    transpose, else the whole graph walking the CSC in backward, else the smallest tiling.

    Cached on the graph per plan and budget (the plan is kept in the entry, so
    a recycled ``id`` can never match), and per cost, so layers with the same
    working set share one tiling.
    """
    cache = graph._cache
    pkey = ("ngra.plan-grid", id(plan), budget)
    hit = cache.get(pkey)
    if hit is not None and hit[0] is plan:
        return hit[1]
    cost = measure_tile_cost(plan, graph, terms, edata, params)
    ckey = ("ngra.grid", budget, cost)
    if ckey not in cache:
        cache[ckey] = _pick(graph, cost, budget)
    cache[pkey] = (plan, cache[ckey])
    return cache[ckey]


def _pick(graph: Graph, cost: LayerTileBytes, budget: int) -> ChosenGrid:
    # the whole graph when it fits: nothing to tile, stage or rebuild
    for whole, walk in ((cost.whole, False), (cost.whole_walk, True)):
        try:
            choice = choose_grid(graph, whole, budget, max_parts=1, verify=False)
        except ValueError:
            continue
        return ChosenGrid(whole_graph_grid(graph), choice, walk)
    choice = choose_grid(graph, cost.tiles, budget, verify=False)
    return ChosenGrid(executor_grid(graph, choice.dst_bounds, choice.src_bounds), choice, True)
