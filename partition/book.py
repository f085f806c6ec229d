"""The partition book of multi-device training: who owns each vertex, and what each rank reads.

``K`` ranks split the vertices. A *reordering* (:class:`~ngra.partition.Reordering`,
``order[new] = old``) makes every rank's vertices one contiguous range of new ids:
rank ``r`` owns new ids ``[bounds[r], bounds[r + 1])`` (its *destination range*) and
every in-edge of those vertices. Two methods:

* ``"metis"``: METIS k-way parts balanced by Gather work (``1 + in-degree`` a vertex,
  :func:`~ngra.partition.metis_parts`), few edges crossing parts; vertices grouped by
  part, then by original id;
* ``"range"``: the original order cut into edge-balanced ranges
  (:func:`~ngra.partition.edge_balanced_ranges`); no relabeling.

Rank ``r``'s in-edges are the reordered graph's CSC positions
``[edge_bounds[r], edge_bounds[r + 1])``. Its *halo* is the exact set of remote source
rows those edges read: the sorted new ids of sources owned by other ranks (grouped by
owner, since owners are contiguous ranges). A rank's *local rows* are its owned rows
(local ids ``0 .. D - 1``, new id ``bounds[r] + i``) followed by its halo rows (local ids
``D .. D + H - 1``); :meth:`PartitionBook.local_ids` maps them back.

A book is built once per graph, ``K`` and method (:func:`build_book`), written to a
folder (:func:`save_book`: ``book.pt`` with the arrays, ``book.json`` with the figures a
person reads: edge cut, halo rows, balance) and checked against the graph it is used
with (:func:`check_book`): a book of another graph, or of an older version of this one
(a *stale* book, by the graph's structural fingerprint), is refused with a message that
says how to rebuild it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ngra.diskspace import atomic_output, write_file
from ngra.graph import Graph
from ngra.partition.kway import _check_k, edge_balanced_ranges, metis_parts
from ngra.partition.reorder import Reordering, permute_graph

__all__ = ["BOOK_METHODS", "BOOK_SEED", "BookError", "PartitionBook", "book_for", "build_book",
           "check_book", "graph_fingerprint", "load_book", "save_book"]

BOOK_METHODS = ("metis", "range")
#: The METIS seed of cached books (independent of a run's seed: one book serves every run).
BOOK_SEED = 0
BOOK_VERSION = 1

log = logging.getLogger(__name__)
_ARRAYS = ("order", "bounds", "edge_bounds", "halo_ptr", "halo")


class BookError(ValueError):
    """A partition book is damaged, or does not belong to the graph it is used with."""


@dataclass(frozen=True, eq=False)
class PartitionBook:
    """Ownership, destination ranges, in-edges and halos of a ``K``-way partition.

    Attributes:
        num_parts: ``K``. num_nodes, num_edges: of the partitioned graph.
        method: ``"metis"`` or ``"range"``. seed: the METIS seed.
        fingerprint: :func:`graph_fingerprint` of the partitioned graph.
        edge_cut: edges whose source and destination have different owners.
        spec: the dataset spec it was built for (``None`` when built from a bare graph).
        reordering: new vertex ids (``order[new] = old``, ``rank[old] = new``).
        bounds: ``[K + 1]`` int64: rank ``r`` owns new ids ``[bounds[r], bounds[r + 1])``.
        edge_bounds: ``[K + 1]`` int64: rank ``r``'s in-edges in the reordered CSC.
        halo_ptr: ``[K + 1]`` int64 offsets into ``halo``.
        halo: ``[sum_r H_r]`` int64: rank ``r``'s halo (sorted new ids) is
            ``halo[halo_ptr[r]:halo_ptr[r + 1]]``.
    """

    num_parts: int
    num_nodes: int
    num_edges: int
    method: str
    seed: int
    fingerprint: str
    edge_cut: int
    spec: str | None
    reordering: Reordering
    bounds: torch.Tensor
    edge_bounds: torch.Tensor
    halo_ptr: torch.Tensor
    halo: torch.Tensor

    # ------------------------------------------------------------ per rank
    def owned(self, rank: int) -> tuple[int, int]:
        """Rank ``rank``'s destination range ``[lo, hi)`` of new ids."""
        self._check_rank(rank)
        return int(self.bounds[rank]), int(self.bounds[rank + 1])

    def halo_of(self, rank: int) -> torch.Tensor:
        """``[H]`` sorted new ids of the remote sources rank ``rank`` reads."""
        self._check_rank(rank)
        return self.halo[int(self.halo_ptr[rank]): int(self.halo_ptr[rank + 1])]

    def local_ids(self, rank: int) -> torch.Tensor:
        """``[D + H]`` new id of each local row of ``rank``: owned rows, then halo rows."""
        lo, hi = self.owned(rank)
        return torch.cat([torch.arange(lo, hi, dtype=torch.int64), self.halo_of(rank)])

    def to_local(self, rank: int, new_ids: torch.Tensor) -> torch.Tensor:
        """Local row of each new id for ``rank`` (``-1`` where the id is not local)."""
        lo, hi = self.owned(rank)
        ids = torch.as_tensor(new_ids, dtype=torch.int64)
        halo = self.halo_of(rank)
        out = torch.full_like(ids, -1)
        own = (ids >= lo) & (ids < hi)
        out[own] = ids[own] - lo
        if halo.numel():
            pos = torch.searchsorted(halo, ids).clamp(max=halo.numel() - 1)
            hit = ~own & (halo[pos] == ids)
            out[hit] = pos[hit] + (hi - lo)
        return out

    def owner(self) -> torch.Tensor:
        """``[N]`` rank owning each ORIGINAL vertex id."""
        new_owner = torch.repeat_interleave(torch.arange(self.num_parts),
                                            self.bounds[1:] - self.bounds[:-1])
        return new_owner[self.reordering.rank]

    def recv_counts(self, rank: int) -> list[int]:
        """Halo rows of ``rank`` owned by each rank (``[K]``; its own entry is 0)."""
        halo = self.halo_of(rank)
        cuts = torch.searchsorted(halo, self.bounds)
        return (cuts[1:] - cuts[:-1]).tolist()

    def send_rows(self, rank: int, peer: int) -> torch.Tensor:
        """Owned rows of ``rank`` (local ids) that ``peer`` reads, in ``peer``'s halo order."""
        lo, hi = self.owned(rank)
        halo = self.halo_of(peer)
        a, b = (int(i) for i in torch.searchsorted(halo, torch.tensor([lo, hi])))
        return halo[a:b] - lo

    # ------------------------------------------------------------ figures
    def figures(self) -> dict[str, Any]:
        """Edge cut, per-rank vertices / in-edges / halo rows, balance (max / mean)."""
        k = self.num_parts
        verts = (self.bounds[1:] - self.bounds[:-1]).tolist()
        edges = (self.edge_bounds[1:] - self.edge_bounds[:-1]).tolist()
        halos = (self.halo_ptr[1:] - self.halo_ptr[:-1]).tolist()
        cut = self.edge_cut

        def balance(v: list[int]) -> float:
            mean = sum(v) / k
            return float(max(v) / mean) if mean else 1.0

        return {
            "parts": k, "method": self.method, "seed": self.seed, "spec": self.spec,
            "num_nodes": self.num_nodes, "num_edges": self.num_edges,
            "edge_cut": cut,
            "edge_cut_fraction": cut / self.num_edges if self.num_edges else 0.0,
            "vertices": verts, "edges": edges, "halo_rows": halos,
            "halo_rows_total": int(sum(halos)),
            "vertex_balance": balance(verts), "edge_balance": balance(edges),
            "replication": (self.num_nodes + sum(halos)) / max(self.num_nodes, 1),
        }

    def describe(self) -> str:
        f = self.figures()
        cut = f"{f['edge_cut']:,} ({f['edge_cut_fraction']:.1%})"
        lines = [f"partition book: {self.method}, {self.num_parts} parts of "
                 f"{self.num_nodes:,} vertices / {self.num_edges:,} edges; edge cut {cut}; "
                 f"balance vertices {f['vertex_balance']:.2f}, edges {f['edge_balance']:.2f}"]
        for r in range(self.num_parts):
            lines.append(f"  rank {r}: vertices {f['vertices'][r]:,}, in-edges "
                         f"{f['edges'][r]:,}, halo rows {f['halo_rows'][r]:,}")
        return "\n".join(lines)

    def _check_rank(self, rank: int) -> None:
        if not 0 <= int(rank) < self.num_parts:
            raise ValueError(f"rank must be in [0, {self.num_parts}); got {rank}.")


def graph_fingerprint(graph: Graph) -> str:
    """A structural hash of ``graph`` (vertex count, CSC offsets and sources, not weights)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{graph.num_nodes}:{graph.num_edges}".encode())
    for t in (graph.indptr, graph.indices):
        step = 1 << 22
        for i in range(0, t.numel(), step):  # int64 bytes, chunk by chunk: dtype-independent
            h.update(t[i:i + step].to(torch.int64).numpy().tobytes())
    return h.hexdigest()


def build_book(graph: Graph, k: int, method: str = "metis", seed: int = 0,
               spec: str | None = None) -> PartitionBook:
    """Partition ``graph`` for ``k`` ranks.

    Args:
        graph: the graph (its structure; weights are ignored).
        k: number of ranks (``>= 1``; more ranks than vertices leaves some empty).
        method: ``"metis"`` (few cut edges) or ``"range"`` (contiguous original ids).
        seed: METIS seed.
        spec: the dataset spec, recorded so that a book is never used for another dataset.
    """
    k = _check_k(k)
    if method not in BOOK_METHODS:
        raise ValueError(f"partition method must be one of {BOOK_METHODS}; got {method!r}.")
    n = graph.num_nodes
    if method == "range":
        reordering = Reordering.identity(n)
        bounds = edge_balanced_ranges(graph.indptr, k)
        g = graph
    else:
        parts = metis_parts(graph, k, seed=seed, balance="edges")
        reordering = Reordering.from_order(torch.argsort(parts, stable=True), "metis")
        bounds = torch.zeros(k + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(parts, minlength=k), 0, out=bounds[1:])
        g = permute_graph(graph, reordering)
    edge_bounds = g.indptr.to(torch.int64)[bounds]
    halos, cut = [], 0
    for r in range(k):
        lo, hi = int(bounds[r]), int(bounds[r + 1])
        src = g.indices[int(edge_bounds[r]): int(edge_bounds[r + 1])].to(torch.int64)
        remote = src[(src < lo) | (src >= hi)]
        cut += int(remote.numel())
        halos.append(torch.unique(remote))
    halo_ptr = torch.zeros(k + 1, dtype=torch.int64)
    torch.cumsum(torch.tensor([h.numel() for h in halos], dtype=torch.int64), 0,
                 out=halo_ptr[1:])
    return PartitionBook(k, n, graph.num_edges, method, int(seed), graph_fingerprint(graph), cut,
                         spec, reordering, bounds, edge_bounds, halo_ptr, torch.cat(halos))


def check_book(book: PartitionBook, graph: Graph, spec: str | None = None,
               where: str = "the partition book") -> None:
    """Refuse ``book`` unless it was built for ``graph`` (and dataset ``spec``) as it is now.

    Raises:
        BookError: the book belongs to another graph, or to an older version of this
            one (stale); the message says how to rebuild it.
    """
    fix = (f"rebuild it with `ngra partition --dataset {spec or 'SPEC'} --parts "
           f"{book.num_parts} --method {book.method} --out DIR`, or train without "
           "--partition to partition on the fly")
    ours = f"{book.spec or 'a graph'} ({book.num_nodes:,} vertices, {book.num_edges:,} edges)"
    theirs = f"{spec or 'this graph'} ({graph.num_nodes:,} vertices, {graph.num_edges:,} edges)"
    same_spec = spec is not None and book.spec == spec
    if spec is not None and book.spec is not None and book.spec != spec:
        raise BookError(f"{where} was built for {ours}, not for {theirs}; {fix}.")
    if not same_spec and (book.num_nodes, book.num_edges) != (graph.num_nodes, graph.num_edges):
        raise BookError(f"{where} was built for {ours}, not for {theirs}; {fix}.")
    if book.fingerprint != graph_fingerprint(graph):
        raise BookError(f"{where} is stale: it was built for an earlier version of {theirs} "
                        f"({book.num_nodes:,} vertices, {book.num_edges:,} edges, structure "
                        f"fingerprint {book.fingerprint[:12]}..., the graph's is "
                        f"{graph_fingerprint(graph)[:12]}...); {fix}.")


def save_book(book: PartitionBook, folder: str | os.PathLike[str]) -> Path:
    """Write ``book`` to ``folder`` (``book.pt`` and ``book.json``), each whole or not at
    all, its bytes reserved first (:func:`ngra.diskspace.atomic_output`: a full disk is a
    :class:`~ngra.errors.DiskFullError`, and a previous book's file is left as it was)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {"order": book.reordering.order, "bounds": book.bounds,
              "edge_bounds": book.edge_bounds, "halo_ptr": book.halo_ptr, "halo": book.halo}
    meta = {"version": BOOK_VERSION, "num_parts": book.num_parts, "num_nodes": book.num_nodes,
            "num_edges": book.num_edges, "method": book.method, "seed": book.seed,
            "fingerprint": book.fingerprint, "spec": book.spec, "figures": book.figures()}
    needed = sum(t.nbytes for t in arrays.values()) + (1 << 20)  # and the archive's headers
    with atomic_output(folder / "book.pt", "the partition book's arrays", needed) as fh:
        torch.save(arrays, fh)
    write_file(folder / "book.json", json.dumps(meta, indent=1) + "\n",
               "the partition book's figures")
    return folder


def load_book(folder: str | os.PathLike[str]) -> PartitionBook:
    """Read a book written by :func:`save_book`.

    Raises:
        FileNotFoundError: no book in ``folder``.
        BookError: a damaged or inconsistent book, or one of another format version.
    """
    folder = Path(folder)
    meta_path, arrays_path = folder / "book.json", folder / "book.pt"
    if not meta_path.is_file() or not arrays_path.is_file():
        raise FileNotFoundError(f"no partition book in {folder} (book.json and book.pt); make "
                                "one with `ngra partition --dataset SPEC --parts K --out DIR`.")
    fix = f"delete {folder} and run `ngra partition` again"
    try:
        meta = json.loads(meta_path.read_text())
        arrays = torch.load(arrays_path, weights_only=True)
    except Exception as exc:  # torch raises several types for a damaged zip
        raise BookError(f"partition book in {folder} is damaged ({type(exc).__name__}: "
                        f"{exc}); {fix}.") from None
    if not isinstance(meta, dict) or meta.get("version") != BOOK_VERSION:
        raise BookError(f"partition book in {folder} has format version "
                        f"{meta.get('version') if isinstance(meta, dict) else '?'}; this ngra "
                        f"reads version {BOOK_VERSION}; {fix}.")
    try:
        k, n = int(meta["num_parts"]), int(meta["num_nodes"])
        a = {name: arrays[name] for name in _ARRAYS}
        ok = (a["order"].shape == (n,) and a["bounds"].shape == (k + 1,)
              and a["edge_bounds"].shape == (k + 1,) and a["halo_ptr"].shape == (k + 1,)
              and int(a["halo_ptr"][-1]) == a["halo"].numel() and int(a["bounds"][-1]) == n)
        if not ok:
            raise ValueError("array shapes do not agree")
        book = PartitionBook(k, n, int(meta["num_edges"]), str(meta["method"]),
                             int(meta["seed"]), str(meta["fingerprint"]),
                             int(meta["figures"]["edge_cut"]), meta.get("spec"),
                             Reordering.from_order(a["order"], str(meta["method"])),
                             a["bounds"], a["edge_bounds"], a["halo_ptr"], a["halo"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BookError(f"partition book in {folder} is inconsistent ({exc}); {fix}.") from None
    return book


def book_for(graph: Graph, parts: int, *, spec: str, cache: str | os.PathLike[str],
             book_dir: str | os.PathLike[str] | None = None, method: str = "metis",
             asked: str | None = None) -> tuple[PartitionBook, Path]:
    """``(book, folder)`` of ``graph`` (dataset ``spec``) in ``parts`` parts, the book a
    run of several processes trains with (and the planner prices): the book in
    ``book_dir`` (``ngra partition --out``), checked against the graph, else the one cached
    in ``cache`` (its folder, from :func:`ngra.datasets.cache.book_folder`), built with
    ``method`` and :data:`BOOK_SEED` when missing, damaged or stale. ``asked`` says where
    ``parts`` came from, for the error when ``book_dir``'s part count differs.

    Raises:
        BookError: ``book_dir`` holds a book of another graph, or a stale one.
        ValueError: ``book_dir``'s book has another part count.
    """
    if book_dir:
        folder = Path(book_dir)
        book = load_book(folder)
        check_book(book, graph, spec, where=f"the partition book in {folder}")
        if book.num_parts != parts:
            raise ValueError(f"the partition book in {folder} has {book.num_parts} parts; "
                             f"{asked or '--nprocs is'} {parts}. Make one with `ngra partition "
                             f"--dataset {spec} --parts {parts}`.")
        return book, folder
    folder = Path(cache)
    try:
        book = load_book(folder)
        check_book(book, graph, spec)
        return book, folder
    except FileNotFoundError:
        pass
    except BookError as exc:
        log.info("rebuilding the cached partition book: %s", exc)
    book = build_book(graph, parts, method, BOOK_SEED, spec=spec)
    save_book(book, folder)
    log.info("partition book cached in %s:\n%s", folder, book.describe())
    return book, folder
