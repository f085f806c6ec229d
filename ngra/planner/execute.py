"""Running a plan with torch's own parallel APIs.

Inside ranks started by :func:`ngra.distributed.launch` (or ``torchrun``), a
:class:`~ngra.planner.plan.ParallelPlan` runs on a ``(pp, dp, tp)`` device mesh
(``init_device_mesh``; rank ``s * d * t + i * t + j``):

* **tensor parallel**: ``parallelize_module`` on the ``tp`` sub-mesh, one style per
  split Linear: ``col`` -> ``ColwiseParallel()``, ``col_gather`` ->
  ``ColwiseParallel(output_layouts=Replicate())``, ``row`` -> ``RowwiseParallel()``,
  ``row_slice`` -> ``RowwiseParallel(input_layouts=Replicate())``; element-wise layers
  between a column and a row split run on the local shard as they are;
* **recomputation**: the stage (or model) runs under
  ``torch.utils.checkpoint.checkpoint`` (non-reentrant);
* **data parallel**: ``DistributedDataParallel`` on the ``dp`` sub-mesh's group (after
  tensor parallelism, through torch's ``_pre_dp_module_transform``, which hands DDP the
  local shards); each replica takes its slice of the rows;
* **pipeline**: ``PipelineStage`` over the ``pp`` group with ``Schedule1F1B`` and the
  plan's micro-batch count, for an ``nn.Sequential`` whose stage boundaries fall
  between its children. Gradients are those of the mean micro-batch loss (torch's
  ``scale_grads``), i.e. of the whole batch's mean loss. Without a pipeline, several
  micro-batches accumulate gradients (DDP's ``no_sync`` until the last).

:func:`apply_plan` parallelizes a model for a plan without a pipeline (a GNN's dense
modules, any module); :class:`Runner` runs whole training steps of any plan on a
batch of rows and gathers full gradients for checks.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ngra.distributed.dense import SPLITS, tp_style
from ngra.planner.plan import ParallelPlan

__all__ = ["plan_mesh", "apply_plan", "Runner", "Recompute", "mse_loss", "full_grads"]


def mse_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error (the loss of the measured and checked steps)."""
    return (out - target).square().mean()


def plan_mesh(plan: ParallelPlan, device: str = "cpu") -> Any:
    """The ``(pp, dp, tp)`` mesh of ``plan`` over the default group's ranks.

    Raises:
        ValueError: the world size is not the plan's device count.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if world != plan.devices:
        raise ValueError(f"plan {plan.label!r} is for {plan.devices} devices; this run has "
                         f"{world} ranks.")
    return init_device_mesh(device, (plan.pipeline, plan.data, plan.tensor),
                            mesh_dim_names=("pp", "dp", "tp"))


class Recompute(nn.Module):
    """Runs ``module`` under non-reentrant activation checkpointing."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.module, *args, use_reentrant=False, **kwargs)


def _styles(plan: ParallelPlan, stages: Sequence[int], modules: Sequence[str] | None) -> dict:
    out = {}
    for s in stages:
        st = plan.stages[s]
        for k, (config, name) in enumerate(zip(st.configs, st.modules)):
            if config not in SPLITS:
                continue
            path = modules[st.start + k] if modules is not None else name
            if not path:
                raise ValueError(f"plan {plan.label!r}: layer {st.layers[k]!r} is split "
                                 f"({config}) but names no module to parallelize.")
            out[path] = tp_style(config)
    return out


def _parallelize(module: nn.Module, plan: ParallelPlan, mesh: Any, stages: Sequence[int],
                 modules: Sequence[str] | None) -> nn.Module:
    """Tensor parallelism, recomputation and DDP for ``stages`` of ``plan`` on ``module``."""
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.nn.parallel import DistributedDataParallel as DDP

    styles = _styles(plan, stages, modules)
    if styles:
        for path in styles:
            if not isinstance(module.get_submodule(path), nn.Linear):
                raise ValueError(f"plan {plan.label!r} splits {path!r}, which is a "
                                 f"{type(module.get_submodule(path)).__name__}, not nn.Linear.")
        parallelize_module(module, mesh["tp"], styles)
    if all(plan.stages[s].recompute for s in stages):
        module = Recompute(module)
    if plan.data > 1:
        if styles:
            from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

            _pre_dp_module_transform(module)
        # in a pipeline, torch's stage drives DDP's reducer by hand (no_sync for all but the
        # last micro-batch); DDP's one-time bucket rebuild then counts each parameter once
        # per micro-batch and fails its check on the second step: find_unused_parameters
        # is the switch that skips that rebuild
        module = DDP(module, process_group=mesh["dp"].get_group(),
                     find_unused_parameters=plan.pipeline > 1 and plan.micro_batches > 1)
    return module


def apply_plan(model: nn.Module, plan: ParallelPlan, mesh: Any = None, *,
               modules: Sequence[str] | None = None) -> nn.Module:
    """``model`` parallelized per ``plan`` (no pipeline): its split Linears by torch's tensor
    parallelism on the ``tp`` sub-mesh, recomputation, and DDP over the ``dp`` replicas.

    The caller feeds each replica its own rows (for a GNN, its partition of the
    graph); the returned module's gradients are then averaged over the replicas.

    Args:
        model: the module (e.g. a zoo GNN); modified in place and wrapped.
        plan: a plan for this run's world size with ``pipeline == 1``.
        mesh: the plan's mesh (default: :func:`plan_mesh`).
        modules: the module path of each chain layer (default: the plan's names).

    Raises:
        ValueError: a pipeline plan, a world of another size, or a split that names no
            ``nn.Linear`` of ``model``.
    """
    if plan.pipeline != 1:
        raise ValueError(f"apply_plan runs plans without a pipeline; {plan.label!r} has "
                         f"{plan.pipeline} stages (run it with Runner on an nn.Sequential).")
    mesh = plan_mesh(plan) if mesh is None else mesh
    return _parallelize(model, plan, mesh, [0], modules)


def _children_of(plan: ParallelPlan, stage: int, model: nn.Sequential,
                 modules: Sequence[str] | None) -> list[str]:
    """The top-level children of ``model`` that run stage ``stage``."""
    st = plan.stages[stage]
    names = [(modules[st.start + k] if modules is not None else (m or n))
             for k, (m, n) in enumerate(zip(st.modules, st.layers))]
    return list(dict.fromkeys(n.split(".")[0] for n in names))


class Runner:
    """Training steps of ``plan`` on one rank (see the module docstring).

    Args:
        model: the whole model, the same (same seed) on every rank; an
            ``nn.Sequential`` for pipeline plans.
        plan: the plan; the world must have ``plan.devices`` ranks.
        loss_fn: ``loss(out, target)``, a mean over rows (default: :func:`mse_loss`).
        optimizer: ``params -> torch.optim.Optimizer`` stepped after each step (default: none).
        modules: the module path of each chain layer in ``model`` (default: the plan's).
        row_ranges: ``[(lo, hi)] * data``: each replica's rows (default: equal slices).
    """

    def __init__(self, model: nn.Module, plan: ParallelPlan, loss_fn: Callable = mse_loss, *,
                 optimizer: Callable | None = None, modules: Sequence[str] | None = None,
                 row_ranges: Sequence[tuple[int, int]] | None = None, mesh: Any = None) -> None:
        import torch.distributed as dist

        self.plan, self.loss_fn = plan, loss_fn
        self.mesh = plan_mesh(plan) if mesh is None else mesh
        rank = dist.get_rank()
        self.stage = plan.stage_of_rank(rank)
        self.replica = (rank // plan.tensor) % plan.data
        self.row_ranges = row_ranges
        if plan.pipeline == 1:
            local = model
            self.names = None
        else:
            if not isinstance(model, nn.Sequential):
                raise ValueError(f"plan {plan.label!r} pipelines {plan.pipeline} stages; the "
                                 f"runner pipelines an nn.Sequential, not {type(model).__name__}.")
            mine = _children_of(plan, self.stage, model, modules)
            for s in range(plan.pipeline):
                if s != self.stage and set(_children_of(plan, s, model, modules)) & set(mine):
                    raise ValueError(f"plan {plan.label!r} cuts inside child {mine} of the "
                                     "Sequential; pipeline cuts must fall between children.")
            local = nn.Sequential(OrderedDict((c, model.get_submodule(c)) for c in mine))
        self.local = local
        self.module = _parallelize(local, plan, self.mesh, [self.stage], modules)
        # now: DDP hands torch's TP transform local shards that forward swaps out again
        self.params = OrderedDict(local.named_parameters())
        params = list(self.module.parameters())
        self.optimizer = optimizer(params) if optimizer and params else None
        self.schedule = None
        if plan.pipeline > 1:
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B

            stage = PipelineStage(self.module, self.stage, plan.pipeline, torch.device("cpu"),
                                  group=self.mesh["pp"].get_group())
            self.schedule = Schedule1F1B(stage, n_microbatches=plan.micro_batches,
                                         loss_fn=loss_fn)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """This replica's rows of a global batch ``x``."""
        if self.row_ranges is not None:
            lo, hi = self.row_ranges[self.replica]
            return x[lo:hi]
        return x.tensor_split(self.plan.data)[self.replica]

    def step(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
        """One training step on the global batch; returns this replica's output rows on
        the ranks that hold them (the last stage), else ``None``."""
        x, target = self.rows(x), self.rows(target)
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        if self.schedule is not None:
            if self.stage == 0:
                out = self.schedule.step(x)
            elif self.stage == self.plan.pipeline - 1:
                out = self.schedule.step(target=target)
            else:
                out = self.schedule.step()
        else:
            m = self.plan.micro_batches
            outs = []
            for k, (xb, tb) in enumerate(zip(x.tensor_split(m), target.tensor_split(m))):
                sync = k == m - 1 or not hasattr(self.module, "no_sync")
                with contextlib.nullcontext() if sync else self.module.no_sync():
                    out = self.module(xb)
                    (self.loss_fn(out, tb) * (xb.shape[0] / x.shape[0])).backward()
                outs.append(out.detach())
            out = torch.cat(outs)
        if self.optimizer is not None:
            self.optimizer.step()
        return out if self.stage == self.plan.pipeline - 1 else None

    def full_grads(self) -> dict[str, torch.Tensor]:
        """This stage's parameter gradients, whole, by parameter name (:func:`full_grads`)."""
        return full_grads(self.params)


def full_grads(params: dict[str, nn.Parameter]) -> dict[str, torch.Tensor | None]:
    """The whole gradient of each of ``params`` (taken from a parallelized module before
    its first forward): tensor-parallel shards are gathered, a collective over the
    tensor-parallel ranks."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel._data_parallel_utils import _unflatten_tensor

    out = {}
    for name, p in params.items():
        g = p.grad
        info = getattr(p, "_st_info", None)
        if g is not None and info is not None:
            g = _unflatten_tensor(g, info)
        if isinstance(g, DTensor):
            g = g.full_tensor()
        out[name] = g
    return out
