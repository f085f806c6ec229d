"""The immutable, validated graph every ngra layer runs on.

A :class:`Graph` stores its edges destination-sorted (CSC): ``indptr`` over
destinations and ``indices`` holding the source of each edge. When the caller's
edge order differs from CSC order, ``perm`` holds the position of each CSC edge in
the caller's original order; a graph built in CSC order (every dataset loader) keeps
none. Edge data handed to a layer is always in the original order; the runtime
permutes it once. The reverse direction (CSR over sources), used by backward passes,
is built on first use and cached.

Threads: a Graph is shared by the layers (and threads) that run on it, so what it builds
lazily (the reverse CSR and its ``perm``, the destination of each edge, what the runtime
keeps with :meth:`Graph.cached`) is built under the graph's own lock, once, and then
published: threads making a graph's first use at once wait for one build and all get
the same object; later reads take no lock.

Memory: ids and offsets are 32-bit where they fit (:mod:`ngra.idtype`); an edge weight
that is a product of per-vertex factors (GCN's ``deg^-1/2`` on each side) is kept as
the two ``[N]`` factors (:class:`EdgeFactors`), never as an ``[E]`` tensor, and kernels
apply the factors on the fly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from ngra.idtype import ids_dtype, narrow, np_idtype, offsets_dtype
from ngra.mapped import is_mapped
from ngra.mapped import release_mapped, scratch_mapped
from ngra.compat import import_dgl
from ngra.kernels import transpose_csc

__all__ = ["Graph", "CSR", "DeferredReverse", "EdgeFactors", "segment_ids"]

_T = TypeVar("_T")

#: Most vertices a graph may have (its offsets are allocated per vertex up front).
MAX_NODES = 2**31 - 1
_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


@dataclass(frozen=True)
class EdgeFactors:
    """An edge weight that is a product of per-vertex factors: ``w(u -> v) = src[u] * dst[v]``.

    Attributes:
        src: ``[N]`` factor of each edge's source.
        dst: ``[N]`` factor of each edge's destination.
    """

    src: torch.Tensor
    dst: torch.Tensor

    def per_edge(self, src_idx: torch.Tensor, dst_idx: torch.Tensor) -> torch.Tensor:
        """``[E]`` weights of edges ``src_idx -> dst_idx`` (rows of :attr:`src` / :attr:`dst`)."""
        return self.src.index_select(0, src_idx) * self.dst.index_select(0, dst_idx)

    @property
    def dtype(self) -> torch.dtype:
        return self.src.dtype

    @property
    def device(self) -> torch.device:
        return self.src.device


class CSR:
    """Source-sorted view of a graph (32-bit where it fits, like the graph).

    Attributes:
        indptr: ``[num_nodes + 1]`` offsets over sources.
        indices: ``[E]`` destination of each edge; edges of one source keep CSC order.
        perm: ``[E]`` position of each CSR edge in CSC order. Only kernels that read
            per-edge data in backward need it, so it is built on first access.
    """

    __slots__ = ("indptr", "indices", "_perm", "_make_perm", "_lock")

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor,
                 perm: torch.Tensor | None = None, make_perm: Any = None) -> None:
        self.indptr, self.indices, self._perm, self._make_perm = indptr, indices, perm, make_perm
        self._lock = threading.Lock()

    @property
    def perm(self) -> torch.Tensor:
        perm = self._perm
        if perm is None:
            with self._lock:  # one build, whichever threads ask first (module docstring)
                if self._perm is None:
                    self._perm = self._make_perm()
                    self._make_perm = None
                perm = self._perm
        return perm

    @property
    def has_perm(self) -> bool:
        """Whether :attr:`perm` is built already (reading it builds it)."""
        return self._perm is not None

    def __iter__(self):  # (indptr, indices, perm), like the tuples kernels take
        return iter((self.indptr, self.indices, self.perm))


class DeferredReverse:
    """A reverse CSR that is made on first use: ``make()`` returns it (a :class:`CSR`),
    ``peek()`` the one made already or ``None``.

    Kernels that can compute a source gradient from the CSC itself check :attr:`built` and,
    where the caller prefers it (:func:`ngra.kernels.transpose.prefer_csc_walk`, entered
    by a memory budget too tight for the transpose), never make it; any other use of its fields makes it.
    """

    __slots__ = ("_make", "_peek")
    deferred = True

    def __init__(self, make: Any, peek: Any) -> None:
        self._make, self._peek = make, peek

    @property
    def built(self) -> bool:
        return self._peek() is not None

    @property
    def csr(self) -> CSR:
        return self._make()

    indptr = property(lambda self: self.csr.indptr)
    indices = property(lambda self: self.csr.indices)
    perm = property(lambda self: self.csr.perm)

    @property
    def has_perm(self) -> bool:
        built = self._peek()
        return built is not None and built.has_perm

    def __iter__(self):
        return iter(self.csr)


class Graph:
    """A directed graph in destination-sorted CSC form. Immutable.

    Messages flow along edges ``src -> dst``; a layer's Gather reduces over each
    destination's in-edges. Build one with :meth:`from_edge_index`,
    :meth:`from_csc`, :meth:`from_scipy`, :meth:`from_pyg` or :meth:`from_dgl`.

    Attributes:
        num_nodes: number of vertices ``N``.
        indptr: ``[N + 1]`` offsets over destinations (int32 while ``E < 2**31``, else int64).
        indices: ``[E]`` source of each CSC edge (int32 while ``N <= 2**31``, else int64).
        perm: ``[E]`` original edge id of each CSC edge (``arange(E)``, made on access,
            when the graph is in CSC order; :attr:`has_perm` says whether one is stored).
        edge_weight: ``[E]`` float edge weights in CSC order, or ``None``. A graph with
            :attr:`edge_factors` computes them from the factors on each access.
        edge_factors: the :class:`EdgeFactors` of a factored weight, or ``None``.
    """

    __slots__ = ("num_nodes", "indptr", "indices", "_perm", "_weight", "edge_factors", "_cache",
                 "_lock", "_frozen")

    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        perm: torch.Tensor | None,
        num_nodes: int,
        edge_weight: torch.Tensor | None = None,
        edge_factors: EdgeFactors | None = None,
    ) -> None:
        # Internal constructor: arguments are trusted (built by the from_* methods).
        object.__setattr__(self, "num_nodes", int(num_nodes))
        object.__setattr__(self, "indptr", indptr)
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "_perm", perm)
        object.__setattr__(self, "_weight", edge_weight)
        object.__setattr__(self, "edge_factors", edge_factors)
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "_lock", threading.RLock())  # lazy builds (module docstring)
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ngra.Graph is immutable; cannot set {name!r}. Build a new Graph.")

    def __reduce__(self) -> tuple:
        # Slots + a refusing __setattr__: rebuild through the constructor (pickle, copy).
        return (Graph, (self.indptr, self.indices, self._perm, self.num_nodes, self._weight,
                        self.edge_factors))

    def __repr__(self) -> str:
        w = ", weighted" if self.weighted else ""
        return f"Graph(num_nodes={self.num_nodes}, num_edges={self.num_edges}{w})"

    # ------------------------------------------------------------------ build
    @classmethod
    def from_edge_index(
        cls,
        edge_index: Any,
        num_nodes: int | None = None,
        edge_weight: Any = None,
    ) -> Graph:
        """Build from a ``[2, E]`` integer tensor/array of ``(src, dst)`` rows.

        Args:
            edge_index: ``[2, E]`` integer ids, any integer dtype.
            num_nodes: number of vertices (default: ``max id + 1``).
            edge_weight: optional ``[E]`` finite floats, in ``edge_index`` order.

        Raises:
            TypeError: non-integer ids or non-float weights.
            ValueError: wrong shape, negative or out-of-range ids, non-finite weights.
        """
        ei = _as_tensor(edge_index, "edge_index")
        if ei.dtype not in _INT_DTYPES:
            raise TypeError(
                f"edge_index must hold integer vertex ids; got dtype {ei.dtype}. "
                "Convert with edge_index.long()."
            )
        if ei.dim() != 2 or ei.shape[0] != 2:
            raise ValueError(
                f"edge_index must have shape [2, num_edges]; got {list(ei.shape)}. "
                "If you have [num_edges, 2], pass edge_index.t()."
            )
        if ei.dtype not in (torch.int32, torch.int64):
            ei = ei.to(torch.int64)
        num_edges = ei.shape[1]
        if num_edges and int(ei.min()) < 0:
            bad = int((ei < 0).any(0).nonzero()[0, 0])
            raise ValueError(
                f"edge_index holds a negative vertex id ({ei[:, bad].tolist()} at edge {bad}); "
                "ids must be in [0, num_nodes)."
            )
        max_id = int(ei.max()) if num_edges else -1
        if num_nodes is None:
            num_nodes = max_id + 1
        else:
            if not isinstance(num_nodes, (int, np.integer)) or isinstance(num_nodes, bool):
                raise TypeError(f"num_nodes must be an int; got {type(num_nodes).__name__}.")
            num_nodes = int(num_nodes)
            if num_nodes < 0:
                raise ValueError(f"num_nodes must be >= 0; got {num_nodes}.")
            if max_id >= num_nodes:
                bad = int((ei >= num_nodes).any(0).nonzero()[0, 0])
                raise ValueError(
                    f"edge_index refers to vertex {max_id}, but num_nodes={num_nodes} "
                    f"(ids must be < num_nodes; first offending edge {bad}: {ei[:, bad].tolist()})."
                )
        if num_nodes > MAX_NODES:
            raise ValueError(
                f"a graph holds at most {MAX_NODES:,} vertices; got num_nodes={num_nodes:,} "
                f"(largest vertex id {max_id:,}). Renumber sparse ids densely first, e.g. "
                "torch.unique(edge_index, return_inverse=True)."
            )
        weight = _check_weight(edge_weight, num_edges)
        src, dst = ei[0], ei[1]
        counts = torch.bincount(dst, minlength=num_nodes)
        indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=indptr[1:])
        indptr = narrow(indptr, num_edges)
        ids = ids_dtype(num_nodes)
        if num_edges < 2 or bool((dst[1:] >= dst[:-1]).all()):
            # already destination-sorted: CSC order is the caller's order, no perm
            w = weight.contiguous() if weight is not None else None
            return cls(indptr, src.to(ids).contiguous(), None, num_nodes, w)
        # Stable sort keeps multi-edges in input order: deterministic CSC.
        perm = torch.argsort(dst, stable=True)
        indices = src.index_select(0, perm).to(ids)
        w = weight.index_select(0, perm) if weight is not None else None
        return cls(indptr, indices, narrow(perm, num_edges), num_nodes, w)

    @classmethod
    def from_csc(
        cls,
        indptr: Any,
        indices: Any,
        num_nodes: int | None = None,
        edge_weight: Any = None,
        *,
        validate: bool = True,
    ) -> Graph:
        """Build from destination-sorted CSC arrays (edge order = CSC order, so no ``perm``).

        The arrays are kept as they are when their dtypes are already the narrowest that
        fit (:mod:`ngra.idtype`), so memory-mapped arrays stay memory-mapped.
        ``validate=False`` skips the ``O(E)`` checks, for arrays ngra wrote and verified
        itself (the dataset cache).
        """
        ip = _as_tensor(indptr, "indptr")
        ix = _as_tensor(indices, "indices")
        for name, t in (("indptr", ip), ("indices", ix)):
            if t.dtype not in _INT_DTYPES:
                raise TypeError(f"{name} must be an integer tensor; got dtype {t.dtype}.")
            if t.dim() != 1:
                raise ValueError(f"{name} must be 1-D; got shape {list(t.shape)}.")
        if ip.numel() == 0:
            raise ValueError("indptr must start with 0 and have num_nodes + 1 entries.")
        n = ip.numel() - 1
        if num_nodes is not None and num_nodes != n:
            raise ValueError(f"indptr describes {n} nodes but num_nodes={num_nodes}.")
        if validate:
            _check_csc(ip, ix, n)
        w = _check_weight(edge_weight, ix.numel()) if validate else edge_weight
        ip = narrow(ip, ix.numel())
        ix = ix.to(ids_dtype(n)) if ix.dtype != ids_dtype(n) else ix
        return cls(ip, ix.contiguous(), None, n, w)

    @classmethod
    def from_scipy(cls, matrix: Any, use_weights: bool = True) -> Graph:
        """Build from a square scipy.sparse matrix ``A`` with ``A[src, dst]`` = weight."""
        import scipy.sparse as sp

        if not sp.issparse(matrix):
            raise TypeError(f"expected a scipy.sparse matrix; got {type(matrix).__name__}.")
        if matrix.shape[0] != matrix.shape[1]:
            raise ValueError(f"adjacency must be square; got shape {matrix.shape}.")
        coo = matrix.tocoo()
        ei = torch.from_numpy(np.vstack([coo.row, coo.col]).astype(np.int64))
        w = torch.from_numpy(np.asarray(coo.data, dtype=np.float32)) if use_weights else None
        return cls.from_edge_index(ei, num_nodes=matrix.shape[0], edge_weight=w)

    @classmethod
    def from_pyg(cls, data: Any) -> Graph:
        """Build from a PyG ``Data`` (uses ``edge_index``, ``num_nodes``, ``edge_weight``)."""
        if not hasattr(data, "edge_index"):
            raise TypeError(f"expected a torch_geometric Data with edge_index; got {type(data).__name__}.")
        w = getattr(data, "edge_weight", None)
        return cls.from_edge_index(data.edge_index, num_nodes=data.num_nodes, edge_weight=w)

    @classmethod
    def from_dgl(cls, g: Any, weight_field: str | None = None) -> Graph:
        """Build from a homogeneous DGL graph (optionally reading ``g.edata[weight_field]``)."""
        if not hasattr(g, "edges") or not hasattr(g, "num_nodes"):
            raise TypeError(f"expected a DGLGraph; got {type(g).__name__}.")
        src, dst = g.edges(order="eid")
        w = g.edata[weight_field] if weight_field else None
        return cls.from_edge_index(torch.stack([src, dst]), num_nodes=g.num_nodes(), edge_weight=w)

    # ----------------------------------------------------------------- export
    def edge_index(self, order: str = "original") -> torch.Tensor:
        """``[2, E]`` int64 (src, dst). ``order="original"`` (input order) or ``"csc"``."""
        if order not in ("original", "csc"):
            raise ValueError(f"order must be 'original' or 'csc'; got {order!r}.")
        ei = torch.stack([self.indices.to(torch.int64), self.dst_index().to(torch.int64)])
        if order == "csc" or self._perm is None:
            return ei
        out = torch.empty_like(ei)
        out[:, self._perm.to(torch.int64)] = ei
        return out

    def edge_weight_original(self) -> torch.Tensor | None:
        """Edge weights in the original edge order (or ``None``)."""
        w = self.edge_weight
        return None if w is None else self.to_original_order(w)

    def to_original_order(self, edge_data: torch.Tensor) -> torch.Tensor:
        """``[E, ...]`` edge data in CSC order -> the caller's original edge order."""
        if self._perm is None:
            return edge_data
        out = torch.empty_like(edge_data)
        out[self._perm.to(device=edge_data.device, dtype=torch.int64)] = edge_data
        return out

    def to_csc_order(self, edge_data: torch.Tensor) -> torch.Tensor:
        """``[E, ...]`` edge data in the original edge order -> CSC order (no copy without perm)."""
        if self._perm is None:
            return edge_data
        return edge_data.index_select(0, self._perm.to(edge_data.device))

    def to_scipy(self):
        """scipy.sparse CSC matrix ``A`` with ``A[src, dst]`` = weight (1 when unweighted)."""
        import scipy.sparse as sp

        n = self.num_nodes
        w = self.edge_weight
        data = w.numpy() if w is not None else np.ones(self.num_edges, np.float32)
        # CSC of A[src, dst]: columns are destinations, row indices are sources.
        return sp.csc_matrix((data, self.indices.numpy(), self.indptr.numpy()), shape=(n, n))

    def to_pyg(self):
        """A ``torch_geometric.data.Data`` with ``edge_index`` (and ``edge_weight``)."""
        from torch_geometric.data import Data

        d = Data(edge_index=self.edge_index(), num_nodes=self.num_nodes)
        if self.weighted:
            d.edge_weight = self.edge_weight_original()
        return d

    def to_dgl(self, weight_field: str = "w"):
        """A DGL graph with edges in original order (weights in ``edata[weight_field]``)."""

        dgl = import_dgl()
        ei = self.edge_index()
        g = dgl.graph((ei[0], ei[1]), num_nodes=self.num_nodes)
        if self.weighted:
            g.edata[weight_field] = self.edge_weight_original()
        return g

    # ------------------------------------------------------------ properties
    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    @property
    def perm(self) -> torch.Tensor:
        if self._perm is not None:
            return self._perm
        return torch.arange(self.num_edges, dtype=offsets_dtype(self.num_edges))

    @property
    def has_perm(self) -> bool:
        """Whether the caller's edge order differs from CSC order (a ``perm`` is stored)."""
        return self._perm is not None

    @property
    def edge_weight(self) -> torch.Tensor | None:
        if self.edge_factors is not None:
            return self.edge_factors.per_edge(self.indices, self.dst_index())
        return self._weight

    @property
    def weighted(self) -> bool:
        """Whether the graph has edge weights (stored or factored)."""
        return self._weight is not None or self.edge_factors is not None

    def in_degrees(self) -> torch.Tensor:
        """``[N]`` in-degree of every vertex (the dtype of ``indptr``)."""
        return self.indptr[1:] - self.indptr[:-1]

    def out_degrees(self) -> torch.Tensor:
        """``[N]`` int64 out-degree of every vertex."""
        return torch.bincount(self.indices, minlength=self.num_nodes)

    def cached(self, key: str, make: Callable[[], _T]) -> _T:
        """``make()``, built once for this graph and kept under ``key``: the first callers
        (several threads at once too) wait for one build, and every caller gets the same
        object (module docstring). ``make`` must depend on the graph alone."""
        hit = self._cache.get(key)
        if hit is None:
            with self._lock:
                hit = self._cache.get(key)
                if hit is None:
                    hit = make()
                    self._cache[key] = hit  # published whole: readers take no lock
        return hit

    def dst_index(self) -> torch.Tensor:
        """``[E]`` destination of each CSC edge (cached; the dtype of ``indices``)."""
        return self.cached("dst", lambda: segment_ids(self.indptr, dtype=self.indices.dtype))

    def csr(self) -> CSR:
        """Source-sorted view (cached): offsets over sources, destinations, and CSC positions
        (built on first access of ``perm``)."""
        return self.cached("csr", self._make_csr)

    def _make_csr(self) -> CSR:
        rev_indptr, rev_indices, _ = transpose_csc(self.indptr, self.indices,
                                                   self.num_nodes, with_perm=False)

        def make_perm() -> torch.Tensor:
            return transpose_csc(self.indptr, self.indices, self.num_nodes)[2]

        return CSR(rev_indptr, rev_indices, make_perm=make_perm)

    def deferred_csr(self) -> DeferredReverse:
        """:meth:`csr`, made when first used (:class:`DeferredReverse`)."""
        return DeferredReverse(self.csr, lambda: self._cache.get("csr"))

    def to(self, device: torch.device | str) -> Graph:
        """This graph with its arrays (and a built reverse CSR) on ``device``."""
        device = torch.device(device)
        if self.indptr.device == device:
            return self
        w = None if self._weight is None else self._weight.to(device)
        f = self.edge_factors
        if f is not None:  # GCN's two sides are one [N] tensor: one copy of it, not two
            src = f.src.to(device)
            f = EdgeFactors(src, src if f.dst is f.src else f.dst.to(device))
        g = Graph(self.indptr.to(device), self.indices.to(device),
                  None if self._perm is None else self._perm.to(device), self.num_nodes, w, f)
        if "csr" in self._cache:
            c = self._cache["csr"]
            perm = c.perm.to(device) if c.has_perm else None
            g._cache["csr"] = CSR(c.indptr.to(device), c.indices.to(device), perm,
                                  make_perm=lambda: c.perm.to(device))
        return g

    def has_self_loops(self) -> bool:
        return bool((self.indices == self.dst_index()).any())

    # -------------------------------------------------------------- helpers
    def with_edge_weight(self, edge_weight: Any) -> Graph:
        """Same edges, new ``[E]`` weights given in original edge order."""
        w = _check_weight(edge_weight, self.num_edges)
        return Graph(self.indptr, self.indices, self._perm, self.num_nodes,
                     None if w is None else self.to_csc_order(w).contiguous())

    def add_self_loops(self, fill_value: float = 1.0, order: str = "original") -> Graph:
        """A new graph with one self-loop added to every vertex (existing ones are kept).

        Each vertex's loop follows its in-edges in CSC order. ``order`` fixes the new
        graph's original edge order (what edge data given to a layer follows):
        ``"original"`` appends the loops after the original edges in their original
        order (a ``perm`` is stored); ``"csc"`` makes it the CSC order (no ``perm``:
        the lean choice when no edge data in the old order has to line up). New loops
        get ``fill_value`` as weight when the graph is weighted.
        """
        if order not in ("original", "csc"):
            raise ValueError(f"order must be 'original' or 'csc'; got {order!r}.")
        if self.edge_factors is not None:
            raise ValueError("add_self_loops on a graph with factored edge weights: add the "
                             "loops first, then normalize (gcn_norm(add_self_loops=True)).")
        n, e = self.num_nodes, self.num_edges
        if order == "csc" and self._weight is None and is_mapped(self.indices):
            return Graph(*_self_loops_on_disk(self.indptr.numpy(), self.indices.numpy()), None, n)
        ends = self.indptr[1:].numpy()  # a loop goes after the last in-edge of its vertex
        idx = self.indices.numpy()
        new_e = e + n
        indptr = narrow(self.indptr.to(torch.int64) + torch.arange(n + 1), new_e)
        indices = torch.from_numpy(np.insert(idx, ends, np.arange(n, dtype=idx.dtype)))
        indices = indices.to(ids_dtype(n))
        w = None
        if self._weight is not None:
            fill = np.full(n, fill_value, dtype=self._weight.numpy().dtype)
            w = torch.from_numpy(np.insert(self._weight.numpy(), ends, fill))
        perm = None
        if order == "original" and (self._perm is not None or e):
            np_dt = np_idtype(offsets_dtype(new_e))
            old = (self._perm.numpy().astype(np_dt, copy=False) if self._perm is not None
                   else np.arange(e, dtype=np_dt))
            perm = torch.from_numpy(np.insert(old, ends, np.arange(e, new_e, dtype=np_dt)))
        return Graph(indptr, indices, perm, n, w)

    def remove_self_loops(self) -> Graph:
        """A new graph without ``v -> v`` edges (the others keep their order)."""
        dst = self.dst_index()
        keep = self.indices != dst
        if bool(keep.all()):
            return self
        counts = torch.bincount(dst[keep].to(torch.int64), minlength=self.num_nodes)
        indptr = torch.zeros(self.num_nodes + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=indptr[1:])
        e = int(keep.sum())
        perm = None
        if self._perm is not None:
            kept = self._perm[keep].to(torch.int64)
            rank = torch.zeros(self.num_edges, dtype=torch.int64)
            rank[kept] = 1
            rank = torch.cumsum(rank, 0) - 1  # new original id of each kept original id
            perm = narrow(rank[kept], e)
        w = self._weight[keep] if self._weight is not None else None
        factors = self.edge_factors
        return Graph(narrow(indptr, e), self.indices[keep], perm, self.num_nodes, w, factors)

    def symmetrize(self) -> Graph:
        """Undirected version: every edge in both directions, duplicates removed (unweighted)."""
        ei = self.edge_index()
        both = torch.cat([ei, ei.flip(0)], 1)
        n = max(self.num_nodes, 1)
        key = torch.unique(both[1] * n + both[0])
        return Graph.from_edge_index(torch.stack([key % n, key // n]), num_nodes=self.num_nodes)

    def gcn_norm(self, add_self_loops: bool = True, order: str = "original") -> Graph:
        """GCN's symmetric normalization ``w_uv / sqrt(deg(u) deg(v))``, degrees over in-edges.

        Matches ``torch_geometric.nn.conv.gcn_conv.gcn_norm`` (weights default to 1;
        a zero degree gives weight 0). An unweighted graph gets the normalization as
        per-vertex factors (:attr:`edge_factors`: ``deg^-1/2`` on each side), not as an
        ``[E]`` tensor; ``order`` is passed to :meth:`add_self_loops`.
        """
        g = self.add_self_loops(order=order) if add_self_loops else self
        if g._weight is None and g.edge_factors is None:
            deg = g.in_degrees().to(torch.float32)
            dinv = deg.pow(-0.5)
            dinv[torch.isinf(dinv)] = 0
            return Graph(g.indptr, g.indices, g._perm, g.num_nodes,
                         edge_factors=EdgeFactors(dinv, dinv))
        w = g.edge_weight
        deg = torch.zeros(g.num_nodes, dtype=w.dtype).index_add_(0, g.dst_index(), w)
        dinv = deg.pow(-0.5)
        dinv[torch.isinf(dinv)] = 0
        norm = dinv[g.indices] * w * dinv[g.dst_index()]
        return Graph(g.indptr, g.indices, g._perm, g.num_nodes, norm.contiguous())


def _self_loops_on_disk(ip: np.ndarray, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`Graph.add_self_loops` (CSC order) of a structure memory-mapped from disk,
    written to disk beside it a block of destinations at a time
    (:func:`~ngra.mapped.scratch_mapped`): never a whole copy in memory, which at R-MAT
    2^26 would be 4.2 GiB of ids."""
    from ngra.kernels.cpu.util import walk_blocks  # lazy: numba/triton load with the first kernel call

    n = ip.shape[0] - 1
    new_e = int(ip[n]) + n
    out_ip = scratch_mapped(idx, (n + 1,), np_idtype(offsets_dtype(new_e)))
    out_idx = scratch_mapped(idx, (new_e,), np_idtype(ids_dtype(n)))
    for v0, v1 in walk_blocks(ip, (idx,)):
        e0, e1 = int(ip[v0]), int(ip[v1])
        rows = np.arange(v0, v1 + 1, dtype=np.int64)
        out_ip[v0:v1 + 1] = ip[v0:v1 + 1] + rows
        out_idx[e0 + v0:e1 + v1] = np.insert(idx[e0:e1], ip[v0 + 1:v1 + 1] - e0, rows[:-1])
        release_mapped(out_ip, v0, v1 + 1)
        release_mapped(out_idx, e0 + v0, e1 + v1)
    return torch.from_numpy(out_ip), torch.from_numpy(out_idx)


def segment_ids(indptr: torch.Tensor, start: int = 0,
                dtype: torch.dtype = torch.int64, total: int | None = None) -> torch.Tensor:
    """``[indptr[-1]]``: the segment (offset by ``start``) each position belongs to.

    On the CPU numpy's repeat: torch.repeat_interleave wakes the thread pool even for tiny
    inputs (about 25 ms a call with 2 threads here) and is 5x slower on large ones. On
    another device torch's, on that device; ``total`` (``indptr[-1]``, when the caller
    knows it) spares it reading the size back, a wait for the device.
    """
    if indptr.device.type != "cpu":
        ids = torch.arange(start, start + indptr.numel() - 1, dtype=dtype, device=indptr.device)
        return torch.repeat_interleave(ids, indptr.diff(), output_size=total)
    ip = indptr.detach().numpy()
    ids = np.repeat(np.arange(start, start + ip.size - 1, dtype=np_idtype(dtype)), np.diff(ip))
    return torch.from_numpy(ids)


def _as_tensor(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    if isinstance(x, (list, tuple)):
        return torch.as_tensor(x)
    raise TypeError(f"{name} must be a torch.Tensor, numpy array or list; got {type(x).__name__}.")


def _check_csc(ip: torch.Tensor, ix: torch.Tensor, n: int) -> None:
    """CSC invariants: offsets start at 0, never decrease, end at ``E``; ids in ``[0, n)``."""
    a, b = ip.numpy(), ix.numpy()
    if a.size == 0 or int(a[0]) != 0:
        raise ValueError("indptr must start with 0 and have num_nodes + 1 entries.")
    if a.size > 1 and bool((a[1:] < a[:-1]).any()):
        raise ValueError("indptr must be non-decreasing (monotone offsets).")
    if int(a[-1]) != b.size:
        raise ValueError(
            f"indptr[-1] must equal the number of edges ({b.size}); got {int(a[-1])}."
        )
    if b.size and (int(b.min()) < 0 or int(b.max()) >= n):
        raise ValueError(f"indices must be in [0, {n}); "
                         f"got range [{int(b.min())}, {int(b.max())}].")


def _check_weight(edge_weight: Any, num_edges: int) -> torch.Tensor | None:
    if edge_weight is None:
        return None
    w = _as_tensor(edge_weight, "edge_weight")
    if not w.is_floating_point():
        raise TypeError(f"edge_weight must be a float tensor; got dtype {w.dtype}.")
    if w.dim() != 1 or w.numel() != num_edges:
        raise ValueError(f"edge_weight must have shape [{num_edges}] (one per edge); got {list(w.shape)}.")
    if num_edges and not bool(torch.isfinite(w).all()):
        bad = int((~torch.isfinite(w)).nonzero()[0, 0])
        raise ValueError(f"edge_weight must be finite; edge {bad} has weight {float(w[bad])}.")
    return w
