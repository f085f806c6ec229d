"""BatchNorm over the ranks' rows together: K ranks normalize a batch as one process does.

Data-parallel ranks each hold a share of a batch. ``nn.BatchNorm1d`` on a rank would
normalize the share by its own statistics (``DistributedDataParallel`` without
``SyncBatchNorm``); ``torch.nn.SyncBatchNorm`` shares them, but only for CUDA tensors.
:class:`SyncBatchNorm1d` shares them on any device, over any backend (gloo on the CPU):

- **forward** (training): each rank forms, per channel, its row count ``n_r``, sum
  ``s_r`` and sum of squares ``q_r``, in float64 and from its own centred values
  (``q_r = sum (x - m_r)^2 + n_r m_r^2`` with ``m_r = s_r / n_r``, so the sum of squares
  loses nothing to cancellation); one ``all_reduce`` sums ``(n, s, q)`` over the ranks;
  the mean is ``S / N`` and the (biased) variance ``Q / N - mean^2``, which normalize the
  rank's rows;
- **backward**: the statistics' gradients are summed over the ranks by the same
  ``all_reduce`` in reverse (:class:`AllReduceSum`): a rank's sums feed every rank's
  normalized rows, so each rank's gradient of them is the sum of all ranks' -- the
  reductions ``sum(dy)`` and ``sum(dy * x_hat)`` of BatchNorm's backward, taken over
  the whole batch;
- **running statistics** are updated from the global ones with torch's convention (the
  running variance is unbiased, ``var * N / (N - 1)``; ``momentum=None`` is a cumulative
  average), so every rank holds one process's ``running_mean`` / ``running_var``;
- **eval mode** is ``nn.BatchNorm1d``'s, with no collective (the running statistics;
  with ``track_running_stats=False`` the rank's own batch, as one process normalizes
  each evaluation batch by itself): ranks evaluate different numbers of batches.

A rank whose share is empty (0 rows) still joins every collective, forward and
backward, so no rank waits for it; a batch of 0 rows in all leaves the running
statistics as they were (as ``nn.BatchNorm1d`` does), and one of 1 row fails on every
rank with ``nn.BatchNorm1d``'s error. The statistics travel on their own process group
(:func:`sync_batch_norm` makes one), so the gradient buckets' asynchronous
``all_reduce`` (:mod:`ngra.distributed.gradsync`) can never pair with them.

:func:`sync_batch_norm` swaps every ``nn.BatchNorm1d`` of a model for a
:class:`SyncBatchNorm1d` sharing its parameters and buffers (the same ``state_dict``
keys: a checkpoint loads into either).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["AllReduceSum", "SyncBatchNorm1d", "batch_stats", "sync_batch_norm"]


class AllReduceSum(torch.autograd.Function):
    """``all_reduce`` (sum) over ``group`` that autograd sees: the gradient of the sum
    with respect to each rank's term is the sum of every rank's output gradient."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, group: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        out = t.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def batch_stats(x: torch.Tensor, reduce: Any = None
                ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per-channel ``(mean, biased variance)`` in float64 and the row count ``N`` of
    ``x`` (``[rows, C]`` or ``[rows, C, L]``), its sums passed through ``reduce``
    (``[2C + 1]`` float64 ``-> [2C + 1]``; default: none, one process's statistics).

    ``reduce`` is what makes them global: :class:`AllReduceSum` over the ranks."""
    c = x.shape[1]
    dims = [0, *range(2, x.dim())]
    n = x.numel() // c if c else 0
    s = x.sum(dims, dtype=torch.float64)
    m = s / max(n, 1)
    centred = x - m.to(x.dtype).view(1, c, *[1] * (x.dim() - 2))
    q = (centred * centred).sum(dims, dtype=torch.float64) + n * m * m
    sums = torch.cat([s.new_tensor([float(n)]), s, q])
    if reduce is not None:
        sums = reduce(sums)
    count = int(round(float(sums[0].detach())))
    mean = sums[1:c + 1] / max(count, 1)
    var = (sums[c + 1:] / max(count, 1) - mean * mean).clamp_min(0.0)
    return mean, var, count


class SyncBatchNorm1d(nn.BatchNorm1d):
    """``nn.BatchNorm1d`` whose training statistics are the whole batch's, over the
    ranks of ``group`` (module docstring). Shapes: ``[rows, C]`` or ``[rows, C, L]``.

    Args:
        num_features, eps, momentum, affine, track_running_stats: as ``nn.BatchNorm1d``.
        group: the process group the ranks share (default: the default group).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 group: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.group = group

    @classmethod
    def of(cls, bn: nn.BatchNorm1d, group: Any = None) -> SyncBatchNorm1d:
        """A :class:`SyncBatchNorm1d` holding ``bn``'s own parameters and buffers."""
        out = cls(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats,
                  group)
        for name, p in bn.named_parameters(recurse=False):
            setattr(out, name, p)
        for name, b in bn.named_buffers(recurse=False):
            setattr(out, name, b)
        out.train(bn.training)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() not in (2, 3):
            raise ValueError(f"{type(self).__name__} expects [rows, C] or [rows, C, L] input; "
                             f"got {list(x.shape)}.")
        if x.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}({self.num_features}) got {x.shape[1]} "
                             f"channels (input {list(x.shape)}).")
        if not self.training or not dist.is_initialized():
            return super().forward(x)  # eval: no collective (module docstring)
        group = self.group
        mean, var, n = batch_stats(x, lambda t: AllReduceSum.apply(t, group))
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
        if n == 1:  # every rank sees the same count: all fail together
            raise ValueError("Expected more than 1 value per channel when training, got "
                             f"1 row over the ranks (this rank's input {list(x.shape)}).")
        if self.track_running_stats and n > 0:
            with torch.no_grad():
                f = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                     else self.momentum)
                unbiased = var * n / (n - 1)
                self.running_mean.mul_(1 - f).add_(mean.to(self.running_mean.dtype), alpha=f)
                self.running_var.mul_(1 - f).add_(unbiased.to(self.running_var.dtype), alpha=f)
        shape = (1, -1, *[1] * (x.dim() - 2))
        inv = torch.rsqrt(var + self.eps).to(x.dtype).view(shape)
        y = (x - mean.to(x.dtype).view(shape)) * inv
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


def sync_batch_norm(model: nn.Module, group: Any = None) -> int:
    """Swap, in place, every ``nn.BatchNorm1d`` of ``model`` (its own class, not a
    subclass that may compute otherwise) for a :class:`SyncBatchNorm1d` over ``group``
    (default: a new gloo group of all ranks, made only when there is one to swap: every
    rank must call this on the same model). Returns how many were swapped."""
    found = [(parent, name) for parent in model.modules()
             for name, child in parent.named_children() if type(child) is nn.BatchNorm1d]
    if not found:
        return 0
    if group is None:
        group = dist.new_group(backend="gloo")
    for parent, name in found:
        setattr(parent, name, SyncBatchNorm1d.of(getattr(parent, name), group))
    return len(found)
