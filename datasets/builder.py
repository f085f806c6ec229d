"""Edges in, CSC out, in bounded memory: how large graphs are built chunk by chunk.

:class:`CSCBuilder` takes ``(src, dst)`` chunks from a generator or a file parser and
buckets them by destination range (a bucket's pairs are stored as two 32-bit local
ids); past :data:`SPILL_EDGES` edges the buckets are appended to files in a scratch
folder instead of kept in memory. :meth:`CSCBuilder.finish` sorts one bucket at a time
by ``(dst, src)`` (64-bit keys for that bucket only), drops duplicates and self-loops
as asked, and writes the CSC: ``indptr`` and ``indices`` in the narrowest dtypes that
fit (:mod:`ngra.idtype`), into the cache entry being built when one is given
(:class:`~ngra.datasets.cache.EntryWriter`), else into memory. No 64-bit edge array
for the whole graph ever exists; peak memory is one bucket's keys plus the output.

The result equals :func:`ngra.datasets.base.csc_graph` on the concatenated edges.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ngra.graph import Graph
from ngra.idtype import ids_dtype, np_idtype, offsets_dtype
from ngra.mapped import release_mapped

from .base import DatasetError

__all__ = ["BUCKET_EDGES", "SPILL_EDGES", "CSCBuilder"]

log = logging.getLogger(__name__)

#: Edges per destination bucket the builder aims for (its sort's working set: 8 B each).
BUCKET_EDGES = 1 << 24
#: Beyond this many edges the buckets go to scratch files instead of memory.
SPILL_EDGES = 1 << 25


class CSCBuilder:
    """Collects edge chunks and builds the destination-sorted CSC (see module docs).

    Args:
        num_nodes: ``N``; ids must lie in ``[0, N)``.
        expected_edges: about how many edges will be added (sets the bucket count).
        symmetric: also add the reverse of every edge.
        remove_self_loops: drop ``v -> v`` edges.
        dedup: drop repeated ``(src, dst)`` pairs.
        out: the cache entry to write ``indptr.npy`` / ``indices.npy`` into.
        progress: tqdm bars (default: when stderr is a terminal and the graph is large).
        scratch: folder for spilled buckets (default: the entry's folder, else a temp dir).
    """

    def __init__(self, num_nodes: int, expected_edges: int, *, symmetric: bool = False,
                 remove_self_loops: bool = True, dedup: bool = True, out: Any = None,
                 progress: bool | None = None, scratch: Path | None = None) -> None:
        if num_nodes >= 2**32:
            raise DatasetError(f"graphs are limited to 2**32 - 1 nodes here; got {num_nodes}.")
        self.n = int(num_nodes)
        want = max(1, int(expected_edges) * (2 if symmetric else 1))
        self.num_buckets = int(min(max(1, -(-want // BUCKET_EDGES)), max(self.n, 1)))
        self.bounds = (np.arange(self.num_buckets + 1, dtype=np.int64) * self.n) // self.num_buckets
        self.symmetric, self.loops, self.dedup = symmetric, remove_self_loops, dedup
        self.out, self.progress = out, progress
        self.spill = want > SPILL_EDGES
        self.added = 0
        self._mem: list[list[np.ndarray]] = [[] for _ in range(self.num_buckets)]
        self._dir: Path | None = None
        self._files: list[Any] = []
        if self.spill:
            base = scratch or (out.tmp if out is not None else None)
            self._dir = Path(tempfile.mkdtemp(prefix=".csc-buckets-", dir=base))
            self._files = [open(self._dir / f"{b}.bin", "wb") for b in range(self.num_buckets)]

    def add(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Add one chunk of edges (any integer dtype, equal lengths)."""
        src, dst = np.asarray(src), np.asarray(dst)
        if src.shape != dst.shape or src.ndim != 1:
            raise ValueError(f"src and dst must be 1-D of equal length; got {src.shape} and "
                             f"{dst.shape}.")
        if src.size == 0:
            return
        lo = min(int(src.min()), int(dst.min()))
        hi = max(int(src.max()), int(dst.max()))
        if lo < 0 or hi >= self.n:
            raise DatasetError(f"edge endpoints must be in [0, {self.n}); got range [{lo}, {hi}].")
        src, dst = src.astype(np.uint32, copy=False), dst.astype(np.uint32, copy=False)
        if self.symmetric:
            src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        if self.loops:
            keep = src != dst
            if not keep.all():
                src, dst = src[keep], dst[keep]
        bucket = np.searchsorted(self.bounds, dst, side="right") - 1
        order = np.argsort(bucket, kind="stable")
        counts = np.bincount(bucket, minlength=self.num_buckets)
        src, dst = src[order], dst[order]
        pos = 0
        for b, c in enumerate(counts.tolist()):
            if c:
                pair = np.empty((c, 2), dtype=np.uint32)
                pair[:, 0] = dst[pos:pos + c] - np.uint32(self.bounds[b])
                pair[:, 1] = src[pos:pos + c]
                if self.spill:
                    pair.tofile(self._files[b])
                else:
                    self._mem[b].append(pair)
                pos += c
        self.added += int(src.size)

    def _bucket(self, b: int) -> np.ndarray:
        if self.spill:
            pairs = np.fromfile(self._dir / f"{b}.bin", dtype=np.uint32).reshape(-1, 2)
            (self._dir / f"{b}.bin").unlink()
        else:
            parts, self._mem[b] = self._mem[b], []
            pairs = np.concatenate(parts) if parts else np.empty((0, 2), np.uint32)
        key = pairs[:, 0].astype(np.int64) * max(self.n, 1) + pairs[:, 1]
        del pairs
        key.sort()
        if self.dedup and key.size > 1:
            # sort + neighbor compare: numpy 2's hash-based np.unique is several times slower
            fresh = np.empty(key.size, dtype=bool)
            fresh[0] = True
            np.not_equal(key[1:], key[:-1], out=fresh[1:])
            key = key[fresh]
        return key

    def finish(self) -> Graph:
        """The CSC :class:`~ngra.Graph` (edge order = CSC order)."""
        for f in self._files:
            f.close()
        n = max(self.n, 1)
        counts = np.zeros(self.n, dtype=np.int64)
        ids = np_idtype(ids_dtype(self.n))
        parts: list[Any] = []
        sizes = []
        bar = tqdm(range(self.num_buckets), desc="sort edges", unit="bucket",
                   disable=_quiet(self.progress, self.num_buckets))
        for b in bar:
            key = self._bucket(b)
            lo = int(self.bounds[b])
            counts[lo:int(self.bounds[b + 1])] = np.bincount(
                key // n, minlength=int(self.bounds[b + 1]) - lo)
            idx = (key % n).astype(ids)
            del key
            if self.spill:
                path = self._dir / f"{b}.idx"
                idx.tofile(path)
                parts.append(path)
            else:
                parts.append(idx)
            sizes.append(idx.size)
        e = int(sum(sizes))
        offsets = np_idtype(offsets_dtype(e))
        indptr = self._array("indptr", (self.n + 1,), offsets)
        indptr[0] = 0
        indptr[1:] = np.cumsum(counts)
        indices = self._array("indices", (e,), ids)
        pos = 0
        for part, size in zip(parts, sizes):
            indices[pos:pos + size] = np.fromfile(part, dtype=ids) if self.spill else part
            release_mapped(indices, pos, pos + size)
            pos += size
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        return Graph.from_csc(torch.from_numpy(indptr), torch.from_numpy(indices),
                              num_nodes=self.n, validate=False)

    def _array(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        if self.out is not None:
            return self.out.array(name, shape, dtype)
        return np.empty(shape, dtype=dtype)


def _quiet(progress: bool | None, steps: int) -> bool | None:
    """tqdm's ``disable``: off for one-step work, else as asked (``None``: on a terminal)."""
    if progress is None:
        return None if steps > 1 else True
    return not progress
