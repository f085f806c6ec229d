"""One rank's share of a partitioned graph: what its layers run on.

A :class:`DistGraph` holds the rank's ``D`` owned vertices and their in-edges as a
local :class:`ngra.Graph` over ``D + H`` rows: owned rows first, then the ``H`` halo
rows (remote sources its edges read), which have no in-edges of their own. It is a
:class:`~ngra.runtime.partitioned.Partitioned` graph, so the executor runs each layer's
``pre`` stage on the owned rows and hands the terms to :meth:`DistGraph.propagate`,
which, per layer (:mod:`ngra.distributed.cost`):

* **halo**: exchanges the terms the edge stage reads on the source side
  (:func:`~ngra.distributed.halo.exchange_rows`: one ``all_to_all``), pads the others
  (read only at destinations, all owned) with zero halo rows, walks the local graph with
  the ordinary executor (the 1 x 1 grid, or under a memory budget the grid that fits it:
  the budget holds within the rank, halo rows included) and keeps the owned rows;
* **ring**: streams source chunks around the ranks (:mod:`ngra.distributed.ring`).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import Any

import torch

from ngra.compiler.ir import format_key
from ngra.compiler.plan import Plan
from ngra.distributed.cost import ExchangeChoice, PartitionStats, choose_exchange
from ngra.distributed.halo import HaloPlan, Traffic, exchange_rows
from ngra.distributed.link import LinkModel
from ngra.distributed.ring import RingPlan, build_ring, ring_propagate
from ngra.graph import EdgeFactors, Graph
from ngra.runtime.partitioned import Partitioned
from ngra.runtime.staging import flatten, read_slots, unflatten
from ngra.runtime.executor import choose_runtime_grid
from ngra.runtime.stream import walk

__all__ = ["DistGraph"]

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
        exchange: ``"auto"`` (the cost model), ``"halo"`` or ``"ring"``.
        link: the calibrated link model (``None``: no prediction; ``auto`` picks halo).
        traffic: where sent bytes are counted.
        edge_ids: ``[E]`` each local edge's id in the whole (prepared) graph's edge order
            (attention dropout's counters; default: the local ids, ``local.perm``).
    """

    def __init__(self, local: Graph, num_own: int, halo_ids: torch.Tensor,
                 bounds: torch.Tensor, halo: HaloPlan, stats: PartitionStats, *, rank: int,
                 world_size: int, group: Any = None, exchange: str = "auto",
                 link: LinkModel | None = None, traffic: Traffic | None = None,
                 edge_ids: torch.Tensor | None = None) -> None:
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
        self.halo = halo
        self._ring: RingPlan | None = None
        self._weights: torch.Tensor | None = None  # factored weights per edge, for the ring
        self._choices: dict[tuple[int, int], tuple[Any, ExchangeChoice]] = {}
        self._order: list[tuple[int, int]] = []  # first-call order of (layer, width)

    # ------------------------------------------------------------ Graph-like
    @property
    def num_edges(self) -> int:
        return self.local.num_edges

    @property
    def perm(self) -> torch.Tensor:
        return self.local.perm

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
                      edge_ids=self.edge_ids.to(device))
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

    def choice(self, plan: Plan, terms: Any) -> ExchangeChoice:
        """The exchange of ``plan``'s layer for terms like ``terms`` (cached per layer)."""
        layer = plan.layer
        key = (id(layer), _row_bytes(plan, terms))
        hit = self._choices.get(key)
        if hit is None or hit[0]() is not layer:
            attention = plan.runs_attention_aggregate()
            choice = choose_exchange(self.stats, key[1], self.link, self.exchange, attention)
            self._choices[key] = (weakref.ref(layer), choice)
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

    # ------------------------------------------------------------ propagation
    def propagate(self, plan: Plan, terms: Any, edata: Any, drop: Any = None) -> Any:
        choice = self.choice(plan, terms)
        if choice.strategy == "ring":
            if isinstance(edata, EdgeFactors):  # the ring's tiles take edge data by position
                if self._weights is None:
                    self._weights = self.local.edge_weight  # once: [E] products
                edata = self._weights
            return ring_propagate(self.ring, plan, terms, edata, self.in_degrees(), drop)
        return self._halo_propagate(plan, terms, edata, drop)

    def _halo_propagate(self, plan: Plan, terms: Any, edata: Any, drop: Any) -> Any:
        leaves, spec = flatten(terms)
        src, dst = read_slots(plan, spec, len(leaves))
        order = sorted(src)
        full = list(leaves)
        for i, t in zip(order, exchange_rows(self.halo, [leaves[i] for i in order])):
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
            how = (f"halo: one all_to_all after pre, rank {r} receives {self.num_halo:,} rows "
                   f"({self.num_halo * choice.row_bytes:,} bytes) and sends "
                   f"{self.halo.num_send:,} ({self.halo.num_send * choice.row_bytes:,} bytes); "
                   "backward the same in reverse")
        else:
            how = (f"ring: {k} steps, each tile's compute overlapping the next source chunk's "
                   f"transfer; rank {r} sends {choice.ring_bytes:,} bytes at most forward")
        return [f"exchange (rank {r} of {k}, between pre and edge) of {moved or 'nothing'}: "
                f"{how}", f"  choice: {choice.describe()}"]


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
