"""The immutable, validated graph every ngra layer runs on.

A :class:`Graph` stores its edges destination-sorted (CSC): ``indptr`` over
destinations and ``indices`` holding the source of each edge, plus ``perm``, the
position of each CSC edge in the caller's original edge order. Edge data handed
to a layer is always in the original order; the runtime permutes it once.
The reverse direction (CSR over sources), used by backward passes, is built on
first use and cached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["Graph", "CSR", "segment_ids"]

#: Most vertices a graph may have (its offsets are allocated per vertex up front).
MAX_NODES = 2**31 - 1
_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


@dataclass(frozen=True)
class CSR:
    """Source-sorted view of a graph.

    Attributes:
        indptr: ``[num_nodes + 1]`` offsets over sources.
        indices: ``[E]`` destination of each edge.
        perm: ``[E]`` position of each CSR edge in CSC order.
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    perm: torch.Tensor


class Graph:
    """A directed graph in destination-sorted CSC form. Immutable.

    Messages flow along edges ``src -> dst``; a layer's Gather reduces over each
    destination's in-edges. Build one with :meth:`from_edge_index`,
    :meth:`from_scipy`, :meth:`from_pyg` or :meth:`from_dgl`.

    Attributes:
        num_nodes: number of vertices ``N``.
        indptr: ``[N + 1]`` int64 offsets over destinations.
        indices: ``[E]`` int64 source of each CSC edge.
        perm: ``[E]`` int64, original edge id of each CSC edge.
        edge_weight: ``[E]`` float edge weights in CSC order, or ``None``.
    """

    __slots__ = ("num_nodes", "indptr", "indices", "perm", "edge_weight", "_cache", "_frozen")

    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        perm: torch.Tensor,
        num_nodes: int,
        edge_weight: torch.Tensor | None = None,
    ) -> None:
        # Internal constructor: arguments are trusted (built by the from_* methods).
        object.__setattr__(self, "num_nodes", int(num_nodes))
        object.__setattr__(self, "indptr", indptr)
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "perm", perm)
        object.__setattr__(self, "edge_weight", edge_weight)
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"ngra.Graph is immutable; cannot set {name!r}. Build a new Graph.")

    def __reduce__(self) -> tuple:
        # Slots + a refusing __setattr__: rebuild through the constructor (pickle, copy).
        return (Graph, (self.indptr, self.indices, self.perm, self.num_nodes, self.edge_weight))

    def __repr__(self) -> str:
        w = ", weighted" if self.edge_weight is not None else ""
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
        # Stable sort keeps multi-edges in input order: deterministic CSC.
        perm = torch.argsort(dst, stable=True)
        indices = src[perm].contiguous()
        counts = torch.bincount(dst, minlength=num_nodes)
        indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=indptr[1:])
        w = weight[perm].contiguous() if weight is not None else None
        return cls(indptr, indices, perm, num_nodes, w)

    @classmethod
    def from_csc(
        cls,
        indptr: Any,
        indices: Any,
        num_nodes: int | None = None,
        edge_weight: Any = None,
    ) -> Graph:
        """Build from destination-sorted CSC arrays (validated; edge order = CSC order)."""
        ip = _as_tensor(indptr, "indptr")
        ix = _as_tensor(indices, "indices")
        for name, t in (("indptr", ip), ("indices", ix)):
            if t.dtype not in _INT_DTYPES:
                raise TypeError(f"{name} must be an integer tensor; got dtype {t.dtype}.")
            if t.dim() != 1:
                raise ValueError(f"{name} must be 1-D; got shape {list(t.shape)}.")
        ip, ix = ip.to(torch.int64), ix.to(torch.int64)
        if ip.numel() == 0 or int(ip[0]) != 0:
            raise ValueError("indptr must start with 0 and have num_nodes + 1 entries.")
        if bool((ip[1:] < ip[:-1]).any()):
            raise ValueError("indptr must be non-decreasing (monotone offsets).")
        if int(ip[-1]) != ix.numel():
            raise ValueError(
                f"indptr[-1] must equal the number of edges ({ix.numel()}); got {int(ip[-1])}."
            )
        n = ip.numel() - 1
        if num_nodes is not None and num_nodes != n:
            raise ValueError(f"indptr describes {n} nodes but num_nodes={num_nodes}.")
        if ix.numel() and (int(ix.min()) < 0 or int(ix.max()) >= n):
            raise ValueError(f"indices must be in [0, {n}); got range [{int(ix.min())}, {int(ix.max())}].")
        w = _check_weight(edge_weight, ix.numel())
        return cls(ip, ix.contiguous(), torch.arange(ix.numel()), n, w)

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
        """``[2, E]`` (src, dst). ``order="original"`` (input order) or ``"csc"``."""
        ei = torch.stack([self.indices, self.dst_index()])
        if order == "csc":
            return ei
        if order != "original":
            raise ValueError(f"order must be 'original' or 'csc'; got {order!r}.")
        out = torch.empty_like(ei)
        out[:, self.perm] = ei
        return out

    def edge_weight_original(self) -> torch.Tensor | None:
        """Edge weights in the original edge order (or ``None``)."""
        if self.edge_weight is None:
            return None
        out = torch.empty_like(self.edge_weight)
        out[self.perm] = self.edge_weight
        return out

    def to_scipy(self):
        """scipy.sparse CSC matrix ``A`` with ``A[src, dst]`` = weight (1 when unweighted)."""
        import scipy.sparse as sp

        n = self.num_nodes
        data = self.edge_weight.numpy() if self.edge_weight is not None else np.ones(self.num_edges, np.float32)
        # CSC of A[src, dst]: columns are destinations, row indices are sources.
        return sp.csc_matrix((data, self.indices.numpy(), self.indptr.numpy()), shape=(n, n))

    def to_pyg(self):
        """A ``torch_geometric.data.Data`` with ``edge_index`` (and ``edge_weight``)."""
        from torch_geometric.data import Data

        d = Data(edge_index=self.edge_index(), num_nodes=self.num_nodes)
        if self.edge_weight is not None:
            d.edge_weight = self.edge_weight_original()
        return d

    def to_dgl(self, weight_field: str = "w"):
        """A DGL graph with edges in original order (weights in ``edata[weight_field]``)."""
        from ngra._compat import import_dgl

        dgl = import_dgl()
        ei = self.edge_index()
        g = dgl.graph((ei[0], ei[1]), num_nodes=self.num_nodes)
        if self.edge_weight is not None:
            g.edata[weight_field] = self.edge_weight_original()
        return g

    # ------------------------------------------------------------ properties
    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())

    def in_degrees(self) -> torch.Tensor:
        """``[N]`` int64 in-degree of every vertex."""
        return self.indptr[1:] - self.indptr[:-1]

    def out_degrees(self) -> torch.Tensor:
        """``[N]`` int64 out-degree of every vertex."""
        return torch.bincount(self.indices, minlength=self.num_nodes)

    def dst_index(self) -> torch.Tensor:
        """``[E]`` destination of each CSC edge (cached)."""
        if "dst" not in self._cache:
            self._cache["dst"] = segment_ids(self.indptr)
        return self._cache["dst"]

    def csr(self) -> CSR:
        """Source-sorted view (cached): offsets over sources, destinations, CSC positions."""
        if "csr" not in self._cache:
            perm = torch.argsort(self.indices, stable=True)
            counts = torch.bincount(self.indices, minlength=self.num_nodes)
            indptr = torch.zeros(self.num_nodes + 1, dtype=torch.int64, device=counts.device)
            torch.cumsum(counts, 0, out=indptr[1:])
            self._cache["csr"] = CSR(indptr, self.dst_index()[perm].contiguous(), perm)
        return self._cache["csr"]

    def to(self, device: torch.device | str) -> Graph:
        """This graph with its arrays (and a built reverse CSR) on ``device``."""
        device = torch.device(device)
        if self.indptr.device == device:
            return self
        w = None if self.edge_weight is None else self.edge_weight.to(device)
        g = Graph(self.indptr.to(device), self.indices.to(device), self.perm.to(device),
                  self.num_nodes, w)
        if "csr" in self._cache:
            c = self._cache["csr"]
            g._cache["csr"] = CSR(c.indptr.to(device), c.indices.to(device), c.perm.to(device))
        return g

    def has_self_loops(self) -> bool:
        return bool((self.indices == self.dst_index()).any())

    # -------------------------------------------------------------- helpers
    def with_edge_weight(self, edge_weight: Any) -> Graph:
        """Same edges, new ``[E]`` weights given in original edge order."""
        w = _check_weight(edge_weight, self.num_edges)
        return Graph(self.indptr, self.indices, self.perm, self.num_nodes, None if w is None else w[self.perm].contiguous())

    def add_self_loops(self, fill_value: float = 1.0) -> Graph:
        """A new graph with one self-loop added to every vertex (existing ones are kept).

        New loops get ``fill_value`` as weight when the graph is weighted and are
        appended after the original edges in the original order.
        """
        n = self.num_nodes
        loops = torch.arange(n).repeat(2, 1)
        ei = torch.cat([self.edge_index(), loops], 1)
        w = None
        if self.edge_weight is not None:
            w = torch.cat([self.edge_weight_original(), torch.full((n,), fill_value, dtype=self.edge_weight.dtype)])
        return Graph.from_edge_index(ei, num_nodes=n, edge_weight=w)

    def remove_self_loops(self) -> Graph:
        ei = self.edge_index()
        keep = ei[0] != ei[1]
        w = self.edge_weight_original()
        return Graph.from_edge_index(ei[:, keep], num_nodes=self.num_nodes, edge_weight=None if w is None else w[keep])

    def symmetrize(self) -> Graph:
        """Undirected version: every edge in both directions, duplicates removed (unweighted)."""
        ei = self.edge_index()
        both = torch.cat([ei, ei.flip(0)], 1)
        n = max(self.num_nodes, 1)
        key = torch.unique(both[1] * n + both[0])
        return Graph.from_edge_index(torch.stack([key % n, key // n]), num_nodes=self.num_nodes)

    def gcn_norm(self, add_self_loops: bool = True) -> Graph:
        """GCN's symmetric normalization ``w_uv / sqrt(deg(u) deg(v))``, degrees over in-edges.

        Matches ``torch_geometric.nn.conv.gcn_conv.gcn_norm`` (weights default to 1;
        a zero degree gives weight 0).
        """
        g = self.add_self_loops() if add_self_loops else self
        w = g.edge_weight if g.edge_weight is not None else torch.ones(g.num_edges)
        deg = torch.zeros(g.num_nodes, dtype=w.dtype).index_add_(0, g.dst_index(), w)
        dinv = deg.pow(-0.5)
        dinv[torch.isinf(dinv)] = 0
        norm = dinv[g.indices] * w * dinv[g.dst_index()]
        return Graph(g.indptr, g.indices, g.perm, g.num_nodes, norm.contiguous())


def segment_ids(indptr: torch.Tensor, start: int = 0) -> torch.Tensor:
    """``[indptr[-1]]`` int64: the segment (offset by ``start``) each position belongs to.

    numpy's repeat: torch.repeat_interleave wakes the thread pool even for tiny
    inputs (about 25 ms a call with 2 threads here) and is 5x slower on large ones.
    """
    ip = indptr.detach().cpu().numpy()
    ids = np.repeat(np.arange(start, start + ip.size - 1, dtype=np.int64), np.diff(ip))
    return torch.from_numpy(ids).to(indptr.device)


def _as_tensor(x: Any, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    if isinstance(x, (list, tuple)):
        return torch.as_tensor(x)
    raise TypeError(f"{name} must be a torch.Tensor, numpy array or list; got {type(x).__name__}.")


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
