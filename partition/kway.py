"""k-way vertex partitioning: METIS parts and contiguous, edge-balanced ranges.

Two tools with different jobs:

* :func:`metis_parts` assigns every vertex to one of ``k`` parts so that few edges
  cross parts (pymetis on the symmetrized graph). Parts are *not* contiguous id ranges;
  use :func:`ngra.partition.reorder` with ``method="metis"`` to make them so.
* :func:`edge_balanced_ranges` cuts ``[0, N)`` into ``k`` contiguous ranges of about
  equal cost, the cost of vertex ``v`` being ``edge_cost * deg(v) + vertex_cost``. It
  gives the tile intervals of :func:`ngra.partition.tile_graph` and the destination
  range each rank owns in multi-device training.

Ranges are returned as *bounds*: a ``[k + 1]`` int64 tensor with ``bounds[0] = start``,
``bounds[k] = stop``, non-decreasing; range ``i`` is ``[bounds[i], bounds[i + 1])`` and
may be empty (e.g. when ``k > N`` or one hub vertex outweighs several ranges).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from ngra.graph import Graph

__all__ = [
    "cost_balanced_ranges",
    "refine_ranges",
    "degree_indptr",
    "edge_balanced_ranges",
    "interval_of",
    "metis_parts",
    "symmetric_adjacency",
]

log = logging.getLogger(__name__)


def _check_k(k: Any, name: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= 1; got {type(k).__name__}.")
    if k < 1:
        raise ValueError(f"{name} must be >= 1; got {k}.")
    return int(k)


def degree_indptr(degrees: torch.Tensor) -> torch.Tensor:
    """Offsets ``[N + 1]`` (int64) from a ``[N]`` degree vector: ``indptr[i] = sum(deg[:i])``.

    ``edge_balanced_ranges(degree_indptr(graph.out_degrees()), k)`` balances sources by
    out-degree without building the CSR.
    """
    deg = torch.as_tensor(degrees).to(torch.int64)
    out = torch.zeros(deg.numel() + 1, dtype=torch.int64)
    torch.cumsum(deg, 0, out=out[1:])
    return out


def edge_balanced_ranges(
    indptr: torch.Tensor,
    k: int,
    *,
    vertex_cost: float = 1.0,
    edge_cost: float = 1.0,
    start: int = 0,
    stop: int | None = None,
) -> torch.Tensor:
    """Cut ``[start, stop)`` into ``k`` contiguous ranges of about equal cost.

    The cost of vertex ``v`` is ``edge_cost * (indptr[v + 1] - indptr[v]) + vertex_cost``.
    Boundary ``i`` is the vertex boundary whose prefix cost is nearest to ``i / k`` of the
    total, so every range costs at most ``total / k + max_v cost(v)``; with
    ``vertex_cost=0`` that is the edge guarantee ``edges <= E / k + max degree``.

    Args:
        indptr: ``[N + 1]`` offsets (CSC ``indptr`` for in-edges, or
            :func:`degree_indptr` of out-degrees for sources).
        k: number of ranges (``>= 1``).
        vertex_cost: cost of one vertex in units of one edge (default: ``1``, i.e.
            "edges + vertices"; ``0`` balances edges only).
        edge_cost: cost of one edge (default: ``1``; ``0`` balances vertices only).
        start, stop: balance only the sub-range ``[start, stop)`` (default: all
            vertices). Used to split one rank's range into its own tile columns.

    Returns:
        ``[k + 1]`` int64 bounds, ``bounds[0] = start``, ``bounds[k] = stop``.
    """
    k = _check_k(k)
    ip = torch.as_tensor(indptr)
    if ip.dim() != 1 or ip.numel() < 1:
        raise ValueError(f"indptr must be 1-D with N + 1 >= 1 entries; got shape {list(ip.shape)}.")
    n = ip.numel() - 1
    stop = n if stop is None else int(stop)
    start = int(start)
    if not 0 <= start <= stop <= n:
        raise ValueError(f"need 0 <= start <= stop <= N={n}; got start={start}, stop={stop}.")
    if (
        vertex_cost < 0
        or edge_cost < 0
        or not np.isfinite(vertex_cost)
        or not np.isfinite(edge_cost)
    ):
        raise ValueError(
            f"vertex_cost and edge_cost must be finite and >= 0; got {vertex_cost}, {edge_cost}."
        )
    if vertex_cost == 0 and edge_cost == 0:
        raise ValueError("vertex_cost and edge_cost cannot both be 0 (nothing to balance).")
    if k == 1 or start == stop:
        return _full_range_bounds(k, start, stop)
    seg = ip[start : stop + 1].to(torch.float64)
    # prefix[i] = cost of vertices [start, start + i)
    prefix = edge_cost * (seg - seg[0]) + vertex_cost * torch.arange(
        stop - start + 1, dtype=torch.float64
    )
    return cut_prefix(prefix, k) + start


def refine_ranges(
    indptr: torch.Tensor,
    bounds: torch.Tensor,
    parts_per_range: int,
    *,
    vertex_cost: float = 1.0,
    edge_cost: float = 1.0,
) -> torch.Tensor:
    """Split each range of ``bounds`` into ``parts_per_range`` balanced sub-ranges.

    For multi-device training: ``bounds`` are the destination ranges the ranks own
    (e.g. ``edge_balanced_ranges(indptr, world_size)``); the result is one global set of
    tile-column bounds in which rank ``r`` owns columns
    ``[r * parts_per_range, (r + 1) * parts_per_range)``, so every rank builds its own
    tiles with ``tile_graph(graph, dst_bounds=result, columns=...)``.

    Returns:
        ``[(len(bounds) - 1) * parts_per_range + 1]`` int64 bounds.
    """
    k = _check_k(parts_per_range, "parts_per_range")
    b = torch.as_tensor(bounds, dtype=torch.int64)
    pieces = [b[:1]]
    for lo, hi in zip(b[:-1].tolist(), b[1:].tolist()):
        sub = edge_balanced_ranges(
            indptr, k, vertex_cost=vertex_cost, edge_cost=edge_cost, start=lo, stop=hi
        )
        pieces.append(sub[1:])
    return torch.cat(pieces)


def cost_balanced_ranges(vertex_costs: torch.Tensor, k: int) -> torch.Tensor:
    """Cut ``[0, N)`` into ``k`` contiguous ranges of about equal total ``vertex_costs``.

    The general form of :func:`edge_balanced_ranges`: any non-negative ``[N]`` cost
    (e.g. bytes a vertex brings into a tile). Each range costs at most
    ``total / k + max(vertex_costs)``.

    Returns:
        ``[k + 1]`` int64 bounds.
    """
    k = _check_k(k)
    c = torch.as_tensor(vertex_costs).to(torch.float64)
    if c.dim() != 1:
        raise ValueError(f"vertex_costs must be 1-D [N]; got shape {list(c.shape)}.")
    if c.numel() and (not bool(torch.isfinite(c).all()) or float(c.min()) < 0):
        raise ValueError("vertex_costs must be finite and >= 0.")
    n = c.numel()
    if k == 1 or n == 0:
        return _full_range_bounds(k, 0, n)
    prefix = torch.zeros(n + 1, dtype=torch.float64)
    torch.cumsum(c, 0, out=prefix[1:])
    return cut_prefix(prefix, k)


def _full_range_bounds(k: int, start: int, stop: int) -> torch.Tensor:
    out = torch.full((k + 1,), stop, dtype=torch.int64)
    out[0] = start
    return out


def cut_prefix(prefix: torch.Tensor, k: int) -> torch.Tensor:
    """Bounds ``[k + 1]`` cutting a non-decreasing ``[n + 1]`` float prefix-cost array.

    Boundary ``i`` is the index whose prefix is nearest to ``i / k`` of the total
    (``prefix[-1]``), so each range costs at most ``total / k`` plus one vertex's cost.
    """
    n = prefix.numel() - 1
    total = float(prefix[-1])
    if k == 1 or n == 0:
        return _full_range_bounds(k, 0, n)
    # numpy: torch.searchsorted wakes the thread pool even for a handful of queries.
    pre = (
        prefix.numpy() if isinstance(prefix, torch.Tensor) else np.asarray(prefix, dtype=np.float64)
    )
    targets = total * np.arange(1, k, dtype=np.float64) / k
    hi = np.minimum(np.searchsorted(pre, targets, side="left"), n)  # first prefix >= target
    lo = np.maximum(hi - 1, 0)
    cut = np.where(targets - pre[lo] < pre[hi] - targets, lo, hi)
    # Nearest-rounding of increasing targets is already monotone; the running max guards float ties.
    cut = np.maximum.accumulate(cut)
    out = np.empty(k + 1, dtype=np.int64)
    out[0], out[k] = 0, n
    out[1:k] = cut
    return torch.from_numpy(out)


def interval_of(bounds: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Index of the range holding each id: ``i`` with ``bounds[i] <= id < bounds[i + 1]``.

    Args:
        bounds: ``[k + 1]`` bounds from :func:`edge_balanced_ranges`.
        ids: vertex ids, any shape, in ``[bounds[0], bounds[-1])``.

    Returns:
        int64 tensor shaped like ``ids``. Empty ranges are never returned.
    """
    b = torch.as_tensor(bounds, dtype=torch.int64)
    return torch.searchsorted(b, torch.as_tensor(ids, dtype=torch.int64), right=True) - 1


def symmetric_adjacency(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """Undirected simple adjacency of ``graph`` as METIS wants it.

    Every edge ``u -> v`` with ``u != v`` appears as ``v`` in ``u``'s list and ``u`` in
    ``v``'s list, exactly once (self-loops and multi-edges dropped; isolated vertices
    get empty lists).

    Returns:
        ``(xadj [N + 1], adjncy [2M])`` int64 numpy arrays, each list sorted.
    """
    import scipy.sparse as sp

    n = graph.num_nodes
    src = graph.indices.numpy()
    dst = graph.dst_index().numpy()
    keep = src != dst
    src, dst = src[keep], dst[keep]
    # Boolean pattern: duplicates OR together instead of summing (no overflow, no zeros).
    a = sp.csr_matrix((np.ones(src.size, dtype=bool), (src, dst)), shape=(n, n))
    sym = (a + a.T).tocsr()
    sym.sort_indices()
    return sym.indptr.astype(np.int64), sym.indices.astype(np.int64)


def metis_parts(
    graph: Graph,
    k: int,
    seed: int = 0,
    *,
    balance: str = "vertices",
) -> torch.Tensor:
    """k-way METIS partition of the symmetrized graph (min edge cut, balanced parts).

    Edge directions, self-loops and duplicate edges are ignored (METIS needs a simple
    undirected graph). Isolated vertices are placed by METIS to even out part sizes.

    Args:
        graph: the graph.
        k: number of parts (``>= 1``). With ``k >= N`` every vertex gets its own part.
        seed: METIS random seed (default: ``0``); same seed, same parts.
        balance: ``"vertices"`` (default: equal vertex counts) or ``"edges"`` (equal
            ``1 + in-degree`` per part, i.e. equal Gather work).

    Returns:
        ``[N]`` int64 part id of every vertex, in ``[0, k)``.
    """
    k = _check_k(k)
    if balance not in ("vertices", "edges"):
        raise ValueError(f"balance must be 'vertices' or 'edges'; got {balance!r}.")
    n = graph.num_nodes
    if n == 0:
        return torch.zeros(0, dtype=torch.int64)
    if k == 1:
        return torch.zeros(n, dtype=torch.int64)
    if k >= n:
        return torch.arange(n, dtype=torch.int64)
    xadj, adjncy = symmetric_adjacency(graph)
    vweights = None
    if balance == "edges":
        vweights = (graph.in_degrees() + 1).numpy()
    if adjncy.size == 0:
        # METIS needs at least one edge to do anything sensible; balance contiguously.
        deg_ip = degree_indptr(
            torch.zeros(n, dtype=torch.int64) if vweights is None else graph.in_degrees()
        )
        bounds = edge_balanced_ranges(deg_ip, k)
        return interval_of(bounds, torch.arange(n))

    import pymetis  # a hard dependency, imported lazily: it is only needed here

    options = pymetis.Options(seed=int(seed))
    kwargs: dict[str, Any] = {"options": options}
    if vweights is not None:
        kwargs["vweights"] = vweights
    if hasattr(pymetis, "CSRAdjacency"):
        result = pymetis.part_graph(k, pymetis.CSRAdjacency(xadj, adjncy), **kwargs)
    else:  # pymetis < 2025.2
        result = pymetis.part_graph(k, xadj=xadj, adjncy=adjncy, **kwargs)
    parts = torch.from_numpy(np.asarray(result[1], dtype=np.int64).copy())
    log.debug("metis_parts: k=%d edge_cut=%d", k, int(result[0]))
    return parts
