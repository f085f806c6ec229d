"""Vertex orderings for locality, and relabeling a graph and its vertex data.

A :class:`Reordering` is a permutation of vertex ids held both ways:

* ``order[new] = old`` (new -> old): row ``new`` of the reordered data is row ``old``
  of the caller's data, so ``x_new = x[order]`` (:func:`permute_rows`);
* ``rank[old] = new`` (old -> new): vertex ``old`` is called ``rank[old]`` afterwards,
  so ids are mapped with ``rank[ids]`` (:func:`relabel`) and results come back with
  ``y = y_new[rank]`` (:func:`unpermute_rows`).

Methods (:func:`reorder`):

* ``"none"``: the identity.
* ``"degree"``: by descending in-degree, ties in original id order. Hubs land in the
  first interval, so their accumulators share one column.
* ``"rcm"``: reverse Cuthill-McKee on the symmetrized pattern (scipy). Shrinks the
  bandwidth, so most edges fall in diagonal tiles and tiles touch few source rows.
* ``"metis"``: METIS k-way parts (:func:`ngra.partition.metis_parts`), vertices grouped
  by part, then by original id. Each part becomes a contiguous id range, the natural
  unit for a tile column or a rank.

Edge data never moves: :func:`permute_graph` keeps ``perm`` pointing at the caller's
*original* edge ids, so edge tensors in the caller's edge order stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from ngra.graph import Graph
from ngra.partition.kway import metis_parts, symmetric_adjacency

__all__ = [
    "REORDER_METHODS",
    "Reordering",
    "permute_graph",
    "permute_rows",
    "relabel",
    "reorder",
    "reorder_dataset",
    "unpermute_rows",
]

REORDER_METHODS = ("none", "degree", "rcm", "metis")


@dataclass(frozen=True)
class Reordering:
    """A vertex permutation, new -> old (``order``) and old -> new (``rank``).

    Build with :meth:`from_order`, :meth:`identity` or :func:`reorder`.

    Attributes:
        order: ``[N]`` int64, ``order[new] = old``.
        rank: ``[N]`` int64, ``rank[old] = new`` (the inverse of ``order``).
        method: how it was made (``"none"``, ``"degree"``, ``"rcm"``, ``"metis"``,
            ``"custom"``).
    """

    order: torch.Tensor
    rank: torch.Tensor
    method: str = "custom"

    @classmethod
    def from_order(cls, order: torch.Tensor, method: str = "custom") -> Reordering:
        """From ``order[new] = old``; checks it is a permutation of ``range(N)``."""
        o = torch.as_tensor(order)
        if o.dim() != 1 or o.is_floating_point() or o.dtype == torch.bool:
            raise ValueError(
                f"order must be a 1-D integer tensor; got {o.dtype} shape {list(o.shape)}."
            )
        o = o.to(torch.int64).contiguous()
        n = o.numel()
        if n and (
            int(o.min()) < 0 or int(o.max()) >= n or int(torch.bincount(o, minlength=n).max()) != 1
        ):
            raise ValueError(f"order must be a permutation of range({n}) (each id exactly once).")
        rank = torch.empty_like(o)
        rank[o] = torch.arange(n, dtype=torch.int64)
        return cls(o, rank, method)

    @classmethod
    def identity(cls, num_nodes: int) -> Reordering:
        ar = torch.arange(int(num_nodes), dtype=torch.int64)
        return cls(ar, ar.clone(), "none")

    @property
    def num_nodes(self) -> int:
        return int(self.order.numel())

    def inverse(self) -> Reordering:
        """The reverse relabeling (new ids back to old ids)."""
        return Reordering(self.rank, self.order, f"inverse({self.method})")

    def then(self, other: Reordering) -> Reordering:
        """Apply ``self`` first, then ``other`` (``other`` is over ``self``'s new ids)."""
        if other.num_nodes != self.num_nodes:
            raise ValueError(
                f"cannot compose reorderings of {self.num_nodes} and {other.num_nodes} vertices."
            )
        return Reordering(
            self.order[other.order], other.rank[self.rank], f"{self.method}+{other.method}"
        )

    def __repr__(self) -> str:
        return f"Reordering(method={self.method!r}, num_nodes={self.num_nodes})"


def reorder(
    graph: Graph, method: str = "none", *, num_parts: int | None = None, seed: int = 0
) -> Reordering:
    """Compute a locality-improving vertex order.

    Args:
        graph: the graph.
        method: ``"none"``, ``"degree"``, ``"rcm"`` or ``"metis"`` (see module docs).
        num_parts: METIS parts (``"metis"`` only; default: ``min(16, N)``). Use the
            number of tile columns or ranks.
        seed: METIS seed (``"metis"`` only; default: ``0``).

    Returns:
        A :class:`Reordering`; apply it with :func:`permute_graph` and :func:`permute_rows`.
    """
    n = graph.num_nodes
    if method == "none":
        return Reordering.identity(n)
    if method == "degree":
        # Stable sort of negated degrees: descending degree, ties by ascending old id.
        order = torch.argsort(-graph.in_degrees(), stable=True)
        return Reordering.from_order(order, "degree")
    if method == "rcm":
        return Reordering.from_order(_rcm_order(graph), "rcm")
    if method == "metis":
        k = min(16, max(n, 1)) if num_parts is None else num_parts
        parts = metis_parts(graph, k, seed=seed)
        order = torch.argsort(parts, stable=True)  # by part, then by old id
        return Reordering.from_order(order, "metis")
    raise ValueError(f"unknown reorder method {method!r}; choose one of {REORDER_METHODS}.")


def _rcm_order(graph: Graph) -> torch.Tensor:
    import scipy.sparse as sp
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    n = graph.num_nodes
    if n == 0:
        return torch.zeros(0, dtype=torch.int64)
    xadj, adjncy = symmetric_adjacency(graph)
    pattern = sp.csr_matrix((np.ones(adjncy.size, dtype=np.int8), adjncy, xadj), shape=(n, n))
    order = reverse_cuthill_mckee(pattern, symmetric_mode=True)
    return torch.from_numpy(np.asarray(order, dtype=np.int64))


def permute_graph(graph: Graph, reordering: Reordering) -> Graph:
    """Relabel vertices: vertex ``old`` becomes ``reordering.rank[old]``.

    The result has the same edges (``rank[src] -> rank[dst]``), with ``perm`` still
    indexing the caller's ORIGINAL edge order, so ``edge_weight`` and any edge data
    given in the original order line up unchanged. Equal to
    ``Graph.from_edge_index(rank[graph.edge_index()], ...)`` including edge order:
    the new CSC is the old CSC columns laid out in new order, each column keeping its
    edge order.

    Args:
        graph: the graph (any ``perm``).
        reordering: a :class:`Reordering` over ``graph.num_nodes`` vertices.

    Returns:
        A new :class:`ngra.Graph`.
    """
    n = graph.num_nodes
    if reordering.num_nodes != n:
        raise ValueError(
            f"reordering is over {reordering.num_nodes} vertices but the graph has {n}; "
            "compute it with reorder(graph, ...) on this graph."
        )
    from ngra.partition.counts import relabel_csc

    order, rank = reordering.order, reordering.rank
    deg = graph.in_degrees()[order]  # in-degree of each new vertex
    new_indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(deg, 0, out=new_indptr[1:])
    idx, prm, old_pos = relabel_csc(
        graph.indptr.numpy(),
        graph.indices.numpy(),
        graph.perm.numpy(),
        order.numpy(),
        rank.numpy(),
        new_indptr.numpy(),
        graph.edge_weight is not None,
    )
    new_indices, new_perm = torch.from_numpy(idx), torch.from_numpy(prm)
    w = None if graph.edge_weight is None else graph.edge_weight[torch.from_numpy(old_pos)]
    return Graph(new_indptr, new_indices, new_perm, n, w)


def _check_rows(x: torch.Tensor, reordering: Reordering, what: str) -> None:
    if x.dim() < 1 or x.shape[0] != reordering.num_nodes:
        raise ValueError(
            f"{what}: expected a tensor with {reordering.num_nodes} rows (one per vertex); "
            f"got shape {list(x.shape)}."
        )


def permute_rows(x: torch.Tensor, reordering: Reordering) -> torch.Tensor:
    """Vertex data in the caller's order -> reordered: ``x[order]`` (``[N, ...]``)."""
    _check_rows(x, reordering, "permute_rows")
    return x[reordering.order.to(x.device)]


def unpermute_rows(x: torch.Tensor, reordering: Reordering) -> torch.Tensor:
    """Reordered vertex data -> the caller's order: ``x[rank]`` (``[N, ...]``)."""
    _check_rows(x, reordering, "unpermute_rows")
    return x[reordering.rank.to(x.device)]


def relabel(ids: torch.Tensor, reordering: Reordering) -> torch.Tensor:
    """Map vertex ids (e.g. a train index or an ``edge_index``) to new ids: ``rank[ids]``."""
    return reordering.rank.to(ids.device)[ids]


def reorder_dataset(ds: Any, method: str, seed: int = 0) -> Any:
    """A node dataset (any dataclass with ``graph, x, y`` and the three split masks, such
    as :class:`ngra.datasets.NodeDataset`) with its vertices relabeled by
    :func:`reorder`: features, labels and masks permuted with the graph; edge data
    given in the original edge order (edge types) still lines up."""
    r = reorder(ds.graph, method, seed=seed)
    return replace(ds, graph=permute_graph(ds.graph, r), x=permute_rows(ds.x, r),
                   y=permute_rows(ds.y, r), train_mask=permute_rows(ds.train_mask, r),
                   val_mask=permute_rows(ds.val_mask, r), test_mask=permute_rows(ds.test_mask, r))
