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

Both measurements are one sort of ``dst * N + src`` keys (skipped when the keys are
already sorted, as a CSC graph's are) and one binary search per edge, in chunks.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ngra.graph import Graph

__all__ = ["ONE_DIRECTION_BELOW", "add_missing_reverses", "check_direction", "has_reverse",
           "reciprocity"]

log = logging.getLogger(__name__)

#: Below this reciprocity a graph whose direction nobody stated is reported as (probably)
#: an undirected graph listed one direction per edge.
ONE_DIRECTION_BELOW = 0.05

_CHUNK = 1 << 22  # edges per binary-search chunk: bounds the temporaries to a few 32 MB arrays
_warned: set[str] = set()


def has_reverse(src: np.ndarray, dst: np.ndarray, num_nodes: int,
                sorted_keys: np.ndarray | None = None) -> np.ndarray:
    """``[E]`` bool: whether edge ``src[i] -> dst[i]`` has its reverse among the edges.

    ``sorted_keys`` may pass the edges' ``dst * N + src`` keys already sorted.
    A self-loop is its own reverse.
    """
    n = max(int(num_nodes), 1)
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    keys = np.sort(dst * n + src) if sorted_keys is None else sorted_keys
    out = np.zeros(src.size, dtype=bool)
    if not keys.size:
        return out
    for lo in range(0, src.size, _CHUNK):
        rev = src[lo:lo + _CHUNK] * n + dst[lo:lo + _CHUNK]
        pos = np.searchsorted(keys, rev)
        np.minimum(pos, keys.size - 1, out=pos)
        out[lo:lo + _CHUNK] = keys[pos] == rev
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
    src = graph.indices.numpy().astype(np.int64, copy=False)
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(graph.indptr.numpy()))
    keys = dst * max(n, 1) + src
    if keys.size > 1 and not bool((keys[1:] >= keys[:-1]).all()):
        keys.sort()
    loop = src == dst
    total = src.size - int(loop.sum())
    if total == 0:
        return None
    mutual = int(has_reverse(src, dst, n, sorted_keys=keys).sum()) - int(loop.sum())
    return mutual / total


def check_direction(ds: Any, *, stated: str | None, symmetric: bool, option: str) -> None:
    """Record how ``ds`` got its edge direction in ``ds.info`` and warn, once per source,
    when it looks like an undirected graph listed one direction per edge.

    Args:
        ds: the :class:`~ngra.datasets.NodeDataset` just loaded.
        stated: what decided the direction (``"symmetric=true given"``, ``"LG header 'u'"``,
            ``"master.csv add_inverse_edge=True"``, ...), or ``None`` when nothing did.
        symmetric: whether reverse edges were added.
        option: how to load it symmetrized, e.g. ``"ogb:/data/x,symmetric=true"``.
    """
    ds.info.update(symmetric=symmetric, direction=stated or "unstated (edges as listed)",
                   symmetric_option=option)
    warn_if_one_direction(ds)


def warn_if_one_direction(ds: Any) -> None:
    """The warning of :func:`check_direction`, from what ``ds.info`` recorded (a cached
    dataset warns as its first load did)."""
    info = ds.info
    if not str(info.get("direction", "")).startswith("unstated"):
        return
    r = ds.reciprocity
    source = str(info.get("source", ds.name))
    if r is None or r >= ONE_DIRECTION_BELOW or source in _warned:
        return
    _warned.add(source)
    log.warning(
        "%s: only %.1f%% of its %d edges have their reverse (reciprocity %.3f), and the "
        "format does not say whether it is directed. If the graph is undirected, each edge "
        "is listed once and every vertex aggregates from only part of its neighbours: load "
        "it with %s (adds the reverse edges). If it is directed, give symmetric=false to "
        "say so.", ds.name, 100 * r, ds.num_edges, r, info.get("symmetric_option",
                                                               "symmetric=true"))
