"""Many small graphs as one block-diagonal :class:`~ngra.graph.Graph`, and a loader of them.

A :class:`~ngra.datasets.graphs.GraphDataset` keeps all its graphs in one CSC structure
over global node ids, with per-graph node offsets ``node_ptr`` ``[G + 1]``. Because each
graph's nodes are contiguous and no edge joins two graphs, each graph's edges are
contiguous in CSC order too: graph ``g`` owns nodes ``node_ptr[g]:node_ptr[g+1]`` and
edges ``indptr[node_ptr[g]]:indptr[node_ptr[g+1]]``.

Selecting graphs ``idx`` (any order, repeats allowed) is therefore one vectorized pass,
no loop over graphs (:func:`gather_graphs`):

1. each selected graph's node and edge ranges, concatenated (``np.repeat`` of each
   range's start shift plus one ``arange``);
2. the new ``indptr``: the cumulative in-degrees of the gathered nodes;
3. the new ``indices``: the gathered sources shifted by ``new_start - old_start`` of
   their graph.

The result is destination-sorted by construction (graphs in batch order, each in its
own CSC order), so :meth:`Graph.from_csc` takes it as is and edge data gathered with the
same edge selection is in the batch graph's edge order. :func:`collate` wraps it in a
:class:`GraphBatch`; :class:`GraphLoader` iterates batches in an order drawn from
``(seed, epoch)`` only, so a run is repeatable and a resumed run sees the same batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ngra.graph import Graph

if TYPE_CHECKING:
    from .graphs import GraphDataset

__all__ = ["GraphBatch", "GraphLoader", "Selection", "collate", "gather_graphs"]


@dataclass(frozen=True)
class Selection:
    """Where the selected graphs' nodes and edges come from, and their new CSC structure.

    Attributes:
        node_sel: ``[N_b]`` int64 source node of each new node.
        edge_sel: ``[E_b]`` int64 source edge (CSC position) of each new edge.
        indptr: ``[N_b + 1]`` int64 new CSC offsets.
        indices: ``[E_b]`` int64 new source ids (in ``[0, N_b)``).
        node_ptr: ``[B + 1]`` int64 new per-graph node offsets.
        edge_ptr: ``[B + 1]`` int64 new per-graph edge offsets.
        graphs: ``[B]`` int64 selected graph ids (negative ones counted from the end).
    """

    node_sel: np.ndarray
    edge_sel: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    node_ptr: np.ndarray
    edge_ptr: np.ndarray
    graphs: np.ndarray


def _ranges(starts: np.ndarray, counts: np.ndarray, out_ptr: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(starts[i], starts[i] + counts[i])`` in one pass."""
    return np.arange(int(out_ptr[-1]), dtype=np.int64) + np.repeat(starts - out_ptr[:-1], counts)


def _offsets(counts: np.ndarray) -> np.ndarray:
    ptr = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr


def gather_graphs(
    node_ptr: np.ndarray, indptr: np.ndarray, indices: np.ndarray, idx: np.ndarray
) -> Selection:
    """Graphs ``idx`` of a concatenated CSC structure, concatenated in ``idx`` order.

    Args:
        node_ptr: ``[G + 1]`` per-graph node offsets.
        indptr: ``[N + 1]`` CSC offsets over all nodes.
        indices: ``[E]`` global source id of each edge.
        idx: ``[B]`` graph ids in ``[0, G)``, any order, repeats allowed.
    """
    idx = np.asarray(idx, dtype=np.int64)
    num_graphs = node_ptr.size - 1
    if idx.size and (int(idx.min()) < -num_graphs or int(idx.max()) >= num_graphs):
        bad = idx[(idx < -num_graphs) | (idx >= num_graphs)][0]
        raise IndexError(f"graph index {int(bad)} is out of range for {num_graphs} graphs.")
    idx = np.where(idx < 0, idx + num_graphs, idx)
    n_start, n_end = node_ptr[idx], node_ptr[idx + 1]
    new_node_ptr = _offsets(n_end - n_start)
    node_sel = _ranges(n_start, n_end - n_start, new_node_ptr)
    e_start, e_end = indptr[n_start], indptr[n_end]
    new_edge_ptr = _offsets(e_end - e_start)
    edge_sel = _ranges(e_start, e_end - e_start, new_edge_ptr)
    new_indptr = _offsets(indptr[node_sel + 1] - indptr[node_sel])
    shift = np.repeat(new_node_ptr[:-1] - n_start, e_end - e_start)
    new_indices = indices[edge_sel] + shift
    return Selection(node_sel, edge_sel, new_indptr, new_indices, new_node_ptr, new_edge_ptr,
                     idx)


@dataclass(frozen=True, eq=False)
class GraphBatch:
    """Graphs merged into one block-diagonal graph (no edge between two of them).

    Attributes:
        graph: the merged :class:`~ngra.graph.Graph`, ``N`` nodes, ``E`` edges.
        x: ``[N, F]`` node features.
        y: ``[B]`` int64 graph labels in ``[0, num_classes)``.
        graph_ids: ``[N]`` int64 graph (``0..B-1``) of each node, non-decreasing.
        ptr: ``[B + 1]`` int64 node offsets: graph ``b`` owns nodes ``ptr[b]:ptr[b+1]``
            (the readouts of :mod:`ngra.models.readout` reduce over it).
        edge_attr: ``[E, D]`` float edge features in the graph's edge order, or ``None``.
        edge_label: ``[E]`` (or ``[E, K]``) int64 raw edge labels, or ``None``.
        index: ``[B]`` int64 dataset id of each graph.
    """

    graph: Graph
    x: torch.Tensor
    y: torch.Tensor
    graph_ids: torch.Tensor
    ptr: torch.Tensor
    edge_attr: torch.Tensor | None
    edge_label: torch.Tensor | None
    index: torch.Tensor

    @property
    def num_graphs(self) -> int:
        return int(self.ptr.numel() - 1)

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    def to(self, device: torch.device | str) -> GraphBatch:
        """The batch with every tensor (and the graph) on ``device``."""
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return GraphBatch(self.graph.to(device), self.x.to(device), self.y.to(device),
                          self.graph_ids.to(device), self.ptr.to(device), move(self.edge_attr),
                          move(self.edge_label), self.index)

    def __repr__(self) -> str:
        return (f"GraphBatch(num_graphs={self.num_graphs}, num_nodes={self.num_nodes}, "
                f"num_edges={self.graph.num_edges}, x={list(self.x.shape)})")


def collate(dataset: GraphDataset, idx: Sequence[int] | np.ndarray | torch.Tensor) -> GraphBatch:
    """Graphs ``idx`` of ``dataset`` as one :class:`GraphBatch`, in ``idx`` order."""
    sel = dataset.selection(torch.as_tensor(idx, dtype=torch.int64).reshape(-1).numpy())
    index = torch.from_numpy(sel.graphs)
    node_sel, edge_sel = torch.from_numpy(sel.node_sel), torch.from_numpy(sel.edge_sel)
    graph = Graph.from_csc(torch.from_numpy(sel.indptr), torch.from_numpy(sel.indices),
                           validate=False)  # built from a validated dataset, sorted by construction
    counts = np.diff(sel.node_ptr)
    graph_ids = torch.from_numpy(np.repeat(np.arange(counts.size, dtype=np.int64), counts))

    def edges(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.index_select(0, edge_sel)

    return GraphBatch(
        graph=graph,
        x=dataset.x.index_select(0, node_sel),
        y=dataset.y.index_select(0, index),
        graph_ids=graph_ids,
        ptr=torch.from_numpy(sel.node_ptr),
        edge_attr=edges(dataset.edge_attr),
        edge_label=edges(dataset.edge_label),
        index=index,
    )


class GraphLoader:
    """Batches of a :class:`~ngra.datasets.graphs.GraphDataset`, each a :class:`GraphBatch`.

    The order of an epoch is a function of ``(seed, epoch)`` alone. Each full or partial
    pass over the loader uses the current epoch and then advances it, so
    ``for epoch in range(E): for batch in loader: ...`` shuffles differently every epoch;
    :meth:`set_epoch` picks the epoch of the next pass (to resume, or to replay one).

    Args:
        dataset: the graphs.
        batch_size: graphs per batch (the last one may hold fewer).
        shuffle: draw a new order every epoch (default: ``False``, dataset order).
        seed: seed of the shuffles (default: ``0``).
        drop_last: leave out a last batch smaller than ``batch_size`` (default: ``False``).
    """

    def __init__(self, dataset: GraphDataset, batch_size: int, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = False) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1; got {batch_size!r}.")
        self.dataset, self.batch_size = dataset, batch_size
        self.shuffle, self.seed, self.drop_last = bool(shuffle), int(seed), bool(drop_last)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next pass uses."""
        self.epoch = int(epoch)

    def order(self, epoch: int | None = None) -> np.ndarray:
        """``[G]`` graph ids in the order of ``epoch`` (default: the next pass's)."""
        epoch = self.epoch if epoch is None else int(epoch)
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        rng = np.random.default_rng([self.seed & 0xFFFFFFFF, epoch & 0xFFFFFFFF])
        return rng.permutation(n).astype(np.int64)

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[GraphBatch]:
        order = self.order()
        self.epoch += 1
        for b in range(len(self)):
            yield collate(self.dataset, order[b * self.batch_size:(b + 1) * self.batch_size])
