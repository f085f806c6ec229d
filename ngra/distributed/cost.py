"""Choosing halo exchange, ring streaming or feature columns for a layer, from the
partition and the link.

Every rank decides from the same figures, so every rank makes the same choice without
talking: the partition's global statistics (:class:`PartitionStats`, from the book: rows
each rank owns, sends and receives in a halo exchange, and the in-edges of each rank's
tile from each owner) and the calibrated :class:`~ngra.distributed.link.LinkModel`.

For a layer whose edge stage reads ``b`` bytes a source row (the plan's terms after
hoisting, not the raw input), with ``t(e) = e * b / gather_bytes`` the time to read ``e``
edges' source rows (the sparse stages' bound) and ``v(n) = n * b / stream_bytes`` the time
of element-wise work over ``n`` rows (packing, padding, outputs, partial sums), both times
``shared`` (every rank computes at once):

* halo: ``2 * max_r all_to_all(max(sent_r, received_r) * b)`` (forward and the reverse
  in backward; not overlapped) ``+ max_r [(3 + a) t(E_r) + v(4 S_r + 6 D_r + 6 H_r)]``:
  forward and backward compute over the rank's ``E_r`` in-edges, and the rows it touches
  besides: the ``S_r`` rows it sends packed (and their gradients added back), its
  ``D_r + H_r`` local rows padded into one array, aggregated and differentiated. ``a`` is
  1 for an attention layer (a softmax gather whose scores are rowdots of its own value,
  GAT): the halo's one tile over the local graph runs
  :func:`~ngra.kernels.attention_aggregate`, whose backward walks the edges once more
  (its pass over destinations gathers every edge's value row again), where the ring's
  tiles run ``softmax_aggregate``'s edge-buffer backward (an ``H``-element buffer entry
  an edge instead); else 0;
* overlapped halo (``overlap``, the default halo, :mod:`ngra.distributed.overlap`): each
  direction's ``all_to_all`` travels while the rank computes its inner edges (``E_rr``,
  sources it owns): forward ``o(t(E_rr), a2a) + t(E_r - E_rr)``, backward
  ``o(2 t(E_rr), a2a) + 2 t(E_r - E_rr)``, the row work as above; ``a`` is 0 (its two
  tiles run ``softmax_aggregate`` like the ring's), ``o`` as for the ring below;
* ring: the ``K`` steps of the ring, each as slow as its slowest rank, each rank's step
  ``o(t(E_rj) + v(4 D_r + R_j), p2p(R_j * b))`` in forward (each step writes a
  ``D_r``-row partial and merges it, and receives the ``R_j`` rows of chunk ``j``) and
  ``o(2 t(E_rj) + v(D_r + 6 R_j), 2 p2p(R_j * b))`` in backward (chunk and gradient both
  travel; the chunk's gradient is computed, added to what arrived and passed on), where
  ``o(w, m) = max(w, m) + (1 - 1 / shared) min(w, m)``: a transfer hides behind the
  compute only as far as a core is free to move it (all of it when each rank has its
  own cores, half when the ranks outnumber the cores two to one);
* feature (:mod:`ngra.distributed.feature`, only for a layer whose edge stage splits by
  columns): ``4 max_r all_to_all(max(D_r (K - 1) / K, (N - D_r) / K) * b)`` (the
  transpose to columns and back, forward and backward; not overlapped)
  ``+ 3 t(E) / K + max_r v(4 D_r + 10 N / K)``: every rank walks all ``E`` edges for
  ``1 / K`` of the columns, packs its ``D_r`` rows in each transpose and unpacks,
  aggregates and differentiates ``N``-row arrays ``1 / K`` as wide. Each rank keeps the
  whole graph's structure, :func:`structure_bytes` ``(N, E)``: under a memory budget it
  must fit in it, else feature is not a candidate (forced: an error).

The cheapest prediction wins; ``--exchange halo|ring|feature`` overrides it (feature
only where the layer splits by columns and the structure fits the budget: a clear error
otherwise, on every rank alike).
"""

from __future__ import annotations

from dataclasses import dataclass

from ngra.distributed.link import LinkModel

__all__ = ["ExchangeChoice", "PartitionStats", "STRATEGIES", "check_structure_fits",
           "choose_exchange", "structure_bytes"]

STRATEGIES = ("auto", "halo", "ring", "feature")


def structure_bytes(num_nodes: int, num_edges: int) -> int:
    """Bytes a rank keeps for the whole graph's structure under the feature layout: the CSC
    (``8 (N + 1) + 4 E``), the transpose backward walks (``8 (N + 1) + 8 E``: offsets,
    destinations and positions) and a per-edge weight (``4 E``)."""
    return 16 * (int(num_nodes) + 1) + 16 * int(num_edges)


def structure_misfit(num_nodes: int, num_edges: int, budget: int | None) -> str:
    """Why the whole structure does not fit a rank's memory ``budget`` ("" if it does)."""
    need = structure_bytes(num_nodes, num_edges)
    if budget is None or need <= budget:
        return ""
    return (f"the whole graph's structure ({need:,} bytes a rank for {num_nodes:,} vertices "
            f"and {num_edges:,} edges) does not fit the memory budget of {budget:,} bytes")


def check_structure_fits(num_nodes: int, num_edges: int, budget: int | None) -> None:
    """Refuse ``--exchange feature`` when the whole structure does not fit ``budget``
    (before training: a :class:`ValueError` with the figures)."""
    why = structure_misfit(num_nodes, num_edges, budget)
    if why:
        raise ValueError(f"--exchange feature keeps the whole graph on every rank, and {why}. "
                         "Use --exchange auto, halo or ring, or a larger --memory-budget.")


@dataclass(frozen=True)
class PartitionStats:
    """What every rank knows of the whole partition (``K`` ranks).

    Attributes:
        rows: ``[K]`` owned rows (chunk size) per rank.
        sent, received: ``[K]`` rows each rank sends / receives in a halo exchange.
        edges: ``[K, K]`` in-edges of rank ``r`` whose source rank ``j`` owns.
    """

    rows: tuple[int, ...]
    sent: tuple[int, ...]
    received: tuple[int, ...]
    edges: tuple[tuple[int, ...], ...]

    @property
    def world_size(self) -> int:
        return len(self.rows)

    @property
    def num_nodes(self) -> int:
        return int(sum(self.rows))

    @property
    def num_edges(self) -> int:
        return int(sum(sum(r) for r in self.edges))

    @classmethod
    def from_dict(cls, d: dict) -> PartitionStats:
        """From the lists a shard folder's ``meta.json`` (and a run's summary,
        ``partition_stats``) hold: ``rows``, ``sent``, ``received``, ``edges``."""
        return cls(tuple(d["rows"]), tuple(d["sent"]), tuple(d["received"]),
                   tuple(tuple(r) for r in d["edges"]))


@dataclass(frozen=True)
class ExchangeChoice:
    """The strategy of one layer and the prediction behind it."""

    strategy: str
    forced: bool
    row_bytes: int
    halo_s: float
    ring_s: float
    halo_bytes: int  # sent by the busiest rank in forward
    ring_bytes: int
    attention: bool = False  # the halo's tile runs attention_aggregate (module docs)
    overlap: bool = False  # the halo's exchange overlaps the inner edges (module docs)
    feature_s: float | None = None  # None: not a candidate (feature_why says why)
    feature_bytes: int = 0
    feature_why: str = ""
    structure_bytes: int = 0

    def describe(self) -> str:
        why = "forced (--exchange)" if self.forced else "cost model"
        feature = (f" vs feature {self.feature_s * 1e3:.2f} ms" if self.feature_s is not None
                   else "")
        fbytes = f", feature {self.feature_bytes:,}" if self.feature_s is not None else ""
        out = (f"{self.strategy} ({why}): predicted halo {self.halo_s * 1e3:.2f} ms vs ring "
               f"{self.ring_s * 1e3:.2f} ms{feature} a step; forward bytes of the busiest "
               f"rank: halo {self.halo_bytes:,}, ring {self.ring_bytes:,}{fbytes} (backward "
               f"about the same for halo and feature, twice for ring)")
        if self.feature_why:
            out += f"; feature: not a candidate, {self.feature_why}"
        return out

    def as_dict(self) -> dict:
        return {"strategy": self.strategy, "forced": self.forced, "row_bytes": self.row_bytes,
                "predicted_halo_s": self.halo_s, "predicted_ring_s": self.ring_s,
                "predicted_feature_s": self.feature_s,
                "halo_bytes": self.halo_bytes, "ring_bytes": self.ring_bytes,
                "feature_bytes": self.feature_bytes, "feature_why": self.feature_why,
                "structure_bytes": self.structure_bytes,
                "attention": self.attention, "overlap": self.overlap}


def predict(stats: PartitionStats, row_bytes: int, link: LinkModel,
            attention: bool = False, overlap: bool = False) -> tuple[float, float]:
    """``(halo_s, ring_s)``: predicted seconds of one layer's forward and backward
    (``attention``: the layer's halo tile runs ``attention_aggregate``; ``overlap``: the
    halo's exchange overlaps the inner edges; module docs)."""
    k = stats.world_size
    per_edge = row_bytes / link.gather_bytes * link.shared  # every rank gathers at once

    def compute(e: int) -> float:
        return e * per_edge

    def rows(n: float) -> float:
        return link.stream_time(n * row_bytes) * link.shared

    def overlap_(work: float, transfer: float) -> float:
        # the transfer hides behind the work as far as a core is free to move it
        return max(work, transfer) + (1 - 1 / max(link.shared, 1.0)) * min(work, transfer)

    halo_comm = max(link.all_to_all(max(s, r) * row_bytes)
                    for s, r in zip(stats.sent, stats.received))
    if overlap:
        halo = max(
            overlap_(compute(edges[r]), halo_comm) + compute(sum(edges) - edges[r])
            + overlap_(2 * compute(edges[r]), halo_comm) + 2 * compute(sum(edges) - edges[r])
            + rows(4 * s + 6 * d + 6 * h)
            for r, (edges, s, d, h) in enumerate(zip(stats.edges, stats.sent, stats.rows,
                                                     stats.received)))
    else:
        halo = 2 * halo_comm + max(
            (3 + attention) * compute(sum(edges)) + rows(4 * s + 6 * d + 6 * h)
            for edges, s, d, h in zip(stats.edges, stats.sent, stats.rows, stats.received))
    ring = 0.0
    for s in range(k):
        fwd = bwd = 0.0
        for r in range(k):
            j = (r - s) % k
            c, m = compute(stats.edges[r][j]), link.p2p(stats.rows[j] * row_bytes)
            d, n = stats.rows[r], stats.rows[j]
            fwd = max(fwd, overlap_(c + rows(4 * d + n), m))
            bwd = max(bwd, overlap_(2 * c + rows(d + 6 * n), 2 * m))
        ring += fwd + bwd
    return halo, ring


def predict_feature(stats: PartitionStats, row_bytes: int, link: LinkModel) -> float:
    """Predicted seconds of one layer's forward and backward in the feature layout
    (module docs)."""
    k, n = stats.world_size, stats.num_nodes
    per_edge = row_bytes / link.gather_bytes * link.shared
    comm = max(link.all_to_all(max(d * (k - 1) / k, (n - d) / k) * row_bytes)
               for d in stats.rows)
    work = max(link.stream_time((4 * d + 10 * n / k) * row_bytes) * link.shared
               for d in stats.rows)
    return 4 * comm + 3 * stats.num_edges * per_edge / k + work


def feature_bytes(stats: PartitionStats, row_bytes: int) -> int:
    """Bytes the busiest rank sends in a feature layer's forward: the other ranks'
    columns of its rows, there and back (``2 D_r (K - 1) / K`` rows)."""
    k = stats.world_size
    return int(round(max(2 * d * (k - 1) / k for d in stats.rows) * row_bytes)) if k > 1 else 0


def choose_exchange(stats: PartitionStats, row_bytes: int, link: LinkModel | None,
                    strategy: str = "auto", attention: bool = False,
                    overlap: bool = False, feature: bool | str = False,
                    budget: int | None = None) -> ExchangeChoice:
    """The exchange of a layer reading ``row_bytes`` per source row (``attention``: an
    attention layer; ``overlap``: its halo exchange overlaps the inner edges; ``feature``:
    ``True`` where the layer's edge stage splits by columns, else why not (a sentence;
    ``False``: not asked); ``budget``: a rank's memory budget in bytes, which the whole
    structure must fit for feature; see the module docs). A forced feature that cannot
    run is a :class:`ValueError` saying why."""
    if strategy not in STRATEGIES:
        raise ValueError(f"exchange must be one of {STRATEGIES}; got {strategy!r}.")
    k = stats.world_size
    halo_bytes = max(stats.sent) * row_bytes if k > 1 else 0
    ring_bytes = max(sum(stats.rows) - stats.rows[(r + 1) % k] for r in range(k)) * row_bytes \
        if k > 1 else 0
    structure = structure_bytes(stats.num_nodes, stats.num_edges)
    why = "" if feature is True else (feature or "not asked of this layer")
    if not why:
        why = structure_misfit(stats.num_nodes, stats.num_edges, budget)
    if strategy == "feature" and why:
        raise ValueError(f"--exchange feature cannot run this layer: {why}. Use --exchange "
                         "auto, halo or ring.")
    if link is None or k < 2:
        halo_s = ring_s = 0.0
        feature_s = None if why else 0.0
    else:
        halo_s, ring_s = predict(stats, row_bytes, link, attention, overlap)
        feature_s = None if why else predict_feature(stats, row_bytes, link)
    if strategy == "auto":
        pick = "ring" if ring_s < halo_s else "halo"
        if feature_s is not None and link is not None and k > 1 \
                and feature_s < min(halo_s, ring_s):
            pick = "feature"
    else:
        pick = strategy
    return ExchangeChoice(pick, strategy != "auto", row_bytes, halo_s, ring_s, halo_bytes,
                          ring_bytes, bool(attention), bool(overlap), feature_s,
                          feature_bytes(stats, row_bytes) if not why else 0,
                          why if feature is not False else "", structure)
