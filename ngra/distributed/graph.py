"""One rank's share of a partitioned graph: what its layers run on.

A :class:`DistGraph` holds the rank's ``D`` owned vertices and their in-edges as a
local :class:`ngra.Graph` over ``D + H`` rows: owned rows first, then the ``H`` halo
rows (remote sources its edges read), which have no in-edges of their own. It is a
:class:`~ngra.runtime.partitioned.Partitioned` graph, so the executor runs each layer's
``pre`` stage on the owned rows and hands the terms to :meth:`DistGraph.propagate`,
which, per layer (:mod:`ngra.distributed.cost`):

* **halo**, overlapped (the default, ``overlap=True``): starts the exchange of the terms
  the edge stage reads on the source side and computes the edges whose sources the rank
  owns while it travels (:mod:`ngra.distributed.overlap`; backward likewise);
* **halo**, blocking (``overlap=False``, or under a memory budget or a forced grid, or
  for an accumulator that is neither a tensor nor a dict of them): exchanges those terms
  (:func:`~ngra.distributed.halo.exchange_rows`: one ``all_to_all``), pads the others
  (read only at destinations, all owned) with zero halo rows, walks the local graph with
  the ordinary executor (the 1 x 1 grid, or under a memory budget the grid that fits it:
  the budget holds within the rank, halo rows included) and keeps the owned rows;
* **ring**: streams source chunks around the ranks (:mod:`ngra.distributed.ring`);
* **feature**: transposes the terms to a column slice of every vertex, aggregates it over
  the whole graph's structure (gathered from the ranks at the first such call, kept) and
  transposes back (:mod:`ngra.distributed.feature`), for a layer whose edge stage splits
  by columns (:func:`~ngra.distributed.feature.column_split`, cached per layer).

Each layer's exchange is recorded per training call (bytes sent, seconds blocked
waiting: :class:`~ngra.distributed.halo.ExchangeRecord`); :meth:`DistGraph.exchange_stats`
and :func:`exchange_table` put them in the run's summary.
"""

from __future__ import annotations

import logging
import statistics
import weakref
from collections.abc import Mapping
from typing import Any

import torch

from ngra.compiler.ir import format_key
from ngra.compiler.plan import Plan
from ngra.distributed.cost import ExchangeChoice, PartitionStats, choose_exchange
from ngra.distributed.feature import ColumnSplit, WholeGraph, column_split, feature_propagate
from ngra.distributed.halo import ExchangeRecord, HaloPlan, Traffic, exchange_rows
from ngra.distributed.link import LinkModel
from ngra.distributed.overlap import NotTensorAccumulator, SplitPlan, StaleHalo, \
    build_split, overlapped_propagate
from ngra.distributed.ring import RingPlan, build_ring, ring_propagate
from ngra.graph import EdgeFactors, Graph
from ngra.runtime.budget import current_budget, forced_grid
from ngra.runtime.partitioned import Partitioned
from ngra.runtime.staging import flatten, read_slots, unflatten
from ngra.runtime.executor import choose_runtime_grid
from ngra.runtime.stream import walk

__all__ = ["DistGraph", "exchange_table"]

#: Training calls a layer's exchange record keeps (the summary's medians read them).
RECORDS_KEPT = 1000

log = logging.getLogger(__name__)


class DistGraph(Partitioned):
    """A rank's owned vertices, their in-edges and how their halo arrives.

    Args:
        local: the local graph over ``D + H`` rows (owned, then halo; see module docs),
            its edges in the rank's local edge order (``perm`` the identity).
        num_own: ``D``.
        halo_ids: ``[H]`` new (partition-order) ids of the halo rows.
        bounds: ``[K + 1]`` every rank's destination range (new ids).
        halo: the rank's side of the halo exchange.
        stats: the partition's global statistics (for the cost model).
        rank, world_size, group: this rank, ``K`` and the exchange's process group.
        exchange: ``"auto"`` (the cost model), ``"halo"``, ``"ring"`` or ``"feature"``.
        link: the calibrated link model (``None``: no prediction; ``auto`` picks halo).
        traffic: where sent bytes are counted.
        edge_ids: ``[E]`` each local edge's id in the whole (prepared) graph's edge order
            (attention dropout's counters; default: the local ids, ``local.perm``).
        overlap: the halo exchange overlaps the inner edges' compute (module docs);
            ``False``: it blocks.
        halo_bits: ``8``: halo rows and their gradients travel quantized
            (:mod:`ngra.distributed.halo`); ``None``: exact.
        staleness: ``1``: an overlapped halo's training step reads the previous step's
            halo rows and gradients (:mod:`ngra.distributed.overlap`); ``0``: exact.
    """

    def __init__(self, local: Graph, num_own: int, halo_ids: torch.Tensor,
                 bounds: torch.Tensor, halo: HaloPlan, stats: PartitionStats, *, rank: int,
                 world_size: int, group: Any = None, exchange: str = "auto",
                 link: LinkModel | None = None, traffic: Traffic | None = None,
                 edge_ids: torch.Tensor | None = None, overlap: bool = True,
                 halo_bits: int | None = None, staleness: int = 0) -> None:
        self.local = local
        self.edge_ids = local.perm if edge_ids is None else edge_ids
        self.num_nodes = int(num_own)
        self.num_halo = int(halo_ids.numel())
        self.halo_ids, self.bounds = halo_ids, bounds
        self.rank, self.world_size, self.group = rank, world_size, group
        self.exchange, self.link, self.stats = exchange, link, stats
        self.traffic = traffic if traffic is not None else Traffic()
        halo.traffic = self.traffic
        halo.group = group
        halo.bits = halo_bits
        self.halo = halo
        self._ring: RingPlan | None = None
        self.overlap = bool(overlap)
        self.staleness = int(staleness)
        self._stale: dict[tuple[int, int], StaleHalo] = {}
        self._restored: list[dict[str, Any]] = []  # a checkpoint's stale halos, to take up
        self._split: SplitPlan | None = None
        self._blocking: set[int] = set()  # layers whose accumulator cannot overlap
        self._records: dict[tuple[int, int], list[ExchangeRecord]] = {}
        self._how: dict[tuple[int, int], str] = {}  # each layer's last exchange as run
        self._weights: torch.Tensor | None = None  # factored weights per edge, for the ring
        self._choices: dict[tuple[int, int], tuple[Any, ExchangeChoice]] = {}
        self._splits: dict[tuple[int, int], ColumnSplit | str] = {}
        self._whole: WholeGraph | None = None
        self._order: list[tuple[int, int]] = []  # first-call order of (layer, width)

    # ------------------------------------------------------------ Graph-like
    @property
    def num_edges(self) -> int:
        return self.local.num_edges

    @property
    def perm(self) -> torch.Tensor:
        return self.local.perm

    def to_csc_order(self, edge_data: torch.Tensor) -> torch.Tensor:
        """Edge data of the local edges (a shard stores it in local CSC order already)."""
        return self.local.to_csc_order(edge_data)

    @property
    def edge_weight(self) -> torch.Tensor | None:
        return self.local.edge_weight

    @property
    def edge_factors(self) -> Any:
        """The local graph's factored weights (shards store GCN's as per-edge weights)."""
        return self.local.edge_factors

    def in_degrees(self) -> torch.Tensor:
        return self.local.in_degrees()[: self.num_nodes]

    def to(self, device: torch.device | str) -> DistGraph:
        """This share with its arrays on ``device`` (NCCL: one GPU a rank)."""
        device = torch.device(device)
        if self.local.indptr.device == device:
            return self
        g = DistGraph(self.local.to(device), self.num_nodes, self.halo_ids, self.bounds,
                      self.halo.to(device), self.stats, rank=self.rank,
                      world_size=self.world_size, group=self.group, exchange=self.exchange,
                      link=self.link, traffic=self.traffic,
                      edge_ids=self.edge_ids.to(device), overlap=self.overlap,
                      halo_bits=self.halo.bits, staleness=self.staleness)
        return g

    def __repr__(self) -> str:
        return (f"DistGraph(rank {self.rank} of {self.world_size}: {self.num_nodes} owned + "
                f"{self.num_halo} halo vertices, {self.num_edges} in-edges)")

    # ------------------------------------------------------------ exchange choice
    @property
    def ring(self) -> RingPlan:
        if self._ring is None:
            ip = self.local.indptr[: self.num_nodes + 1]
            device = self.local.indptr.device
            self._ring = build_ring(self.rank, self.world_size, self.num_nodes, ip.cpu(),
                                    self.local.indices.cpu(), self.halo_ids, self.bounds,
                                    self.group, self.traffic).to(device)
        return self._ring

    @property
    def split(self) -> SplitPlan:
        """The inner and boundary tiles of the overlapped halo (built once)."""
        if self._split is None:
            ip = self.local.indptr[: self.num_nodes + 1]
            self._split = build_split(self.num_nodes, self.num_halo, ip.cpu(),
                                      self.local.indices.cpu()).to(self.local.indptr.device)
        return self._split

    @property
    def whole(self) -> WholeGraph:
        """The whole graph's structure, gathered from every rank once (collective: every
        rank's first feature layer call builds it; :mod:`ngra.distributed.feature`)."""
        if self._whole is None:
            self._whole = WholeGraph(self.local, self.num_nodes, self.halo_ids, self.bounds,
                                     self.rank, list(self.stats.rows),
                                     [sum(e) for e in self.stats.edges], self.group,
                                     self.edge_ids)
        return self._whole

    def column_split(self, plan: Plan, terms: Any) -> ColumnSplit | str:
        """How ``plan``'s layer splits by columns over the ranks, or why not (cached)."""
        key = (id(plan.layer), _row_bytes(plan, terms))
        hit = self._splits.get(key)
        if hit is None:
            hit = self._splits[key] = column_split(plan, terms, self.world_size)
        return hit

    def choice(self, plan: Plan, terms: Any) -> ExchangeChoice:
        """The exchange of ``plan``'s layer for terms like ``terms`` (cached per layer)."""
        layer = plan.layer
        key = (id(layer), _row_bytes(plan, terms))
        hit = self._choices.get(key)
        if hit is None or hit[0]() is not layer:
            attention = plan.runs_attention_aggregate()
            self._splits.pop(key, None)  # a dead layer's, whose id this one took
            split = self.column_split(plan, terms)
            try:
                choice = choose_exchange(self.stats, key[1], self.link, self.exchange,
                                         attention, self._overlaps(),
                                         True if isinstance(split, ColumnSplit) else split,
                                         current_budget())
            except ValueError as err:  # a forced feature that cannot run: name the layer
                raise ValueError(f"{type(layer).__name__}: {err}") from None
            self._choices[key] = (weakref.ref(layer), choice)
            self._records.pop(key, None)  # a dead layer's, whose id this one took
            self._how.pop(key, None)
            old = self._stale.pop(key, None)
            if old is not None:
                old.settle()
            if key not in self._order:
                self._order.append(key)
            log.info("%s: exchange %s", type(layer).__name__, choice.describe())
            return choice
        return hit[1]

    def choices(self) -> list[dict[str, Any]]:
        """Each layer's choice, in first-call order (for the JSON summary)."""
        out = []
        for key in self._order:
            ref, choice = self._choices[key]
            layer = ref()
            out.append({"layer": type(layer).__name__ if layer is not None else "?",
                        **choice.as_dict()})
        return out

    def exchange_stats(self) -> list[dict[str, Any]]:
        """This rank's exchange of each layer over its training calls, in first-call
        order: how it ran (``halo``, ``halo (blocking)``, ``ring``, ``feature``), the calls
        recorded,
        the last call's bytes sent forward and backward, and the median seconds blocked
        waiting per call (forward, backward, both)."""
        self.settle()
        out = []
        for key in self._order:
            ref, _ = self._choices[key]
            layer = ref()
            recs = self._records.get(key, [])
            if layer is None and not recs:
                continue
            last = recs[-1] if recs else ExchangeRecord()

            def med(f: Any) -> float | None:
                return statistics.median(f(r) for r in recs) if recs else None

            out.append({"layer": type(layer).__name__ if layer is not None else "?",
                        "how": self._how.get(key), "calls": len(recs),
                        "forward_bytes": last.forward_bytes,
                        "backward_bytes": last.backward_bytes,
                        "forward_wait_s": med(lambda r: r.forward_wait_s),
                        "backward_wait_s": med(lambda r: r.backward_wait_s),
                        "wait_s": med(lambda r: r.wait_s)})
        return out

    def layers(self) -> list[tuple[Any, int]]:
        """The live layers that exchanged, in first-call order, each with the bytes of a
        propagated source row (for :func:`ngra.distributed.memory.partition_bytes`)."""
        out = []
        for key in self._order:
            layer = self._choices[key][0]()
            if layer is not None:
                out.append((layer, key[1]))
        return out

    def settle(self) -> None:
        """Wait for the stale halos' exchanges still in flight (see ``staleness``)."""
        for stale in self._stale.values():
            stale.settle()

    def stale_state(self) -> list[dict[str, Any]]:
        """The stale halos of this rank's live layers, in first-call order, for a
        checkpoint: each layer's name, source row bytes and the last training step's
        halo rows and returned halo gradients (lists of tensors, ``None`` where none
        came). Settles what is in flight first."""
        self.settle()
        out = []
        for key in self._order:
            stale, hit = self._stale.get(key), self._choices.get(key)
            layer = hit[0]() if hit is not None else None
            if stale is None or layer is None:
                continue
            out.append({"layer": type(layer).__name__, "row_bytes": key[1],
                        **{w: None if getattr(stale, w) is None else
                           [t.detach().cpu() for t in getattr(stale, w).wait()]
                           for w in ("rows", "grads")}})
        return out

    def restore_stale(self, states: list[dict[str, Any]]) -> None:
        """Take up a checkpoint's :meth:`stale_state` of this rank: the first training
        call of each layer (in first-call order) reads them as the previous step's, when
        the layer's name and row bytes match (else that layer and those after it start
        exact)."""
        self._restored = list(states)

    def _stale_of(self, plan: Plan, key: tuple[int, int]) -> StaleHalo:
        """The layer's :class:`StaleHalo`: made at its first call, from the next restored
        state when that is this layer's (:meth:`restore_stale`)."""
        stale = self._stale.get(key)
        if stale is None:
            stale = self._stale[key] = StaleHalo()
            if self._restored:
                st = self._restored.pop(0)
                if (st["layer"], st["row_bytes"]) == (type(plan.layer).__name__, key[1]):
                    device = self.local.indptr.device
                    stale.restore(*[None if st[w] is None else [t.to(device) for t in st[w]]
                                    for w in ("rows", "grads")])
                else:
                    log.warning("the checkpoint's stale halos are of %s (%d bytes a row), "
                                "not of %s (%d): the first step reads exact halos",
                                st["layer"], st["row_bytes"], type(plan.layer).__name__,
                                key[1])
                    self._restored = []
        return stale

    def _record(self, key: tuple[int, int]) -> ExchangeRecord | None:
        """A new record of a training call (``None`` outside autograd: evaluation)."""
        if not torch.is_grad_enabled():
            return None
        recs = self._records.setdefault(key, [])
        recs.append(ExchangeRecord())
        del recs[:-RECORDS_KEPT]
        return recs[-1]

    # ------------------------------------------------------------ propagation
    def propagate(self, plan: Plan, terms: Any, edata: Any, drop: Any = None) -> Any:
        choice = self.choice(plan, terms)
        key = (id(plan.layer), choice.row_bytes)
        if choice.strategy == "ring":
            self._how[key] = "ring"
            return ring_propagate(self.ring, plan, terms, self._per_edge(edata),
                                  self.in_degrees(), drop, record=self._record(key))
        if choice.strategy == "feature":
            self._how[key] = "feature"
            split = self.column_split(plan, terms)
            assert isinstance(split, ColumnSplit)  # choose_exchange refused it otherwise
            return feature_propagate(self.whole, split, plan, terms, edata, drop,
                                     rank=self.rank, rows=list(self.stats.rows),
                                     group=self.group, traffic=self.traffic,
                                     record=self._record(key))
        if self._overlaps() and id(plan.layer) not in self._blocking:
            rng = torch.get_rng_state()
            record = self._record(key)
            try:
                factors = isinstance(edata, EdgeFactors) and not (
                    edata.src.requires_grad or edata.dst.requires_grad)
                stale = self._stale_of(plan, key) if self.staleness else None
                out = overlapped_propagate(self.halo, self.split, plan, terms,
                                           edata if factors else self._per_edge(edata),
                                           self.in_degrees(), drop, record, stale)
                self._how[key] = "halo" + self._bits_note() + (
                    f", stale {self.staleness}" if self.staleness else "")
                return out
            except NotTensorAccumulator as err:  # every rank raises here alike
                log.info("%s: its accumulator is a %s, not a tensor or a dict of them: the "
                         "halo exchange blocks", type(plan.layer).__name__, err)
                self._blocking.add(id(plan.layer))
                if record is not None:
                    self._records[key].pop()
                torch.set_rng_state(rng)
        self._how[key] = "halo (blocking)" + self._bits_note()
        return self._halo_propagate(plan, terms, edata, drop, self._record(key))

    def _overlaps(self) -> bool:
        """Whether the halo overlaps now (not under a memory budget or a forced grid)."""
        return self.overlap and current_budget() is None and forced_grid(self.local) is None

    def _bits_note(self) -> str:
        return f", {self.halo.bits}-bit" if self.halo.bits else ""

    def _per_edge(self, edata: Any) -> Any:
        """Edge data a tile takes by position: factored weights as ``[E]`` products."""
        if isinstance(edata, EdgeFactors):
            if self._weights is None:
                self._weights = self.local.edge_weight  # once: [E] products
            return self._weights
        return edata

    def _halo_propagate(self, plan: Plan, terms: Any, edata: Any, drop: Any,
                        record: ExchangeRecord | None = None) -> Any:
        leaves, spec = flatten(terms)
        src, dst = read_slots(plan, spec, len(leaves))
        order = sorted(src)
        full = list(leaves)
        for i, t in zip(order, exchange_rows(self.halo, [leaves[i] for i in order],
                                             record=record)):
            full[i] = t
        for i in range(len(full)):
            if i in src:
                continue
            t = full[i]
            if i in dst:  # read at destinations only: every destination is owned
                full[i] = torch.cat([t, t.new_zeros((self.num_halo,) + tuple(t.shape[1:]))])
            else:  # not read by the edge stage (the layer's input, for post): no copy
                full[i] = t.new_zeros(()).expand((t.shape[0] + self.num_halo,) + t.shape[1:])
        local_terms = unflatten(spec, full)
        grid, walk_csc = choose_runtime_grid(plan, self.local, local_terms, edata)
        return _owned(walk(plan, self.local, grid, local_terms, edata, drop, walk_csc),
                      self.num_nodes)

    def explain_lines(self, plan: Plan, terms: Any) -> list[str]:
        choice = self.choice(plan, terms)
        leaves, spec = flatten(terms)
        src, _ = read_slots(plan, spec, len(leaves))
        keys = spec if isinstance(spec, tuple) else ("x",)
        moved = ", ".join(f"{format_key(keys[i])} {list(leaves[i].shape[1:])} "
                          f"{str(leaves[i].dtype).replace('torch.', '')}" for i in sorted(src))
        k, r = self.world_size, self.rank
        if choice.strategy == "halo":
            inner = self.split.inner.num_edges if self.overlap else 0
            how = (f"halo: one all_to_all after pre, rank {r} receives {self.num_halo:,} rows "
                   f"({self.num_halo * choice.row_bytes:,} bytes) and sends "
                   f"{self.halo.num_send:,} ({self.halo.num_send * choice.row_bytes:,} bytes); "
                   "backward the same in reverse; " +
                   (f"rows quantized to {self.halo.bits} bits with a per-row scale (for float32 "
                    "rows about a quarter of these bytes); "
                    if self.halo.bits else "") +
                   (f"overlapped: the {inner:,} inner edges (of {self.num_edges:,}) compute "
                    "while it travels, in both directions" if self.overlap else "blocking") +
                   ("; a training step reads the previous step's halo rows and gradients "
                    "(stale by one step)" if self.overlap and self.staleness else ""))
        elif choice.strategy == "feature":
            split = self.column_split(plan, terms)
            how = (f"feature: one all_to_all to {split.describe(k)} for all "
                   f"{self.stats.num_nodes:,} vertices, the whole graph's "
                   f"{self.stats.num_edges:,} edges aggregated on every rank "
                   f"({choice.structure_bytes:,} bytes of structure a rank), one all_to_all "
                   "back to the owned rows; backward the same in reverse")
        else:
            how = (f"ring: {k} steps, each tile's compute overlapping the next source chunk's "
                   f"transfer; rank {r} sends {choice.ring_bytes:,} bytes at most forward")
        split = self.column_split(plan, terms)
        cols = (f"  columns: {split.describe(k)}: the layer splits by "
                f"{split.unit}" if isinstance(split, ColumnSplit) else
                f"  columns: the layer does not split by columns: {split}")
        return [f"exchange (rank {r} of {k}, between pre and edge) of {moved or 'nothing'}: "
                f"{how}", f"  choice: {choice.describe()}", cols]


def _row_bytes(plan: Plan, terms: Any) -> int:
    leaves, spec = flatten(terms)
    src, _ = read_slots(plan, spec, len(leaves))
    return int(sum(_width(leaves[i]) * leaves[i].element_size() for i in src))


def _width(t: torch.Tensor) -> int:
    n = 1
    for s in t.shape[1:]:
        n *= s
    return n


def _owned(acc: Any, d: int) -> Any:
    if isinstance(acc, Mapping):
        return {k: v[:d] for k, v in acc.items()}
    if isinstance(acc, tuple):
        return tuple(_owned(a, d) for a in acc)
    return acc[:d]


def exchange_table(per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every rank's :meth:`DistGraph.exchange_stats` as one entry per layer with a list
    per figure, rank by rank (the run summary's ``exchange_per_layer``)."""
    if not per_rank or not per_rank[0]:
        return []
    out = []
    for n, first in enumerate(per_rank[0]):
        row: dict[str, Any] = {"layer": first["layer"], "how": first["how"],
                               "calls": first["calls"]}
        for f in ("forward_bytes", "backward_bytes", "forward_wait_s", "backward_wait_s",
                  "wait_s"):
            row[f"{f}_per_rank"] = [r[n][f] if n < len(r) else None for r in per_rank]
        out.append(row)
    return out
