"""Kernel launches of one call, counted with ``torch.profiler``.

A step bound by the host shows it in its counts: every kernel is one launch the host
must issue, and every ``cudaStreamSynchronize`` (an ``.item()``, a boolean-mask index, a
pageable copy) drains the queue the launches built up. :func:`count_launches` runs a
callable once under the profiler (CPU and CUDA activities), synchronizes so that the
device's events are flushed, and counts from the trace:

* ``kernels``, ``memcpy``, ``memset``: device activities (CUPTI records), whoever issued
  them: aten, Triton, cuBLAS, or the nodes of a replayed CUDA graph;
* ``launch_calls``: host-side launch API calls (``cudaLaunchKernel``, the driver's
  ``cuLaunchKernel`` that Triton uses, ``cudaGraphLaunch``, async copies and sets): a
  replayed graph makes one call for all its kernels;
* ``syncs``: host waits (stream, device and event synchronizations, blocking copies);
* ``ops``: aten operators dispatched at the top level (not those an operator calls), the
  host's share of the work, counted on any device.

Without CUDA only ``ops`` is counted; the device fields are ``None`` and ``note`` says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

__all__ = ["LaunchCount", "count_launches"]

_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                 "cudaLaunchCooperativeKernel", "cudaGraphLaunch", "cudaMemcpyAsync",
                 "cudaMemsetAsync")
_RANGE = "ngra.count_launches"
_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
               "cudaMemcpy", "cuStreamSynchronize", "cuCtxSynchronize")


@dataclass(frozen=True)
class LaunchCount:
    """What one call launched (see the module docstring); device fields ``None`` where
    nothing ran on a CUDA device."""

    kernels: int | None
    memcpy: int | None
    memset: int | None
    launch_calls: int | None
    syncs: int | None
    ops: int
    note: str = ""

    def describe(self) -> str:
        if self.kernels is None:
            return f"{self.ops} aten ops ({self.note})"
        return (f"{self.kernels} kernels, {self.memcpy} memcpy, {self.memset} memset, "
                f"{self.launch_calls} launch calls, {self.syncs} syncs, {self.ops} aten ops")


def _device_kind(event: Any) -> str | None:
    """``"kernel"``, ``"memcpy"``, ``"memset"`` for a device activity, else ``None``."""
    if event.device_type != torch.autograd.DeviceType.CUDA:
        return None
    kind = str(getattr(event, "activity_type", "") or "").lower()
    name = event.name.lower()
    if "annotation" in kind:  # a record_function range drawn on the GPU timeline
        return None
    if "memcpy" in kind or name.startswith("memcpy"):
        return "memcpy"
    if "memset" in kind or name.startswith("memset"):
        return "memset"
    return "kernel"


def _top_level_op(event: Any) -> bool:
    if event.device_type != torch.autograd.DeviceType.CPU or not event.name.startswith("aten::"):
        return False
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return True


def count_launches(fn: Callable[[], Any], device: torch.device | str) -> LaunchCount:
    """Run ``fn()`` once under ``torch.profiler`` and count what it launched on ``device``.

    Warm ``fn`` up first (Triton compiles, autotunes and caches on its first calls).
    """
    device = torch.device(device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize(device)  # nothing queued before the call is counted
    with profile(activities=activities) as prof:
        with record_function(_RANGE):
            fn()
        if cuda:  # flushes the device's events; not the call's own wait
            torch.cuda.synchronize(device)
    events = prof.events()
    ops = sum(1 for e in events if _top_level_op(e))
    if not cuda:
        return LaunchCount(None, None, None, None, None, ops,
                           note=f"no CUDA device ({device}): only aten ops are counted")
    kinds = [_device_kind(e) for e in events]
    host = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    window = next(e.time_range for e in host if e.name == _RANGE)
    syncs = sum(1 for e in host if e.name in _SYNC_CALLS
                and window.start <= e.time_range.start <= window.end)
    return LaunchCount(kinds.count("kernel"), kinds.count("memcpy"), kinds.count("memset"),
                       sum(1 for e in host if e.name in _LAUNCH_CALLS), syncs, ops)
