"""CSC -> CSR transpose: the reverse structure every backward pass over sources needs.

Backward passes that produce per-source gradients run over the reverse graph
(one row per source, parallel without atomics). Callers that run many steps
on one graph pass it in (``rev=graph.csr()``); otherwise :func:`reverse_of`
builds it on demand and keeps the last few in a small cache keyed by the
identity *and version counter* of the ``indptr``/``indices`` tensors, the way
DGL caches formats on a graph object. In-place torch ops bump the version and
so invalidate the entry; writes that bypass torch (through a numpy view) do not,
so do not mutate graph tensors that way.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from ngra.kernels.checks import check_csc, kernel_offsets, tensor_version
from ngra.kernels.registry import lookup, thread_setting

__all__ = ["csc_walk_preferred", "prefer_csc_walk", "rev_arrays", "reverse_of", "transpose_csc",
           "walks_csc"]

Rev = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

_walk = threading.local()

_CACHE_SIZE = 4
_cache: list[tuple[weakref.ref, weakref.ref, int, int, int, Rev]] = []
_lock = threading.Lock()


@contextlib.contextmanager
def prefer_csc_walk() -> Iterator[None]:
    """Inside the block, backward passes that can compute source gradients from the CSC
    itself (the sum/mean g-SpMM without edge data, :func:`ngra.kernels.gspmm`) do so when
    no reverse CSR exists yet (``rev=None``, or a
    :class:`~ngra.graph.DeferredReverse` not made yet), instead of building one: ``4``
    bytes an edge and ``4`` a source row less, for a slower pass (every thread reads all
    the edges). A memory budget too tight for the transpose enters it
    (:mod:`ngra.runtime.budget`); a structure memory-mapped from disk walks the CSC
    without it (:func:`ngra.kernels.gspmm`). Recorded by forward: its backward may run
    after the block."""
    with thread_setting(_walk, "on", True):
        yield


def csc_walk_preferred() -> bool:
    """Whether :func:`prefer_csc_walk` is active in this thread."""
    return getattr(_walk, "on", False)


def walks_csc(preferred: bool, rev: Any, device: torch.device) -> bool:
    """Whether a backward that can walk the CSC should: preferred (at forward), no reverse
    made yet, and the backend has the walk (cpu and ref; a GPU's atomics-free walk would
    read every edge once per source range, so the GPU transposes)."""
    if not preferred or not (rev is None or (getattr(rev, "deferred", False) and not rev.built)):
        return False
    try:
        lookup("gspmm_csc_backward", device)
    except NotImplementedError:
        return False
    return True


def transpose_csc(indptr: torch.Tensor, indices: torch.Tensor, num_src: int, *,
                  with_perm: bool = True) -> Rev:
    """The reverse (CSR over sources) of a CSC graph.

    Args:
        indptr: ``[num_dst + 1]`` offsets over destinations.
        indices: ``[E]`` source of each CSC edge, in ``[0, num_src)``.
        num_src: number of sources.
        with_perm: also return ``rev_perm`` (default); ``False`` returns ``None`` in
            its place (the lean transpose, for backward passes that read no edge data).

    Returns:
        ``(rev_indptr [num_src + 1], rev_indices [E] destination of each CSR edge
        (dtype of ``indices``), rev_perm [E] CSC position of each CSR edge)``, the same
        fields as :meth:`ngra.Graph.csr`; offsets and positions are int32 while
        ``E < 2**31`` (:func:`ngra.idtype.offsets_dtype`). Edges of one source keep
        their CSC order.
    """
    check_csc(indptr, indices, num_src)
    return lookup("transpose_csc", indices.device)(
        kernel_offsets(indptr), indices.contiguous(), int(num_src), with_perm
    )


def rev_arrays(rev: Any, need_perm: bool = True) -> Rev:
    """``(rev_indptr, rev_indices, rev_perm)`` of a tuple or a :class:`ngra.graph.CSR`;
    without ``need_perm`` a CSR's ``perm`` is not built (``None`` when not built yet)."""
    if isinstance(rev, (tuple, list)):
        return tuple(rev)
    if need_perm or rev.has_perm:
        return rev.indptr, rev.indices, rev.perm
    return rev.indptr, rev.indices, None


def reverse_of(indptr: torch.Tensor, indices: torch.Tensor, num_src: int, rev: Any,
               need_perm: bool = True) -> Rev:
    """``rev`` when given, else the (cached) transpose of the validated CSC graph.

    ``need_perm=False`` leaves a given CSR's ``perm`` unbuilt, and builds a missing
    transpose without one.
    """
    if rev is not None:
        return rev_arrays(rev, need_perm)
    key = (tensor_version(indptr), tensor_version(indices), num_src)
    cacheable = None not in key
    with _lock:
        for ref_p, ref_i, vp, vi, ns, hit in _cache:
            if (cacheable and ref_p() is indptr and ref_i() is indices and (vp, vi, ns) == key
                    and (hit[2] is not None or not need_perm)):
                return hit
    built = lookup("transpose_csc", indices.device)(kernel_offsets(indptr), indices, int(num_src),
                                                    need_perm)
    if not cacheable:
        return built
    with _lock:
        _cache[:] = [c for c in _cache if c[0]() is not None and c[1]() is not None]
        _cache.insert(0, (weakref.ref(indptr), weakref.ref(indices), *key, built))
        del _cache[_CACHE_SIZE:]
    return built
