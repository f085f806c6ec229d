"""Edge direction: reciprocity of a loaded graph, symmetrizing, and the one-direction warning.

An undirected graph is often distributed with each edge written once (OGB's raw
``edge.csv.gz`` of ogbn-products, many SNAP and CSV edge lists). Loaded as it is,
every vertex aggregates from only part of its neighbours and accuracy drops without
any error. So every loader measures **reciprocity**, the share of the graph's edges
(self-loops aside) whose reverse is also an edge: 1 for a symmetric graph, 0 for an
undirected graph listed one direction per edge. When the file says nothing about
direction, the user gave no ``symmetric=`` and (almost) no edge has its reverse,
:func:`check_direction` warns once, naming the figure and the option that adds the
reverse edges.

Both measurements sort the edges' keys ``dst * N + src`` (a CSC graph's are sorted
already) and their reversed keys ``src * N + dst``, then look each key up among the
reversed ones in key order (binary searches in a sorted order stay in cache). That
costs about 33 bytes an edge at once; past :data:`SORT_MAX_EDGES` edges
:func:`reciprocity` walks the CSC instead, looking for each edge ``s -> d``'s
destination ``d`` among the sources of column ``s`` (a binary search per edge, in a
numba kernel on every thread), in no memory beyond the graph.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np

from ngra.graph import Graph

__all__ = ["ONE_DIRECTION_BELOW", "add_missing_reverses", "check_direction", "has_reverse",
           "loading_spec", "reciprocity", "symmetric_spec",
           "warn_if_one_direction"]

log = logging.getLogger(__name__)

#: Below this reciprocity a graph whose direction nobody stated is reported as (probably)
#: an undirected graph listed one direction per edge.
ONE_DIRECTION_BELOW = 0.05

_CHUNK = 1 << 22  # keys per binary-search chunk: bounds the temporaries to a few 32 MB
#: Past this many edges :func:`reciprocity` walks the CSC in chunks instead of sorting every
#: edge's key (whose temporaries, about 33 bytes an edge, reach 1 GiB here).
SORT_MAX_EDGES = 1 << 25
_warned: set[str] = set()
_spec: contextvars.ContextVar[str | None] = contextvars.ContextVar("ngra_dataset_spec",
                                                                   default=None)


@contextlib.contextmanager
def loading_spec(spec: str) -> Iterator[None]:
    """Loads inside name ``spec`` (as the user wrote it) in their advice to symmetrize."""
    token = _spec.set(spec)
    try:
        yield
    finally:
        _spec.reset(token)


def symmetric_spec(spec: str) -> str:
    """``spec`` with ``symmetric=true`` in place of any ``symmetric=`` it has."""
    head, _, rest = spec.strip().partition(":")
    keep = [t for t in rest.split(",")
            if t.strip() and t.partition("=")[0].strip().lower() != "symmetric"]
    return f"{head}:{','.join(keep + ['symmetric=true'])}"


def has_reverse(src: np.ndarray, dst: np.ndarray, num_nodes: int) -> np.ndarray:
    """``[E]`` bool: whether edge ``src[i] -> dst[i]`` has its reverse among the edges.

    A self-loop is its own reverse.
    """
    n = max(int(num_nodes), 1)
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    keys = dst * n + src
    order = np.argsort(keys, kind="stable")
    out = np.empty(keys.size, dtype=bool)
    out[order] = _reversed_in(keys[order], src, dst, n)
    return out


def _reversed_in(sorted_keys: np.ndarray, src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    """For each key ``d * n + s`` of ``sorted_keys``: whether ``s -> d``'s reverse ``d -> s``
    is an edge, i.e. whether the key is one of the edges' reversed keys ``s * n + d``.
    Sorted queries into a sorted set keep the binary searches cache-friendly."""
    reversed_keys = src * n + dst
    reversed_keys.sort()  # not np.unique: numpy 2's hash-based unique is ten times slower
    out = np.zeros(sorted_keys.size, dtype=bool)
    if not reversed_keys.size:
        return out
    for lo in range(0, sorted_keys.size, _CHUNK):
        q = sorted_keys[lo:lo + _CHUNK]
        pos = np.searchsorted(reversed_keys, q)
        np.minimum(pos, reversed_keys.size - 1, out=pos)
        out[lo:lo + _CHUNK] = reversed_keys[pos] == q
    return out


def add_missing_reverses(src: np.ndarray, dst: np.ndarray,
                         num_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The edges plus the reverse of each edge whose reverse is absent (PyG's
    ``to_undirected``, DGL's ``to_bidirected``; multi-edges are kept).

    Returns:
        ``(src, dst, added)``: the edges, then the added reverses; ``added`` holds the
        index of the edge each added reverse mirrors (to copy edge data along).
    """
    added = np.flatnonzero(~has_reverse(src, dst, num_nodes))
    return (np.concatenate([src, np.asarray(dst)[added]]),
            np.concatenate([dst, np.asarray(src)[added]]), added)


def reciprocity(graph: Graph) -> float | None:
    """Share of the graph's edges, self-loops aside, whose reverse is an edge too
    (``None`` when there is no such edge)."""
    n = graph.num_nodes
    if graph.num_edges > SORT_MAX_EDGES:
        return _reciprocity_walked(graph.indptr.numpy(), graph.indices.numpy(), n)
    src = graph.indices.numpy().astype(np.int64, copy=False)
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(graph.indptr.numpy()))
    keys = dst * max(n, 1) + src
    if keys.size > 1 and not bool((keys[1:] >= keys[:-1]).all()):
        keys.sort()  # CSC order is sorted by destination; sources within one may not be
    loops = int((src == dst).sum())
    total = src.size - loops
    if total == 0:
        return None
    return (int(_reversed_in(keys, src, dst, max(n, 1)).sum()) - loops) / total


def _reciprocity_walked(indptr: np.ndarray, indices: np.ndarray, n: int) -> float | None:
    """:func:`reciprocity` by a walk over the CSC: edge ``s -> d`` has its reverse when
    ``d`` is among the (sorted) sources of column ``s`` (a binary search an edge, in a
    numba kernel on every thread: no temporaries; R-MAT 2^26's 1.06 billion edges took
    17 minutes as lockstep numpy bisections over chunks)."""
    from ngra.kernels.cpu.csc_search import count_reverses  # lazy: numba loads with it
    from ngra.kernels.cpu.util import row_threads, run_rows  # lazy: with the kernel

    indptr = np.asarray(indptr)
    idx = _sources_sorted(indptr, indices, n)
    threads = row_threads(indptr)
    counts = [(np.zeros(2, dtype=np.int64),) for _ in range(threads)]
    run_rows(count_reverses, indptr, indptr, idx, per_thread=counts)
    found = sum(int(c[0][0]) for c in counts)
    loops = sum(int(c[0][1]) for c in counts)
    total = idx.size - loops
    return None if total == 0 else (found - loops) / total


def _sources_sorted(indptr: np.ndarray, indices: np.ndarray, n: int) -> np.ndarray:
    """``indices`` with each column's sources in increasing order: ``indices`` itself when
    they are (as the dataset builders write them), else a copy sorted a block of columns
    at a time."""
    for lo in range(0, indices.size, _CHUNK):
        a = indices[lo:min(lo + _CHUNK + 1, indices.size)]
        fall = np.flatnonzero(a[1:] < a[:-1]) + lo + 1  # edge positions where the id falls
        at = np.minimum(np.searchsorted(indptr, fall), n)
        if bool(np.any(indptr[at] != fall)):
            break  # a fall inside a column (not at a column's start): unsorted
    else:
        return indices
    out = np.empty_like(indices)
    c = 0
    while c < n:
        c1 = min(max(int(np.searchsorted(indptr, indptr[c] + _CHUNK, side="right")) - 1,
                     c + 1), n)
        e0, e1 = indptr[c], indptr[c1]
        key = np.repeat(np.arange(c1 - c, dtype=np.int64), np.diff(indptr[c:c1 + 1])) * n
        key += indices[e0:e1]
        key.sort()
        out[e0:e1] = key % n
        c = c1
    return out


def check_direction(ds: Any, *, stated: str | None, symmetric: bool, option: str) -> None:
    """Record how ``ds`` got its edge direction in ``ds.info`` and warn, once per source
    file (or dataset name) and edge count, when it looks like an undirected graph listed
    one direction per edge.

    Args:
        ds: the :class:`~ngra.datasets.NodeDataset` just loaded.
        stated: what decided the direction (``"symmetric=true given"``, ``"LG header 'u'"``,
            ``"master.csv add_inverse_edge=True"``, ...), or ``None`` when nothing did.
        symmetric: whether reverse edges were added.
        option: how to load it symmetrized, e.g. ``"ogb:/data/x,symmetric=true"``; inside
            :func:`loading_spec`, the user's spec with ``symmetric=true``.
    """
    spec = _spec.get()
    ds.info.update(symmetric=symmetric, direction=stated or "unstated (edges as listed)",
                   symmetric_option=option if spec is None else symmetric_spec(spec))
    warn_if_one_direction(ds)


def warn_if_one_direction(ds: Any) -> None:
    """The warning of :func:`check_direction`, from what ``ds.info`` recorded (a cached
    dataset warns as its first load did)."""
    info = ds.info
    if not str(info.get("direction", "")).startswith("unstated"):
        return
    r = ds.reciprocity
    key = f"{info.get('source', ds.name)}:{ds.num_edges}"
    if r is None or r >= ONE_DIRECTION_BELOW or key in _warned:
        return
    _warned.add(key)
    log.warning(
        "%s: only %.1f%% of its %d edges have their reverse (reciprocity %.3f), and the "
        "format does not say whether it is directed. If the graph is undirected, each edge "
        "is listed once and every vertex aggregates from only part of its neighbours: load "
        "it with %s (adds the reverse edges). If it is directed, give symmetric=false to "
        "say so.", ds.name, 100 * r, ds.num_edges, r, info.get("symmetric_option",
                                                               "symmetric=true"))
