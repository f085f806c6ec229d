"""numba ``fused_edge_aggregate``: kernels generated from the edge expression.

For each :class:`~ngra.kernels._edge_spec.KernelSpec` (pass, dtype, expression,
reducer, term layout, wanted gradients; the same spec the Triton backend generates
from) the code generator (:mod:`ngra.kernels.cpu._codegen`) writes the source of one
``@njit(nogil=True, cache=True)`` kernel over a range of rows, the expression inlined
as scalar code in the loop over feature columns; :func:`~ngra.kernels.cpu.util.run_rows`
runs it on edge-balanced row ranges in ``torch.get_num_threads()`` threads. The
source is saved as a real module file named by its hash in the kernel cache
directory and imported from there, so
numba's on-disk cache (``__pycache__`` beside that file) lets a second process reuse
the compiled machine code. Within a process each kernel is imported once; numba
compiles it once per index dtype (int32/int64; the float dtype is part of the spec).

Cache directory: :func:`ngra.kernels._edge_spec.cache_dir` ``("numba")``
(``$NGRA_CACHE/numba`` or ``~/.cache/ngra/numba``).

Passes (no atomics; no ``[E, F]`` tensor):

* forward: rows = destinations (CSC); ``fused_edge_fwd_partials`` also sums the dst
  terms' partial derivatives there, so that their gradients need no pass at all (where
  ``fused_edge_partials_pay``: the dense graphs of the one-walk backward below);
* backward, when src terms and dst or edge terms all want gradients: one walk over
  sources (reverse CSR); dst-term gradients are added into one buffer per thread
  (on graphs with :data:`ONE_PASS_MIN_DEGREE` edges per destination and extra thread);
* otherwise, backward of dst and edge terms: the same walk over destinations as the
  forward; backward of src terms: rows = sources, walking the reverse CSR.

``fused_edge_multi_fwd``/``_bwd`` (several outputs, each with its own expression and
reducer: ``KernelSpec.outputs``) run the same passes, every output accumulated in the one
walk forward and every output's share of a term's gradient added in each backward walk.

Accumulators and the expression use the terms' dtype (float32 sums as torch's index_add does).
"""

from __future__ import annotations

import logging
import platform
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ngra.kernels import _edge_spec
from ngra.kernels._edge_spec import KernelSpec
from ngra.kernels.cpu._codegen import CODEGEN_VERSION, generate
from ngra.kernels.cpu.util import as_numpy, prefetch_distance, row_threads, run_rows
from ngra.kernels.fused_edge import FusedEdgeCall
from ngra.kernels.registry import register

__all__ = ["fused_edge_fwd", "fused_edge_fwd_partials", "fused_edge_partials_pay",
           "fused_edge_shared_rows",
           "fused_edge_bwd", "kernel_for", "cache_dir", "module_name", "FLUSH_DENORMALS",
           "ONE_PASS_BACKWARD", "ONE_PASS_MIN_DEGREE"]

log = logging.getLogger(__name__)

_KERNELS: dict[KernelSpec, tuple[Callable, np.ndarray]] = {}
_LOCK = threading.Lock()

#: Generated kernels run with subnormal floats flushed to zero (x86 MXCSR FTZ and DAZ,
#: set on entry and restored on return, per thread). A saturated sigmoid or exp makes
#: values below ~1e-38 (float32) whose products are subnormal; each subnormal operation
#: costs ~100 cycles, and G-GCN's second layer (gate inputs of |z| ~ 100 on R-MAT hubs)
#: ran 3-4x slower without the flush. Results differ from torch's (which keeps
#: subnormals) by less than the smallest normal float per term.
FLUSH_DENORMALS = platform.machine().lower() in ("x86_64", "amd64")
FTZ_DAZ = 0x8040  # MXCSR bit 15 (flush to zero) | bit 6 (denormals are zero)

#: Backward with both src and dst/edge gradients wanted runs as one walk over sources
#: (``bwd_all``) instead of a walk over destinations plus one over sources: the
#: expression is evaluated once per edge instead of twice. Tests switch it off to
#: check the two forms against each other.
ONE_PASS_BACKWARD = True
#: ... when the graph has at least this many edges per destination and extra thread:
#: each thread beyond the first adds a ``[num_dst, F]`` buffer per dst term (memory,
#: zeroing and a final sum), which a second evaluation per edge outweighs only on
#: denser graphs. G-GCN on R-MAT 2^16 (15 edges per destination, 2 threads): forward +
#: backward 0.85x of the two walks (``kernel_probes.py fused-edge-bwd``); on Cora (4.9):
#: the same time within noise and +15 MB of training memory (``train_bench.py --models
#: ggcn --graphs cora``). On such dense graphs full-width dst terms skip both: the
#: forward sums their partials (:func:`fused_edge_partials_pay`; 0.80x in the same probe).
ONE_PASS_MIN_DEGREE = 8


# ============================================================================ FP environment
def _mxcsr_fn(builder, name: str):
    fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer()])
    return cgutils.get_or_insert_function(builder.module, fnty, name)


@intrinsic
def mxcsr_get(typingctx):
    """The calling thread's x86 MXCSR register (numba intrinsic; x86 only)."""
    def codegen(context, builder, signature, args):
        slot = cgutils.alloca_once(builder, ir.IntType(32))
        builder.call(_mxcsr_fn(builder, "llvm.x86.sse.stmxcsr"),
                     [builder.bitcast(slot, ir.IntType(8).as_pointer())])
        return builder.load(slot)

    return types.uint32(), codegen


@intrinsic
def mxcsr_set(typingctx, value):
    """Load ``value`` into the calling thread's x86 MXCSR register (numba intrinsic)."""
    if not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        slot = cgutils.alloca_once(builder, ir.IntType(32))
        v = context.cast(builder, args[0], signature.args[0], types.uint32)
        builder.store(v, slot)
        builder.call(_mxcsr_fn(builder, "llvm.x86.sse.ldmxcsr"),
                     [builder.bitcast(slot, ir.IntType(8).as_pointer())])
        return context.get_dummy_value()

    return types.void(value), codegen


# ============================================================================ kernel cache
def cache_dir() -> Path:
    """Where generated kernel modules (and numba's cache of them) live."""
    return _edge_spec.cache_dir("numba")


def module_name(spec: KernelSpec) -> str:
    """The generated module (and file) name of ``spec``."""
    return f"ngra_fused_edge_{spec.digest(CODEGEN_VERSION)}"


def kernel_for(spec: KernelSpec) -> tuple[Callable, np.ndarray]:
    """The compiled-on-first-call kernel of ``spec`` and its constants (in ``spec.dtype``)."""
    hit = _KERNELS.get(spec)
    if hit is not None:
        return hit
    with _LOCK:
        hit = _KERNELS.get(spec)
        if hit is not None:
            return hit
        source, consts = generate(spec)
        module = _edge_spec.load_module("numba", module_name(spec), source)
        log.debug("fused_edge kernel %s: %s %s", module.__name__, spec.kind, spec.expr)
        hit = (module.kernel, np.asarray(consts, dtype=np.dtype(spec.dtype)))
        _KERNELS[spec] = hit
        return hit


# ============================================================================ helpers
def _layout(call: FusedEdgeCall, groups: dict[str, list[torch.Tensor]], num_dst: int):
    """The leaves the expression reads, with width flags, their numpy arrays, and the
    shared dst rows (one row that every destination reads, see
    :func:`fused_edge_shared_rows`)."""
    used = call.leaves()
    layout = tuple((k, i, groups[k][i].shape[1] != 1) for k, i in used)
    arrays = [as_numpy(groups[k][i]) for k, i in used]
    shared = tuple((k, i) for k, i in used
                   if k == "dst" and num_dst != 1 and groups[k][i].shape[0] == 1)
    return layout, arrays, shared


def _dtype_name(dtype: torch.dtype) -> str:
    return "float32" if dtype == torch.float32 else "float64"


def _spec(kind: str, call: FusedEdgeCall, layout, grads, shared) -> KernelSpec:
    """The kernel spec of ``call`` (one output or several) for pass ``kind``."""
    return KernelSpec(kind, _dtype_name(call.dtype), call.expr, call.reduce, layout, grads,
                      FLUSH_DENORMALS, shared, call.outputs)


def _gathered_bytes(layout, groups: dict[str, list[torch.Tensor]], kinds: tuple[str, ...],
                    shared: tuple = ()) -> int:
    """Bytes of the wide rows of ``kinds`` read per edge (a shared row stays in cache):
    sets the prefetch distance and tells :func:`run_rows` how much work an edge is."""
    return max(1, sum(groups[k][i].shape[1] * groups[k][i].element_size()
                      for k, i, wide in layout if wide and k in kinds and (k, i) not in shared))


def _rev_args(get_rev) -> tuple[np.ndarray, list[np.ndarray]]:
    """The reverse CSR as the source-walking kernels take it: ``(rev_indptr, [rev_indptr,
    rev_indices, rev_perm])`` as int64 offsets and positions."""
    rev_indptr, rev_indices, rev_perm = get_rev()
    rp = as_numpy(rev_indptr.to(torch.int64).contiguous())
    return rp, [rp, as_numpy(rev_indices.contiguous()),
                as_numpy(rev_perm.to(torch.int64).contiguous())]


def _walk_row_bytes(layout, groups, g: list[np.ndarray], dst_terms, shared: tuple) -> int:
    """Bytes a source walk touches at random per edge: the destination's gathered rows,
    its ``g`` rows (one per output) and, with dst gradients, the rows it adds them into."""
    return (_gathered_bytes(layout, groups, ("dst", "edge"), shared)
            + sum(x.shape[1] * x.itemsize for x in g)
            + sum(groups[k][i].shape[1] * groups[k][i].element_size() for k, i in dst_terms
                  if (k, i) not in shared))


def _one_pass_pays(ip: np.ndarray, rp: np.ndarray, layout, groups, g, dst_side,
                   shared: tuple) -> bool:
    """Whether the dst/edge gradients should join the source walk: each thread beyond
    the first adds a ``[num_dst, F]`` buffer per dst term (a shared row's is one row),
    worth it only at :data:`ONE_PASS_MIN_DEGREE` edges per destination and extra thread."""
    dst_terms = [ki for ki in dst_side if ki[0] == "dst"]
    threads = row_threads(rp, _walk_row_bytes(layout, groups, g, dst_terms, shared))
    return all(ki in shared for ki in dst_terms) or _dense_for_buffers(ip, threads)


def _dense_for_buffers(ip: np.ndarray, threads: int) -> bool:
    """At least :data:`ONE_PASS_MIN_DEGREE` edges per destination and thread beyond the
    first (``ip`` the CSC offsets): dense enough for per-thread dst buffers to pay."""
    num_dst, num_edges = ip.shape[0] - 1, int(ip[-1])
    return num_edges >= ONE_PASS_MIN_DEGREE * (threads - 1) * num_dst


def _source_walk(ip, rp, rev_args, call, layout, arrays, shared, groups, g, extra,
                 src_side, dst_side, grads) -> None:
    """The gradients of ``src_side`` (and of ``dst_side``, ``bwd_all``) from one walk over
    sources.

    Src gradients go to the walked row, edge gradients to the edge's row. Each thread
    adds its edges' dst-term gradients into a buffer of its own: thread 0 into the
    returned gradient, the others into scratch rows summed into it at the end (one
    ``[num_dst, F]`` buffer more per extra thread and dst term; a shared row's is
    one row). A destination's
    in-edges are summed in source order, split over threads, so in float32 a hub's
    gradient rounds differently from the edge-order sums of the other backends (as far
    from the exact value, on average, as any sequential float32 sum).
    """
    dst_terms = tuple(ki for ki in dst_side if ki[0] == "dst")
    edge_terms = tuple(ki for ki in dst_side if ki[0] == "edge")
    order = src_side + edge_terms + dst_terms  # the kernel's argument order
    spec = _spec("bwd_all" if dst_side else "bwd_src", call, layout, order, shared)
    kern, consts = kernel_for(spec)
    row_bytes = _walk_row_bytes(layout, groups, g, dst_terms, shared)
    threads = row_threads(rp, row_bytes)
    outs = [torch.empty_like(groups[k][i]) for k, i in src_side + edge_terms]
    own = [[torch.zeros_like(groups[k][i]) for k, i in dst_terms] for _ in range(threads)]
    run_rows(kern, rp, ip, *rev_args, consts, prefetch_distance(row_bytes), *arrays, *g, *extra,
             *[as_numpy(o) for o in outs], row_bytes=row_bytes,
             per_thread=[tuple(as_numpy(o) for o in bufs) for bufs in own])
    for t in range(1, threads):
        for total, part in zip(own[0], own[t]):
            total += part
    for (k, i), o in zip(order, outs + own[0]):
        grads[k][i] = o


# ============================================================================ registered ops
@register("fused_edge_fwd", "cpu")
def fused_edge_fwd(
    indptr: torch.Tensor, indices: torch.Tensor, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Forward: ``(out [num_dst, F], arg [num_dst, F] int64 for max/min else None)``."""
    ext = call.reduce in ("max", "min")
    (out,), extra = _forward(indptr, indices, call, src, dst, edge, ())
    return out, (extra[0] if ext else None)


@register("fused_edge_fwd_partials", "cpu")
def fused_edge_fwd_partials(
    indptr: torch.Tensor, indices: torch.Tensor, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
    partials: tuple[int, ...],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Sum/mean forward that also sums ``d expr / d dst_i`` over each destination's
    in-edges, ``i`` in ``partials``: ``(out, [K_i [num_dst, F]])``, in the same walk."""
    (out,), ks = _forward(indptr, indices, call, src, dst, edge, partials)
    return out, ks


@register("fused_edge_multi_fwd", "cpu")
def fused_edge_multi_fwd(
    indptr: torch.Tensor, indices: torch.Tensor, call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Forward of several outputs from one walk: ``([out_j], [arg_j of each max/min
    output])``."""
    return _forward(indptr, indices, call, src, dst, edge, ())


@register("fused_edge_shared_rows", "cpu")
def fused_edge_shared_rows() -> bool:
    """Yes: a ``[1, F]`` dst term with ``num_dst != 1`` is read at row 0 by every
    destination, its gradient summed into one row per thread (``KernelSpec.shared``)."""
    return True


@register("fused_edge_partials_pay", "cpu")
def fused_edge_partials_pay(indptr: torch.Tensor, call: FusedEdgeCall) -> bool:
    """Dst partials replace the per-thread ``[num_dst, F]`` buffers of the one-walk
    backward: worth it where that walk would run with them (two or more threads,
    :data:`ONE_PASS_MIN_DEGREE` edges per destination and extra thread). Not free: ``K``
    lives from the forward to the backward, the buffers only in the backward, so the
    activation peak grows by ``num_dst x F`` per term (R-MAT 2^18 G-GCN training: train
    MB 1,186-1,192 without, 1,319-1,325 with, time the same within that case's noise:
    ``NGRA_DST_PARTIALS=never|auto train_bench.py --models ggcn --graphs rmat18
    --frameworks ngra --no-showcase``)."""
    ip = as_numpy(indptr.to(torch.int64).contiguous())
    threads = row_threads(ip, 3 * call.width * torch.finfo(call.dtype).bits // 8)
    return threads > 1 and _dense_for_buffers(ip, threads)


def _forward(indptr, indices, call: FusedEdgeCall, src, dst, edge, partials):
    """The ``fwd`` kernel: ``([out_j], [arg_j] of the max/min outputs, else the K_i of
    partials)``."""
    num_dst = indptr.numel() - 1
    groups = {"src": src, "dst": dst, "edge": edge}
    layout, arrays, shared = _layout(call, groups, num_dst)
    roots = call.roots()
    outs = [torch.empty(num_dst, call.width, dtype=call.dtype) for _ in roots]
    extra = ([torch.empty(num_dst, call.width, dtype=torch.int64)
              for _, r in roots if r in ("max", "min")]
             + [torch.empty(num_dst, call.width, dtype=call.dtype) for _ in partials])
    spec = _spec("fwd", call, layout, tuple(("dst", i) for i in partials), shared)
    kern, consts = kernel_for(spec)
    ip = as_numpy(indptr.to(torch.int64).contiguous())
    row_bytes = _gathered_bytes(layout, groups, ("src",))
    run_rows(kern, ip, ip, as_numpy(indices.contiguous()), consts, prefetch_distance(row_bytes),
             *arrays, *[as_numpy(x) for x in outs + extra], row_bytes=row_bytes)
    return outs, extra


@register("fused_edge_bwd", "cpu")
def fused_edge_bwd(
    indptr: torch.Tensor, indices: torch.Tensor,
    get_rev: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
    aux: torch.Tensor | None, grad_out: torch.Tensor,
    need: tuple[tuple[bool, ...], tuple[bool, ...], tuple[bool, ...]],
) -> tuple[list, list, list]:
    """Backward: ``(src_grads, dst_grads, edge_grads)``, ``None`` where not needed.

    When src terms and dst or edge terms want gradients, one pass over sources computes
    them all (:func:`_source_walk`, where :func:`_one_pass_pays`); otherwise gradients of
    dst and edge terms come from one pass over destinations, those of src terms from one
    pass over sources (``get_rev()`` builds or returns the reverse CSR only then). A term
    the expression never reads gets zeros.
    """
    return _backward(indptr, indices, get_rev, call, src, dst, edge,
                     [aux] if aux is not None else [], [grad_out], need)


@register("fused_edge_multi_bwd", "cpu")
def fused_edge_multi_bwd(
    indptr: torch.Tensor, indices: torch.Tensor,
    get_rev: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    call: FusedEdgeCall,
    src: list[torch.Tensor], dst: list[torch.Tensor], edge: list[torch.Tensor],
    args: list[torch.Tensor], grad_outs: list[torch.Tensor],
    need: tuple[tuple[bool, ...], tuple[bool, ...], tuple[bool, ...]],
) -> tuple[list, list, list]:
    """Backward of several outputs: the walks of :func:`fused_edge_bwd`, each adding every
    output's share of a term's gradient on the edges it visits."""
    return _backward(indptr, indices, get_rev, call, src, dst, edge, args, grad_outs, need)


def _backward(indptr, indices, get_rev, call: FusedEdgeCall, src, dst, edge,
              aux: list[torch.Tensor], grad_outs: list[torch.Tensor], need):
    """:func:`fused_edge_bwd` of one output or several (``aux``: the arg-extremes of the
    max/min outputs, ``grad_outs``: one gradient per output)."""
    groups = {"src": src, "dst": dst, "edge": edge}
    wanted = dict(zip(("src", "dst", "edge"), need))
    layout, arrays, shared = _layout(call, groups, indptr.numel() - 1)
    used = {(k, i) for k, i, _ in layout}
    grads: dict[str, list[torch.Tensor | None]] = {
        k: [torch.zeros_like(t) if n and (k, i) not in used else None
            for i, (t, n) in enumerate(zip(groups[k], wanted[k]))]
        for k in groups
    }
    ip = as_numpy(indptr.to(torch.int64).contiguous())
    g = [as_numpy(x.contiguous()) for x in grad_outs]
    extra = [as_numpy(a) for a in aux]
    src_side = tuple((k, i) for k, i, _ in layout if k == "src" and wanted[k][i])
    dst_side = tuple((k, i) for k, i, _ in layout if k in ("dst", "edge") and wanted[k][i])
    walked: tuple = ()  # dst/edge gradients that the source walk computes too
    if src_side:
        rp, rev_args = _rev_args(get_rev)
        if dst_side and ONE_PASS_BACKWARD and _one_pass_pays(ip, rp, layout, groups, g,
                                                             dst_side, shared):
            walked = dst_side

    if dst_side and not walked:
        # shared rows last: each thread sums its destinations into a row of its own
        own_rows = tuple(ki for ki in dst_side if ki in shared)
        rows = tuple(ki for ki in dst_side if ki not in shared)
        spec = _spec("bwd_dst", call, layout, rows + own_rows, shared)
        kern, consts = kernel_for(spec)
        outs = [torch.empty_like(groups[k][i]) for k, i in rows]
        row_bytes = _gathered_bytes(layout, groups, ("src",))
        threads = row_threads(ip, row_bytes)
        per = [[torch.zeros_like(groups[k][i]) for k, i in own_rows] for _ in range(threads)]
        run_rows(kern, ip, ip, as_numpy(indices.contiguous()), consts,
                 prefetch_distance(row_bytes), *arrays, *g, *extra,
                 *[as_numpy(o) for o in outs], row_bytes=row_bytes,
                 per_thread=[tuple(as_numpy(o) for o in bufs) for bufs in per])
        for bufs in per[1:]:
            for total, part in zip(per[0], bufs):
                total += part
        for (k, i), o in zip(rows + own_rows, outs + per[0]):
            grads[k][i] = o

    if src_side:
        _source_walk(ip, rp, rev_args, call, layout, arrays, shared, groups, g, extra, src_side,
                     walked, grads)
    return grads["src"], grads["dst"], grads["edge"]
