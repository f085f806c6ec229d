"""Helpers shared by the numba kernels: work partitioning, threads, prefetch, plumbing.

Conventions every CPU kernel follows:

* A kernel is a serial ``@njit(nogil=True, cache=True)`` function over a range
  of rows ``[v0, v1)`` (destinations in CSC, sources in the reverse CSR), so
  each output row has exactly one writer: no atomics, no races.
  :func:`run_rows` runs it on ``torch.get_num_threads()`` threads; ``nogil``
  lets the threads run truly in parallel. (Not ``prange``: the same g-SpMM
  kernel compiled 24 s with ``parallel=True`` against 2-3 s without, because
  LLVM re-optimizes the whole body inside the generated gufunc; first-run
  compile time is paid by every clean CI run.)
* Rows are split into ranges of about equal *work* (edges + rows), not equal
  row counts, because real graphs are skewed (R-MAT puts most edges on low
  ids); the pool hands ranges to whichever thread is free.
* ``indptr`` and ``indices`` may be int32 or int64 without conversion (a graph keeps
  32-bit offsets and ids where they fit, :mod:`ngra.idtype`; numba promotes index
  arithmetic to 64 bits, so int32 inputs cannot overflow inside). Features are float32
  or float64. Absent optional arrays are passed as small typed dummies so that
  one compiled specialization serves every call with the same dtypes.

numba's on-disk cache (``cache=True``) is keyed on the source file of each
kernel, not on this module: after editing a helper or constant here, delete
``kernels/cpu/__pycache__`` or kernels elsewhere keep the old compiled code.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from ngra import mapped  # by module: tests watch its release_mapped
from ngra.mapped import is_mapped

# Reduce codes (ints, so that one compiled kernel serves several reducers).
SUM, MEAN, MAX, MIN, MASKED_SUM = 0, 1, 2, 3, 4
REDUCE_CODES = {"sum": SUM, "mean": MEAN, "max": MAX, "min": MIN}

# Ranges per thread: a few, so a thread slowed down by a neighbour gets fewer.
_CHUNKS_PER_THREAD = 4
# Below this much work one thread is faster than waking the pool (~50 us).
_MIN_PARALLEL_BYTES = 1 << 20
# How many edges ahead gather loops prefetch source rows (fixed-distance kernels);
# :func:`prefetch_distance` adapts it to the row size.
PREFETCH = 8


@njit(nogil=True, cache=True)
def chunk_bound(indptr, chunk, nchunks, v0, v1):
    """First row of ``chunk`` when rows ``[v0, v1)`` are split into ``nchunks`` equal-work
    ranges.

    Work of rows ``[0, v)`` is ``indptr[v] + v`` (edges plus one per row), so the
    bound is a binary search on a monotone sequence; no allocation.
    """
    w0 = indptr[v0] + v0
    target = w0 + ((indptr[v1] + v1 - w0) * chunk) // nchunks
    lo, hi = v0, v1
    while lo < hi:
        mid = (lo + hi) >> 1
        if indptr[mid] + mid < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


@intrinsic
def prefetch_row(typingctx, arr, row):
    """Hint the CPU to load the cache lines of ``arr[row]`` (C-contiguous) into L2.

    Random row gathers are latency bound; asking for the rows some edges ahead
    keeps many misses in flight. The hint targets L2 (``prefetcht1``): L1 has
    only ~16 line-fill buffers per core, which caps L1 prefetching near 13 GB/s
    per core, while L2 tracks ~48 misses (measured on R-MAT copy-sum: L2 hints
    ~15% faster than L1 hints). A hint only: never faults, no effect on results.
    """
    if not isinstance(arr, types.Array) or not isinstance(row, types.Integer):
        return None
    sig = types.void(arr, row)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        shape = cgutils.unpack_tuple(builder, ary.shape)
        strides = cgutils.unpack_tuple(builder, ary.strides)
        zero = context.get_constant(types.intp, 0)
        row_idx = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = cgutils.get_item_pointer2(
            context,
            builder,
            ary.data,
            shape,
            strides,
            aryty.layout,
            [row_idx] + [zero] * (aryty.ndim - 1),
            wraparound=False,
            boundscheck=False,
        )
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        base = builder.bitcast(ptr, i8p)
        # One hint per 64-byte line of the row (strides[0] bytes): read (0), locality 2
        # (keep in L2 and below), data cache (1).
        line = context.get_constant(types.intp, 64)
        with cgutils.for_range_slice(builder, zero, strides[0], line, intp=zero.type) as (off, _):
            builder.call(fn, [builder.gep(base, [off]), i32(0), i32(2), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


def prefetch_distance(row_bytes: int) -> int:
    """Edges to prefetch ahead for rows of ``row_bytes``: about 16 KiB in flight.

    Measured on R-MAT gathers with 2 threads (copy-sum, shared machine, so
    +-10%): 64-byte rows 64 ahead (2x faster than none, 1.4x faster than 8
    ahead), 256-byte rows 16-64 ahead (1.5x faster than 4), 1 KiB rows 4-16
    ahead (1.2x faster than none).
    """
    return max(4, min(64, 16384 // max(row_bytes, 1)))


_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _reset_pool_after_fork() -> None:
    global _pool, _pool_size
    _pool, _pool_size = None, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_pool_after_fork)


def _get_pool(threads: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size != threads:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(threads, thread_name_prefix="ngra-kernels")
            _pool_size = threads
        return _pool


def row_threads(indptr: np.ndarray, row_bytes: int = 64) -> int:
    """How many threads :func:`run_rows` uses for these rows (1 below ~1 MiB of work)."""
    num_rows = indptr.shape[0] - 1
    threads = torch.get_num_threads()
    if threads <= 1 or (int(indptr[-1]) + num_rows) * row_bytes < _MIN_PARALLEL_BYTES:
        return 1
    return threads


def run_rows(kernel, indptr: np.ndarray, *args, row_bytes: int = 64,
             per_thread: Sequence[tuple] | None = None, edge_arrays: Sequence = ()) -> None:
    """Run ``kernel(*args, v0, v1)`` over all rows of ``indptr`` in equal-work ranges.

    Uses ``torch.get_num_threads()`` threads (``torch.set_num_threads`` /
    ``OMP_NUM_THREADS`` control it, as for torch's own ops): the calling thread
    and ``threads - 1`` pool workers take ranges from a shared counter until none
    are left, so a thread slowed down by other load simply takes fewer. Inputs
    with less than ~1 MiB of work (``(edges + rows) * row_bytes``) run on the
    calling thread. ``kernel`` must be a ``nogil`` numba function writing only
    rows in ``[v0, v1)``, or, for outputs that every range may touch, only its
    thread's own arrays: with ``per_thread`` (one tuple of arrays per thread,
    ``len == row_threads(indptr, row_bytes)``) thread ``t`` calls
    ``kernel(*args, *per_thread[t], v0, v1)``.

    ``edge_arrays`` are the arrays the kernel reads by edge position (``indices``, edge
    data): when they or ``indptr`` are memory-mapped the rows are walked in blocks
    (:func:`walk_blocks`), so the structure streams from disk.
    """
    threads = row_threads(indptr, row_bytes)
    if per_thread is not None and len(per_thread) != threads:
        raise ValueError(f"internal error: {len(per_thread)} per-thread argument sets for "
                         f"{threads} threads.")
    own = list(per_thread) if per_thread is not None else [()] * threads
    for v0, v1 in walk_blocks(indptr, edge_arrays):
        _run_block(kernel, indptr, args, own, threads, v0, v1)


def _run_block(kernel, indptr, args, own, threads: int, v0: int, v1: int) -> None:
    if threads == 1:
        kernel(*args, *own[0], v0, v1)
        return
    nchunks = threads * _CHUNKS_PER_THREAD
    bounds = [chunk_bound(indptr, c, nchunks, v0, v1) for c in range(nchunks + 1)]
    counter = itertools.count()  # next() on it is atomic under the GIL

    def drain(slot: int) -> None:
        while (c := next(counter)) < nchunks:
            if bounds[c + 1] > bounds[c]:
                kernel(*args, *own[slot], bounds[c], bounds[c + 1])

    pool = _get_pool(threads - 1)
    futures = [pool.submit(drain, t) for t in range(1, threads)]
    try:
        drain(0)
    finally:
        for f in futures:
            f.result()


#: Edges a block when a kernel walks a memory-mapped structure (:func:`walk_blocks`):
#: 2^25, 128 MiB of 32-bit ids, so the RSS holds a block or two of the structure.
MAPPED_BLOCK_EDGES = 1 << 25


def walk_blocks(indptr: np.ndarray, edge_arrays: Sequence = ()):
    """The row blocks ``(v0, v1)`` to walk ``indptr``'s rows in: one block over every row,
    unless ``indptr`` or one of ``edge_arrays`` (read by edge position) is memory-mapped
    (the on-disk store, :mod:`ngra.datasets.store`). Then the rows go in blocks of about
    :data:`MAPPED_BLOCK_EDGES` edges: while the caller computes on one block, the next
    block's pages are read ahead (``MADV_WILLNEED``), and once it is done its pages are
    dropped from the RSS (``MADV_DONTNEED``; they stay in the page cache). A generator:
    the caller runs each block before asking for the next. Blocks are never empty (but
    for a graph without rows: one), so the first starts at row 0 and only the last ends
    at the last row.
    """

    n = indptr.shape[0] - 1
    on_disk = [a for a in (*edge_arrays, indptr) if a is not None and a.size and is_mapped(a)]
    if not on_disk:
        yield 0, n
        return
    edges = [a for a in on_disk if a is not indptr]
    nblocks = max(1, -(-int(indptr[n]) // MAPPED_BLOCK_EDGES))
    bounds = [int(chunk_bound(indptr, b, nblocks, 0, n)) for b in range(nblocks + 1)]

    def advise(fn, b: int) -> None:
        v0, v1 = bounds[b], bounds[b + 1]
        e0, e1 = int(indptr[v0]), int(indptr[v1])
        for a in edges:
            fn(a, e0, e1)
        fn(indptr, v0, v1 + 1)

    for b in range(nblocks):
        if bounds[b + 1] == bounds[b] and n:
            continue  # a row heavier than a block: the next block starts past it
        if b + 1 < nblocks:
            advise(mapped.prefetch_mapped, b + 1)
        yield bounds[b], bounds[b + 1]
        advise(mapped.release_mapped, b)


def run_ranges(kernel, num: int, threads: int, *args) -> None:
    """Run ``kernel(*args, lo, hi)`` over ``threads`` equal ranges of ``[0, num)``, one a
    thread, for kernels where every range walks all of the input (each writes only the
    output rows of its own range, so more ranges than threads would only walk it more)."""
    threads = max(1, min(threads, num))
    bounds = [num * t // threads for t in range(threads + 1)]
    if threads == 1:
        kernel(*args, 0, num)
        return
    pool = _get_pool(threads - 1)
    futures = [pool.submit(kernel, *args, bounds[t], bounds[t + 1]) for t in range(1, threads)]
    try:
        kernel(*args, bounds[0], bounds[1])
    finally:
        for f in futures:
            f.result()


def as_numpy(t: torch.Tensor | None) -> np.ndarray | None:
    """A zero-copy numpy view of a contiguous CPU tensor (``None`` passes through)."""
    if t is None:
        return None
    if not t.is_contiguous():
        raise ValueError("internal error: numba kernels need contiguous tensors.")
    return t.detach().numpy()


_DUMMIES: dict[tuple[str, int], np.ndarray] = {}


def dummy(dtype: np.dtype | type, ndim: int) -> np.ndarray:
    """A tiny array standing in for an absent optional argument (same type every call)."""
    key = (np.dtype(dtype).str, ndim)
    if key not in _DUMMIES:
        _DUMMIES[key] = np.zeros((1,) * ndim, dtype=dtype)
    return _DUMMIES[key]
