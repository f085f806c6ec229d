"""Choosing halo exchange or ring streaming for a layer, from the partition and the link.

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
  own cores, half when the ranks outnumber the cores two to one).

The cheaper prediction wins; ``--exchange halo|ring`` overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ngra.distributed.link import LinkModel

__all__ = ["ExchangeChoice", "PartitionStats", "STRATEGIES", "choose_exchange"]

STRATEGIES = ("auto", "halo", "ring")


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

    def describe(self) -> str:
        why = "forced (--exchange)" if self.forced else "cost model"
        return (f"{self.strategy} ({why}): predicted halo {self.halo_s * 1e3:.2f} ms vs ring "
                f"{self.ring_s * 1e3:.2f} ms a step; forward bytes of the busiest rank: halo "
                f"{self.halo_bytes:,}, ring {self.ring_bytes:,} (backward about the same for "
                f"halo, twice for ring)")

    def as_dict(self) -> dict:
        return {"strategy": self.strategy, "forced": self.forced, "row_bytes": self.row_bytes,
                "predicted_halo_s": self.halo_s, "predicted_ring_s": self.ring_s,
                "halo_bytes": self.halo_bytes, "ring_bytes": self.ring_bytes,
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


def choose_exchange(stats: PartitionStats, row_bytes: int, link: LinkModel | None,
                    strategy: str = "auto", attention: bool = False,
                    overlap: bool = False) -> ExchangeChoice:
    """The exchange of a layer reading ``row_bytes`` per source row (``attention``: an
    attention layer; ``overlap``: its halo exchange overlaps the inner edges; see the
    module docs)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"exchange must be one of {STRATEGIES}; got {strategy!r}.")
    k = stats.world_size
    halo_bytes = max(stats.sent) * row_bytes if k > 1 else 0
    ring_bytes = max(sum(stats.rows) - stats.rows[(r + 1) % k] for r in range(k)) * row_bytes \
        if k > 1 else 0
    if link is None or k < 2:
        halo_s = ring_s = 0.0
    else:
        halo_s, ring_s = predict(stats, row_bytes, link, attention, overlap)
    if strategy == "auto":
        pick = "ring" if ring_s < halo_s else "halo"
    else:
        pick = strategy
    return ExchangeChoice(pick, strategy != "auto", row_bytes, halo_s, ring_s, halo_bytes,
                          ring_bytes, bool(attention), bool(overlap))
