"""Edges held out for link prediction: :func:`split_edges` and the :class:`LinkSplit` it returns.

Conventions (PyG's ``RandomLinkSplit``, OGB's ``get_edge_split``):

* The **pairs** are the graph's distinct vertex pairs, self-loops aside. In an
  **undirected** graph (every edge has its reverse; ``undirected=None`` measures that:
  reciprocity 1.0, see :mod:`~ngra.datasets.direction`) a pair is the unordered
  ``{u, v}``, written ``(min, max)``; otherwise the ordered ``(u, v)``.
* A seeded permutation of the pairs gives ``floor(val * P)`` validation pairs, then
  ``floor(test * P)`` test pairs; the rest are training pairs. Each set is sorted.
* The **message-passing graph** :attr:`LinkSplit.graph` is the input graph less every
  edge of a held-out pair, both directions and every copy of a multi-edge, so no model
  sees a val/test pair, in either direction, while it aggregates. Self-loops stay (they
  are not pairs to predict); edge weights of the kept edges stay.
* ``train_pos`` holds the training pairs (one row per undirected pair, as OGB's
  ``train["edge"]``); the message-passing graph holds them in both directions.
* ``val_neg`` / ``test_neg`` are drawn once, seeded, ``round(neg_ratio * positives)``
  each: distinct pairs, never an edge of the input graph (in either direction when
  undirected), never a self-loop, and disjoint between val and test. On at most
  2**22 vertex pairs they are a random subset of all non-edges (exact on dense graphs);
  beyond, rejection sampling.

Per-epoch training negatives come from :func:`~ngra.datasets.negatives.sample_negatives`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ngra.errors import DatasetError
from ngra.graph import Graph

from .base import NodeDataset, rng_for
from .direction import reciprocity
from .negatives import degree_weights, in_columns, is_edge, sample_negatives, sorted_sources

__all__ = ["LinkSplit", "negative_relations", "split_edges"]

_ENUMERATE_MAX = 1 << 22  # vertex pairs up to which negatives come from the full non-edge list
_ROUNDS = 100


@dataclass(eq=False)
class LinkSplit:
    """A graph split for link prediction.

    Attributes:
        graph: the message-passing graph (no val/test pair in it, either direction).
        train_pos: ``[2, E_train]`` int64 supervision pairs.
        val_pos, test_pos: ``[2, E_val]`` / ``[2, E_test]`` held-out positive pairs.
        val_neg, test_neg: ``[2, M]`` fixed negative pairs (shared by all positives:
            Hits@K, ROC-AUC), or ``None`` when the split has per-positive negatives.
        undirected: whether pairs are unordered (each written once, ``src < dst``).
        x: ``[N, F]`` node features when the source had them, else ``None``.
        val_neg_dst, test_neg_dst: ``[E_val, K]`` per-positive negative destinations (OGB
            ogbl-citation2's ``target_node_neg``: positive ``i`` is ranked against
            ``(val_pos[0, i], val_neg_dst[i, k])``, MRR), or ``None``.
        info: provenance (``seed``, ``val``, ``test``, ``source``, ...).
        edge_type: ``[E_msg]`` relation of each message-passing edge (original edge
            order) when split by relation, else ``None``; ``num_relations`` their count.
        train_rel, val_rel, val_neg_rel, test_rel, test_neg_rel: ``[M]`` int64 relation
            of each pair of the matching part when split by relation, else ``None``.
    """

    graph: Graph
    train_pos: torch.Tensor
    val_pos: torch.Tensor
    val_neg: torch.Tensor | None
    test_pos: torch.Tensor
    test_neg: torch.Tensor | None
    undirected: bool
    x: torch.Tensor | None = None
    val_neg_dst: torch.Tensor | None = None
    test_neg_dst: torch.Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict)
    edge_type: torch.Tensor | None = None
    num_relations: int = 1
    train_rel: torch.Tensor | None = None
    val_rel: torch.Tensor | None = None
    val_neg_rel: torch.Tensor | None = None
    test_rel: torch.Tensor | None = None
    test_neg_rel: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = self.graph.num_nodes
        for name in ("train_pos", "val_pos", "val_neg", "test_pos", "test_neg"):
            t = getattr(self, name)
            if t is None and name.endswith("neg"):
                continue
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.dim() != 2 \
                    or t.shape[0] != 2:
                got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t)
                raise DatasetError(f"LinkSplit.{name} must be a [2, M] int64 tensor; got {got}.")
            if t.numel() and (int(t.min()) < 0 or int(t.max()) >= n):
                raise DatasetError(f"LinkSplit.{name} holds vertex ids in [{int(t.min())}, "
                                   f"{int(t.max())}]; expected ids in [0, {n}).")
        for stage in ("val", "test"):
            dst = getattr(self, f"{stage}_neg_dst")
            pos = getattr(self, f"{stage}_pos")
            if dst is not None and (dst.dim() != 2 or dst.shape[0] != pos.shape[1]):
                raise DatasetError(f"LinkSplit.{stage}_neg_dst must be [{pos.shape[1]}, K] "
                                   f"(a row per positive); got {list(dst.shape)}.")
            if dst is None and getattr(self, f"{stage}_neg") is None:
                raise DatasetError(f"LinkSplit has no {stage} negatives: give {stage}_neg "
                                   f"or {stage}_neg_dst.")

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    def with_val_edges(self) -> Graph:
        """The message-passing graph plus the validation pairs (both directions when
        undirected): PyG's ``RandomLinkSplit`` test-time graph, OGB's
        ``use_valedges_as_input``."""
        add = self.val_pos
        if self.undirected:
            add = torch.cat([add, add.flip(0)], 1)
        ei = torch.cat([self.graph.edge_index(), add], 1)
        w = self.graph.edge_weight_original()
        if w is not None:
            w = torch.cat([w, torch.ones(add.shape[1], dtype=w.dtype)])
        return Graph.from_edge_index(ei, num_nodes=self.num_nodes, edge_weight=w)

    def train_negatives(self, epoch: int, seed: int | None = None, ratio: float = 1.0,
                        dst_range: tuple[int, int] | None = None, *, kind: str = "uniform",
                        degrees: np.ndarray | None = None, return_index: bool = False
                        ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Epoch ``epoch``'s ``round(ratio * E_train)`` training negatives ``[2, M]``: pairs
        that are no edge of :attr:`graph` nor a self-loop, uniform (PyG's per-epoch
        ``negative_sampling``) or ``kind="degree"`` (in proportion to ``degrees``, default
        :func:`~ngra.datasets.negatives.degree_weights` of :attr:`graph`), from
        :func:`~ngra.datasets.negatives.sample_negatives`, so a rank owning destinations
        ``dst_range`` gets its share of the same set. ``seed`` defaults to the split's;
        ``return_index`` also returns each negative's index in the epoch's set (what
        :meth:`negative_relations` reads). They come grouped by destination."""
        seed = int(self.info.get("seed", 0)) if seed is None else seed
        if kind == "degree" and degrees is None:
            degrees = degree_weights(self.graph)
        return sample_negatives(self.num_nodes, self.num_train_negatives(ratio), seed,
                                epoch=epoch, kind=kind, degrees=degrees, exclude=self.graph,
                                dst_range=dst_range, return_index=return_index)

    def negative_relations(self, index: torch.Tensor) -> torch.Tensor | None:
        """The relation of each training negative (by its global ``index`` in the epoch's
        set): negative ``i`` corrupts training pair ``i mod E_train``, so it keeps that
        pair's relation. ``None`` when the split has no relations."""
        return negative_relations(self.train_rel, index)

    def num_train_negatives(self, ratio: float = 1.0) -> int:
        """How many training negatives an epoch draws (before any dropped; see
        :func:`~ngra.datasets.negatives.sample_negatives`)."""
        return round(ratio * self.train_pos.shape[1])

    def summary(self) -> dict[str, Any]:
        """Sizes of each part, as a flat dict."""
        def count(t: torch.Tensor | None) -> int | None:
            return None if t is None else int(t.shape[1])
        return {"num_nodes": self.num_nodes, "message_edges": self.graph.num_edges,
                "undirected": self.undirected, "train_pos": count(self.train_pos),
                "val_pos": count(self.val_pos), "val_neg": count(self.val_neg),
                "test_pos": count(self.test_pos), "test_neg": count(self.test_neg),
                "relations": self.num_relations if self.train_rel is not None else None}


def negative_relations(train_rel: torch.Tensor | None,
                       index: torch.Tensor) -> torch.Tensor | None:
    """:meth:`LinkSplit.negative_relations` from the training pairs' relations alone (what
    a rank holds): ``train_rel[index mod E_train]``, or ``None`` untyped."""
    if train_rel is None:
        return None
    return train_rel.index_select(0, index % max(train_rel.numel(), 1))


def split_edges(
    data: Graph | NodeDataset,
    val: float = 0.05,
    test: float = 0.1,
    seed: int = 0,
    undirected: bool | None = None,
    neg_ratio: float = 1.0,
    by_relation: bool = False,
) -> LinkSplit:
    """Hold out validation and test pairs of a graph (see the module docstring).

    Args:
        data: an :class:`ngra.Graph` or a :class:`NodeDataset` (its ``x`` is kept).
        val: share of the pairs held out for validation, in ``[0, 1)`` (default: 0.05).
        test: share held out for testing, in ``[0, 1)`` (default: 0.1); ``val + test < 1``.
        seed: fixes the permutation and the negatives (default: 0).
        undirected: pairs unordered (``True``), ordered (``False``), or (``None``, default)
            unordered when every edge has its reverse.
        neg_ratio: negatives per held-out positive (default: 1.0, PyG's).
        by_relation: split typed edges (a :class:`NodeDataset` with ``edge_type``) as
            triples ``(u, relation, v)``: a pair is held out in one relation and stays in
            the message-passing graph in the others, which keeps its edges' types; each
            held-out negative (a pair that is no edge in any relation) takes the relation
            of the positive of its position (DistMult-style relational link prediction).

    Raises:
        DatasetError: bad fractions, too few pairs for the requested split (the message
            says how many are needed), or too few non-edges for the negatives.
    """
    if isinstance(data, NodeDataset):
        graph, x = data.graph, data.x
    elif isinstance(data, Graph):
        graph, x = data, None
    else:
        raise TypeError(f"split_edges takes an ngra.Graph or a NodeDataset; got "
                        f"{type(data).__name__}.")
    for name, frac in (("val", val), ("test", test)):
        if not 0 <= frac < 1:
            raise DatasetError(f"split_edges: {name} must be a fraction in [0, 1); got {frac}.")
    if val + test >= 1:
        raise DatasetError(f"split_edges: val + test must be < 1 to leave training pairs; got "
                           f"val={val} + test={test} = {val + test}.")
    if neg_ratio < 0:
        raise DatasetError(f"split_edges: neg_ratio must be >= 0; got {neg_ratio}.")
    n = graph.num_nodes
    if undirected is None:
        undirected = reciprocity(graph) == 1.0
    ei = graph.edge_index().numpy()
    keys = _pair_keys(ei[0], ei[1], n, undirected)
    rel = num_rel = None
    if by_relation:
        rel, num_rel = _relations(data, n)
        keys = rel * (n * n) + keys  # (relation, pair): one key a triple
    loops = ei[0] == ei[1]
    pairs = _sorted_unique(keys[~loops])
    kind = "undirected" if undirected else "directed"
    num_val, num_test = _count(val, pairs.size), _count(test, pairs.size)
    for name, frac, k in (("val", val, num_val), ("test", test, num_test)):
        if frac > 0 and k == 0:
            need = math.ceil(1 / frac - 1e-9)
            raise DatasetError(
                f"split_edges: {name}={frac} of the graph's {pairs.size} {kind} pairs "
                f"(self-loops aside) holds out none; at least {need} pairs are needed. Use a "
                f"larger graph or a larger {name} fraction.")
    if pairs.size - num_val - num_test < 1:
        raise DatasetError(f"split_edges: the graph has {pairs.size} {kind} pairs; val={val}, "
                           f"test={test} leave no training pair (at least 1 is needed).")
    perm = rng_for(seed, "linksplit").permutation(pairs.size)
    val_keys = np.sort(pairs[perm[:num_val]])
    test_keys = np.sort(pairs[perm[num_val:num_val + num_test]])
    train_keys = np.sort(pairs[perm[num_val + num_test:]])
    keep = ~_held_edges(graph, np.concatenate([val_keys, test_keys]), undirected, rel)
    w = graph.edge_weight_original()
    message = Graph.from_edge_index(torch.from_numpy(ei[:, keep]), num_nodes=n,
                                    edge_weight=None if w is None else w[torch.from_numpy(keep)])
    n_val_neg, n_test_neg = round(neg_ratio * num_val), round(neg_ratio * num_test)
    plain = pairs if rel is None else _sorted_unique(pairs % (n * n))
    neg = _non_edges(graph, n_val_neg + n_test_neg, plain, undirected, rng_for(seed, "linkneg"))
    nn2 = n * n
    strip = (lambda k: k) if rel is None else (lambda k: k % nn2)  # the pair of a triple
    out = LinkSplit(
        graph=message, train_pos=_pairs(strip(train_keys), n),
        val_pos=_pairs(strip(val_keys), n),
        val_neg=_pairs(neg[:n_val_neg], n), test_pos=_pairs(strip(test_keys), n),
        test_neg=_pairs(neg[n_val_neg:], n), undirected=bool(undirected), x=x,
        info={"seed": seed, "val": val, "test": test, "neg_ratio": neg_ratio,
              "by_relation": bool(by_relation)},
    )
    if rel is not None:
        val_rel, test_rel = torch.from_numpy(val_keys // nn2), torch.from_numpy(test_keys // nn2)
        out.edge_type = torch.from_numpy(rel[keep])
        out.num_relations = num_rel
        out.train_rel = torch.from_numpy(train_keys // nn2)
        out.val_rel, out.test_rel = val_rel, test_rel
        out.val_neg_rel = val_rel[torch.arange(n_val_neg) % max(num_val, 1)]
        out.test_neg_rel = test_rel[torch.arange(n_test_neg) % max(num_test, 1)]
    return out


def _relations(data: Any, n: int) -> tuple[np.ndarray, int]:
    """The ``[E]`` int64 relations of a typed dataset, and their count; checks that triple
    keys ``relation * N^2 + pair`` fit in int64."""
    if not isinstance(data, NodeDataset) or data.edge_type is None:
        raise DatasetError("split_edges(by_relation=True) splits typed edges: give a "
                           "NodeDataset with edge_type (this one has no edge types).")
    k = int(data.num_edge_types)
    if k * n * n >= 1 << 62:
        raise DatasetError(f"split_edges(by_relation=True): {k} relations over {n} vertices "
                           "are too many to key each triple in 64 bits.")
    return data.edge_type.numpy().astype(np.int64), k


def _count(frac: float, total: int) -> int:
    return int(math.floor(frac * total + 1e-9))  # 0.29 * 100 is 28.999...


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    """Sort + neighbour compare: numpy 2's hash-based ``np.unique`` is several times slower."""
    keys = np.sort(keys)
    if keys.size > 1:
        keys = keys[np.r_[True, keys[1:] != keys[:-1]]]
    return keys


def _pair_keys(src: np.ndarray, dst: np.ndarray, n: int, undirected: bool) -> np.ndarray:
    src, dst = src.astype(np.int64), dst.astype(np.int64)
    if undirected:
        src, dst = np.minimum(src, dst), np.maximum(src, dst)
    return src * n + dst


def _pairs(keys: np.ndarray, n: int) -> torch.Tensor:
    return torch.from_numpy(np.stack([keys // max(n, 1), keys % max(n, 1)]).astype(np.int64))


def _held_edges(graph: Graph, held: np.ndarray, undirected: bool,
                rel: np.ndarray | None) -> np.ndarray:
    """``[E]`` bool, in the graph's original edge order: whether each edge is a copy of a
    held-out pair (either direction when ``undirected``; of its own relation when keys
    are triples ``relation * N^2 + pair``). The held pairs become sorted columns over
    their destinations and the edges are looked up in CSC order, so each column is
    searched while in cache (a binary search of every edge among all held keys took
    10 s on R-MAT 2^20)."""
    n = graph.num_nodes
    r, pk = held // (n * n), held % (n * n)
    a, b = pk // n, pk % n
    col, val = (np.concatenate([b, a]), np.concatenate([r * n + a, r * n + b])) if undirected \
        else (b, r * n + a)
    order = np.lexsort((val, col))
    col, val = col[order], val[order]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(col, minlength=n), out=ptr[1:])
    src = graph.indices.numpy().astype(np.int64)
    dst = graph.dst_index().numpy()
    if rel is not None:  # each CSC edge's relation: the original order's, permuted
        src += graph.to_csc_order(torch.from_numpy(rel)).numpy() * n
    hit = in_columns(ptr, val, dst, src)
    return graph.to_original_order(torch.from_numpy(hit)).numpy()


def _non_edges(graph: Graph, k: int, pairs: np.ndarray, undirected: bool,
               rng: np.random.Generator) -> np.ndarray:
    """``[k]`` distinct keys of pairs that are neither an edge of ``graph`` (whose
    ``pairs`` are given, sorted) nor a self-loop, in random order."""
    n = graph.num_nodes
    possible = n * (n - 1) // 2 if undirected else n * (n - 1)
    free = possible - pairs.size
    if k > free:
        kind = "undirected" if undirected else "directed"
        raise DatasetError(
            f"split_edges: {k} negative pairs are needed but the graph ({n} vertices, "
            f"{pairs.size} of its {possible} possible {kind} pairs are edges) has only {free} "
            "non-edges. Lower neg_ratio, val or test, or use a sparser graph.")
    if k == 0:
        return np.empty(0, dtype=np.int64)
    if n * n <= _ENUMERATE_MAX:
        cand = np.arange(n * n, dtype=np.int64)
        s, d = cand // n, cand % n
        cand = cand[(s < d) if undirected else (s != d)]
        cand = cand[~_is_pair(graph, cand, undirected)]
        return cand[rng.choice(cand.size, size=k, replace=False)]
    have = np.empty(0, dtype=np.int64)
    for _ in range(_ROUNDS):
        m = 2 * (k - have.size) + 16
        cand = _pair_keys(rng.integers(0, n, m), rng.integers(0, n, m), n, undirected)
        cand = cand[cand // n != cand % n]
        cand = cand[~_is_pair(graph, cand, undirected)]
        have = np.concatenate([have, cand])
        _, first = np.unique(have, return_index=True)
        have = have[np.sort(first)]
        if have.size >= k:
            return have[:k]
    raise DatasetError(f"split_edges: found only {have.size} of {k} negative pairs after "
                       f"{_ROUNDS} rounds of sampling; lower neg_ratio, val or test.")


def _is_pair(graph: Graph, keys: np.ndarray, undirected: bool) -> np.ndarray:
    """Whether each pair key ``src * N + dst`` is an edge of ``graph`` (either direction
    when ``undirected``): a search within the destination's column
    (:func:`~ngra.datasets.negatives.is_edge`)."""
    n, idx = graph.num_nodes, sorted_sources(graph)
    src, dst = keys // n, keys % n
    found = is_edge(graph, src, dst, idx)
    if undirected:
        found |= is_edge(graph, dst, src, idx)
    return found
