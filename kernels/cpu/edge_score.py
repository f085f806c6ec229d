"""numba ``edge_score``: kernels generated from the score expression.

The score expression is written into the source of one ``@njit(nogil=True, cache=True)``
kernel per :class:`~ngra.kernels._edge_spec.KernelSpec` (kind ``score_fwd`` or
``score_bwd``), with the statement emitter of :mod:`ngra.kernels.cpu._codegen` (so an
expression means the same in both kernels: narrow nodes hoisted out of the column loop,
common subexpressions once, the vectorizable ``exp``/``sigmoid``), saved in the kernel
cache directory and run by :func:`~ngra.kernels.cpu.util.run_rows` on edge-balanced
ranges of destinations.

``score_fwd``  rows = destinations; per in-edge and head, the expression summed over the
               head's ``D`` columns into ``out[e, h]``.
``score_bwd``  rows = destinations, the same walk: ``g[e, h] * d expr / d term`` per
               column. Dst rows have one writer (the walking thread); src rows and shared
               (one-row) dst terms are added into per-thread buffers that the caller
               zeroes and sums, so no atomics are needed and nothing per edge is stored.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

from ngra.kernels import _edge_spec
from ngra.kernels._edge_spec import KernelSpec
from ngra.kernels.cpu._codegen import (
    CODEGEN_VERSION,
    _close_kernel,
    _Emitter,
    _exp_source,
    _open_kernel,
    _prefetch,
    _wide_leaves,
    _Writer,
)
from ngra.kernels.cpu.fused_edge import FLUSH_DENORMALS
from ngra.kernels.cpu.util import as_numpy, prefetch_distance, row_threads, run_rows
from ngra.kernels.edge_expr import leaves
from ngra.kernels.edge_score import EdgeScoreCall
from ngra.kernels.registry import register

__all__ = ["edge_score_fwd", "edge_score_bwd", "generate_score"]

# part of every generated file name, with the fused-edge generator's version
SCORE_VERSION = "1"
_KERNELS: dict[KernelSpec, tuple[Callable, np.ndarray]] = {}
_LOCK = threading.Lock()


def generate_score(spec: KernelSpec) -> tuple[str, list[float]]:
    """``(module source, constants)`` of a ``score_fwd`` / ``score_bwd`` spec."""
    if spec.kind == "score_fwd":
        em = _Emitter(spec, [spec.expr])
        body = _fwd(spec, em)
    elif spec.kind == "score_bwd":
        roots = spec.grad_roots()
        em = _Emitter(spec, [r for _, _, r in roots])
        body = _bwd(spec, em, roots)
    else:
        raise ValueError(f"unknown score kernel kind {spec.kind!r}")
    head = spec.header("ngra.kernels.cpu.edge_score", f"{CODEGEN_VERSION}.{SCORE_VERSION}") + [
        "import math", "", "import numpy as np", "from numba import njit", "",
        "from ngra.kernels.cpu.util import prefetch_row",
        *(["from ngra.kernels.cpu.fused_edge import FTZ_DAZ, mxcsr_get, mxcsr_set"]
          if spec.flush_denormals else []),
        "", "",
    ]
    return "\n".join(head) + _exp_source(spec.dtype) + "\n\n" + body, em.consts


def _edge_loop(w: _Writer, spec: KernelSpec, em: _Emitter) -> None:
    w("num_edges = indices.shape[0]")
    w("nd = nf // nh")
    w("for v in range(v0, v1):")
    w.indent()


def _fwd(spec: KernelSpec, em: _Emitter) -> str:
    w = _Writer()
    _open_kernel(w, spec, em, ["indptr", "indices", "consts", "ahead", "scale", "nh", "nf",
                               *spec.arrays(), "out"])
    _edge_loop(w, spec, em)
    w("for pos in range(indptr[v], indptr[v + 1]):")
    w.indent()
    _prefetch(w, _wide_leaves(spec, "src"), "indices", "num_edges")
    w("e = pos")
    w("u = indices[e]")
    em.emit(w, wide=False)
    w("for h in range(nh):")
    w.indent()
    w("acc = c0")
    w("for k in range(nd):")
    w.indent()
    w("f = h * nd + k")
    em.emit(w, wide=True)
    w(f"acc += {em.names[spec.expr]}")
    w.dedent()
    w("out[e, h] = acc * scale")
    return _close_kernel(w, spec)


def _bwd(spec: KernelSpec, em: _Emitter, roots) -> str:
    wide = {(k, i): wd for k, i, wd in spec.layout}
    shared = set(spec.shared)
    w = _Writer()
    _open_kernel(w, spec, em, ["indptr", "indices", "consts", "ahead", "scale", "nh", "nf",
                               *spec.arrays(), "g", *spec.grad_names()])
    _edge_loop(w, spec, em)
    for k, i, _ in roots:  # a destination's own rows: one writer, zeroed here
        if k == "dst" and (k, i) not in shared:
            if wide[(k, i)]:
                w("for f in range(nf):")
                w.indent()(f"gd{i}[v, f] = c0")
                w.dedent()
            else:
                w(f"gd{i}[v, 0] = c0")
    w("for pos in range(indptr[v], indptr[v + 1]):")
    w.indent()
    _prefetch(w, _wide_leaves(spec, "src"), "indices", "num_edges")
    w("e = pos")
    w("u = indices[e]")
    em.emit(w, wide=False)
    w("for h in range(nh):")
    w.indent()
    w("gv = g[e, h] * scale")
    w("for k in range(nd):")
    w.indent()
    w("f = h * nd + k")
    em.emit(w, wide=True)
    for k, i, r in roots:
        row = "0" if (k, i) in shared else ("u" if k == "src" else "v")
        col = "f" if wide[(k, i)] else "0"
        w(f"g{'s' if k == 'src' else 'd'}{i}[{row}, {col}] += gv * {em.names[r]}")
    return _close_kernel(w, spec)


def _kernel(spec: KernelSpec) -> tuple[Callable, np.ndarray]:
    hit = _KERNELS.get(spec)
    if hit is not None:
        return hit
    with _LOCK:
        hit = _KERNELS.get(spec)
        if hit is None:
            source, consts = generate_score(spec)
            name = f"ngra_edge_score_{spec.digest(CODEGEN_VERSION + '.' + SCORE_VERSION)}"
            module = _edge_spec.load_module("numba", name, source)
            hit = (module.kernel, np.asarray(consts, dtype=np.dtype(spec.dtype)))
            _KERNELS[spec] = hit
        return hit


def _layout(call: EdgeScoreCall, src, dst, num_dst: int):
    groups = {"src": src, "dst": dst}
    used = leaves(call.expr)
    layout = tuple((k, i, groups[k][i].shape[1] != 1) for k, i in used)
    arrays = [as_numpy(groups[k][i]) for k, i in used]
    shared = tuple((k, i) for k, i in used if k == "dst" and groups[k][i].shape[0] == 1
                   and num_dst != 1)
    row_bytes = max(1, sum(groups[k][i].shape[1] * groups[k][i].element_size()
                           for k, i, wd in layout if k == "src" and wd))
    return groups, layout, arrays, shared, row_bytes


def _dtype(call: EdgeScoreCall) -> str:
    return "float32" if call.dtype == torch.float32 else "float64"


@register("edge_score_fwd", "cpu")
def edge_score_fwd(indptr, indices, call: EdgeScoreCall, src, dst) -> torch.Tensor:
    """``[E, H]`` scores (see :func:`ngra.kernels.edge_score`)."""
    num_dst = indptr.numel() - 1
    _, layout, arrays, shared, row_bytes = _layout(call, src, dst, num_dst)
    spec = KernelSpec("score_fwd", _dtype(call), call.expr, "sum", layout, (),
                      FLUSH_DENORMALS, shared)
    kern, consts = _kernel(spec)
    out = torch.empty(indices.numel(), call.heads, dtype=call.dtype)
    ip = as_numpy(indptr.to(torch.int64).contiguous())
    sc = np.dtype(spec.dtype).type(call.scale)
    run_rows(kern, ip, ip, as_numpy(indices.contiguous()), consts, prefetch_distance(row_bytes),
             sc, call.heads, call.width, *arrays, as_numpy(out), row_bytes=row_bytes)
    return out


@register("edge_score_bwd", "cpu")
def edge_score_bwd(indptr, indices, call: EdgeScoreCall, src, dst, grad, need):
    """``(src_grads, dst_grads)`` from one walk over destinations (module docs)."""
    num_dst = indptr.numel() - 1
    groups, layout, arrays, shared, row_bytes = _layout(call, src, dst, num_dst)
    wanted = {"src": need[0], "dst": need[1]}
    used = {(k, i) for k, i, _ in layout}
    grads = {k: [torch.zeros_like(t) if n and (k, i) not in used else None
                 for i, (t, n) in enumerate(zip(groups[k], wanted[k]))] for k in groups}
    todo = [(k, i) for k, i, _ in layout if wanted[k][i]]
    if not todo:
        return grads["src"], grads["dst"]
    owned = tuple(ki for ki in todo if ki[0] == "dst" and ki not in shared)
    per = tuple(ki for ki in todo if ki not in owned)  # src rows, shared dst rows
    spec = KernelSpec("score_bwd", _dtype(call), call.expr, "sum", layout, owned + per,
                      FLUSH_DENORMALS, shared)
    kern, consts = _kernel(spec)
    ip = as_numpy(indptr.to(torch.int64).contiguous())
    threads = row_threads(ip, row_bytes)
    outs = [torch.empty_like(groups[k][i]) for k, i in owned]
    bufs = [[torch.zeros_like(groups[k][i]) for k, i in per] for _ in range(threads)]
    sc = np.dtype(spec.dtype).type(call.scale)
    run_rows(kern, ip, ip, as_numpy(indices.contiguous()), consts, prefetch_distance(row_bytes),
             sc, call.heads, call.width, *arrays, as_numpy(grad), *[as_numpy(o) for o in outs],
             row_bytes=row_bytes, per_thread=[tuple(as_numpy(b) for b in bs) for bs in bufs])
    for bs in bufs[1:]:
        for total, part in zip(bufs[0], bs):
            total += part
    for (k, i), o in zip(owned + per, outs + (bufs[0] if bufs else [])):
        grads[k][i] = o
    return grads["src"], grads["dst"]
