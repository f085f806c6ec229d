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

import threading
import weakref

import torch

from ngra.kernels._checks import check_csc, tensor_version
from ngra.kernels.registry import lookup

__all__ = ["reverse_of", "transpose_csc"]

Rev = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

_CACHE_SIZE = 4
_cache: list[tuple[weakref.ref, weakref.ref, int, int, int, Rev]] = []
_lock = threading.Lock()


def transpose_csc(indptr: torch.Tensor, indices: torch.Tensor, num_src: int) -> Rev:
    """The reverse (CSR over sources) of a CSC graph.

    Args:
        indptr: ``[num_dst + 1]`` offsets over destinations.
        indices: ``[E]`` source of each CSC edge, in ``[0, num_src)``.
        num_src: number of sources.

    Returns:
        ``(rev_indptr [num_src + 1] int64, rev_indices [E] destination of each
        CSR edge (dtype of ``indices``), rev_perm [E] int64 CSC position of each
        CSR edge)``, the same fields as :meth:`ngra.Graph.csr`. Edges of one
        source keep their CSC order.
    """
    check_csc(indptr, indices, num_src)
    return lookup("transpose_csc", indices.device)(
        indptr.to(torch.int64).contiguous(), indices.contiguous(), int(num_src)
    )


def reverse_of(indptr: torch.Tensor, indices: torch.Tensor, num_src: int, rev: Rev | None) -> Rev:
    """``rev`` when given, else the (cached) transpose of the validated CSC graph."""
    if rev is not None:
        return rev
    key = (tensor_version(indptr), tensor_version(indices), num_src)
    cacheable = None not in key
    with _lock:
        for ref_p, ref_i, vp, vi, ns, hit in _cache:
            if cacheable and ref_p() is indptr and ref_i() is indices and (vp, vi, ns) == key:
                return hit
    built = lookup("transpose_csc", indices.device)(indptr, indices, int(num_src))
    if not cacheable:
        return built
    with _lock:
        _cache[:] = [c for c in _cache if c[0]() is not None and c[1]() is not None]
        _cache.insert(0, (weakref.ref(indptr), weakref.ref(indices), *key, built))
        del _cache[_CACHE_SIZE:]
    return built
