"""The dense layers' plan on the graph trainer's ranks: data x tensor parallel.

``ngra train --nprocs K --plan auto|FILE`` runs a planner's plan without a pipeline
(:mod:`ngra.planner.train_plans`) of shape ``dp d x tp t`` with ``K = d * t``:

* the graph is partitioned ``d`` ways (the ``d``-way book the planner priced); rank ``r``
  holds row partition ``r // t`` (its *replica*) at position ``r % t`` of that replica's
  tensor-parallel group, the rank order of :func:`ngra.planner.execute.plan_mesh`;
* the ``t`` ranks of a replica run the same graph layers on the same partition; each
  Linear the plan splits (``col``, ``col_gather``, ``row``, ``row_slice``: an ApplyVertex
  ``nn.Linear`` the runtime calls through its ``forward``) is parallelized over them with
  torch's ``parallelize_module``, the others run whole on each (the plan's replicated
  ``r`` layers, priced so by the planner);
* the halo exchange (or ring) runs among the ``d`` ranks at one position, one per replica,
  in a group of its own; gradients and the loss and metric sums run among the same ``d``
  ranks in another group (a split parameter by its local shard, which those ranks share).
  Each position thus computes one process's gradients, and the ``t`` positions together
  hold the whole model.

``t = 1`` is the data-parallel run of ``--nprocs K`` without a plan: the exchange among
all ranks, gradients over the default group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["SPLITS", "DenseLayout", "RankGroups", "rank_groups", "split_linears", "tp_style"]

#: The configurations that split an ``nn.Linear`` (the others run it whole or are no Linear).
SPLITS = ("col", "col_gather", "row", "row_slice")


def tp_style(config: str) -> Any:
    """torch's parallel style for a Linear split by ``config`` (one of :data:`SPLITS`)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if config == "col":
        return ColwiseParallel()
    if config == "col_gather":
        return ColwiseParallel(output_layouts=Replicate())
    if config == "row":
        return RowwiseParallel()
    if config == "row_slice":
        return RowwiseParallel(input_layouts=Replicate())
    raise ValueError(f"{config!r} splits no Linear; the splits are {SPLITS}.")


@dataclass(frozen=True)
class DenseLayout:
    """How ``data * tensor`` ranks share the dense layers (module docstring).

    Attributes:
        data: row partitions (replicas). tensor: ranks per replica.
        configs: ``{module path: split}`` of the Linears the plan splits.
    """

    data: int
    tensor: int = 1
    configs: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, nprocs: int, plan: dict[str, Any] | None = None) -> DenseLayout:
        """The layout of a run of ``nprocs`` processes with the plan record ``plan`` (the
        summary's ``plan``: its ``used`` plan), else ``nprocs`` data-parallel ranks."""
        used = (plan or {}).get("used")
        if not used:
            return cls(nprocs)
        if used["data"] * used["tensor"] != nprocs or used["pipeline"] != 1:
            raise ValueError(f"plan {used['label']!r} is for {used['devices']} devices without "
                             f"a pipeline; this run has --nprocs {nprocs}.")
        return cls(int(used["data"]), int(used["tensor"]), dict(used.get("configs") or {}))

    @property
    def world_size(self) -> int:
        return self.data * self.tensor

    def replica(self, rank: int) -> int:
        """The row partition rank ``rank`` holds."""
        return rank // self.tensor

    def position(self, rank: int) -> int:
        """Rank ``rank``'s place in its replica's tensor-parallel group."""
        return rank % self.tensor

    def describe(self) -> dict[str, Any]:
        return {"data": self.data, "tensor": self.tensor, "splits": dict(self.configs),
                "replica_of_rank": [self.replica(r) for r in range(self.world_size)]}


@dataclass
class RankGroups:
    """One rank's process groups: ``exchange`` (the graph's), ``gradients`` (``None``:
    the default group) and ``tp`` (the device mesh of its tensor-parallel group, or
    ``None`` when nothing is split)."""

    exchange: Any
    gradients: Any
    tp: Any


def rank_groups(layout: DenseLayout, device: str = "cpu") -> RankGroups:
    """Create every rank's groups of ``layout`` (collective: every rank calls it, in the
    same order) and return this rank's."""
    k, rank = dist.get_world_size(), dist.get_rank()
    if k != layout.world_size:
        raise ValueError(f"the dense layout dp{layout.data} x tp{layout.tensor} needs "
                         f"{layout.world_size} ranks; this run has {k}.")
    if layout.tensor == 1:
        return RankGroups(dist.new_group(list(range(k))), None, None)

    def at_my_position() -> Any:
        """One group per position (one rank of each replica; every rank creates them all,
        in order), this rank's."""
        groups = [dist.new_group([i * layout.tensor + p for i in range(layout.data)])
                  for p in range(layout.tensor)]
        return groups[layout.position(rank)]

    exchange, gradients = at_my_position(), at_my_position()  # exchange traffic kept apart
    tp = None
    if layout.configs:
        from torch.distributed.device_mesh import init_device_mesh

        tp = init_device_mesh(device, (layout.data, layout.tensor),
                              mesh_dim_names=("dp", "tp"))["tp"]
    return RankGroups(exchange, gradients, tp)


def split_linears(model: torch.nn.Module, layout: DenseLayout, tp: Any) -> torch.nn.Module:
    """``model`` with the Linears ``layout`` splits parallelized over mesh ``tp`` (in place).

    Raises:
        ValueError: a split path that names no ``nn.Linear`` of ``model``.
    """
    styles = {}
    for path, config in layout.configs.items():
        if config not in SPLITS:
            continue
        try:
            mod = model.get_submodule(path)
        except AttributeError:
            mod = None
        if not isinstance(mod, torch.nn.Linear):
            raise ValueError(f"the plan splits {path!r} ({config}), which is "
                             f"{'not in the model' if mod is None else type(mod).__name__}, "
                             "not an nn.Linear of it.")
        styles[path] = tp_style(config)
    if styles:
        # imported here: DTensor pulls in sympy (about 40 MB a rank); most plans split nothing
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(model, tp, styles)
    return model
