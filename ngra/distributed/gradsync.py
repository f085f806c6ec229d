"""Gradients summed over the ranks in buckets, each launched as soon as backward fills it.

Every parameter gets a post-accumulate-grad hook; when all parameters of a bucket (about
``bucket_bytes`` of them, in reverse registration order, the order backward tends to
reach them) have their gradient, the bucket is flattened and an asynchronous
``all_reduce`` starts, overlapping the rest of backward. :meth:`GradientSync.finish`
launches what backward did not reach (parameters without a gradient count as zeros),
waits, and writes the sums back. Autograd reaches parameters in the same order on every
rank (the same model), so the ranks' collectives pair up.

The sum, not the mean: the loss each rank differentiates is already its share of the
global mean (its rows' sum over the global row count), so the sums are one process's
gradients. A parameter that tensor parallelism split (a ``DTensor``) is summed by its
local shard: the group's ranks hold the same shard of it. This is ``DistributedDataParallel``'s gradient reduction without its
construction cost (it imports ``torch._dynamo``: about 140 MB more in every rank).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["GradientSync"]

BUCKET_BYTES = 25 << 20


def _local(t: torch.Tensor) -> torch.Tensor:
    """``t``'s own shard if tensor parallelism split it, else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


class GradientSync:
    """Sum the gradients of ``params`` over the ranks of ``group`` (see the module docs).

    Args:
        params: the parameters (those that require grad are synchronized).
        group: the process group (default: the default group).
        bucket_bytes: the size of a bucket.
        traffic: an object with ``add(kind, nbytes)`` counting the bytes handed to
            ``all_reduce`` (``ngra.distributed.halo.Traffic``), or ``None``.
    """

    def __init__(self, params: Any, group: Any = None, bucket_bytes: int = BUCKET_BYTES,
                 traffic: Any = None) -> None:
        self.group, self.traffic = group, traffic
        ps = [p for p in params if p.requires_grad][::-1]
        self.buckets: list[list[torch.Tensor]] = []
        size = bucket_bytes
        for p in ps:
            nbytes = _local(p).numel() * p.element_size()
            if size + nbytes > bucket_bytes and (not self.buckets or self.buckets[-1]):
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += nbytes
        self._ready = [0] * len(self.buckets)
        self._works: dict[int, tuple[Any, torch.Tensor]] = {}
        self._handles = [p.register_post_accumulate_grad_hook(self._hook(b))
                         for b, bucket in enumerate(self.buckets) for p in bucket]

    def broadcast_parameters(self) -> None:
        """Make every rank's parameters rank 0's (ranks may build them differently)."""
        with torch.no_grad():
            for bucket in self.buckets:
                for p in bucket:
                    dist.broadcast(_local(p), dist.get_global_rank(self.group, 0) if self.group else 0,
                                   group=self.group)

    def _hook(self, b: int) -> Any:
        def hook(_p: torch.Tensor) -> None:
            self._ready[b] += 1
            if self._ready[b] == len(self.buckets[b]):
                self._launch(b)

        return hook

    def _launch(self, b: int) -> None:
        flat = torch.cat([(_local(p.grad) if p.grad is not None
                           else torch.zeros_like(_local(p))).reshape(-1)
                          for p in self.buckets[b]])
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        if self.traffic is not None:
            self.traffic.add("allreduce", flat.numel() * flat.element_size())
        self._works[b] = (work, flat)

    def finish(self) -> None:
        """After ``backward()``: every parameter's gradient is the sum over the ranks."""
        for b in range(len(self.buckets)):
            if b not in self._works:
                self._launch(b)
        for b, (work, flat) in sorted(self._works.items()):
            work.wait()
            off = 0
            for p in self.buckets[b]:
                mine = _local(p)
                n = mine.numel()
                g = flat[off:off + n].view_as(mine)
                if p.grad is None:
                    p.grad = g.clone() if mine is p else _like(p, g.clone())
                else:
                    _local(p.grad).copy_(g)
                off += n
        self._works.clear()
        self._ready = [0] * len(self.buckets)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def _like(p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` as a gradient of split parameter ``p`` (its mesh and placements)."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False)
