"""Large kernel outputs in reused memory: no first-touch page faults on every call.

A g-SpMM's output on a large graph is tens of MiB (R-MAT 2^18, F=64: 64 MiB). glibc maps
such a block afresh on every allocation and the kernel then pays a page fault for each
4-KiB page it writes: 18 ms of a 45-ms copy-sum on this machine (the kernel itself: 25).
:func:`empty` hands out outputs of :data:`MIN_BYTES` to half :data:`MAX_IDLE_BYTES` from
memory this module keeps: a block whose previous output is gone (no tensor shares its
storage any more: torch's storage use count, calibrated on a block nobody else holds) is
handed out again, already resident. Each call leaves at most :data:`MAX_IDLE_BYTES` of idle blocks
(the oldest go back to the OS), so outputs freed since the last call can exceed it until
the next.

Off (plain ``torch.empty``) where the process wants large frees back at once
(:func:`ngra.memstat.release_large_frees`: a memory budget, training from disk, a
multi-process rank): kept blocks would count against the bound those promise.
"""

from __future__ import annotations

import math
import threading

import torch

from ngra.kernels.checks import storage_uses
from ngra import memstat  # by module: tests stand in for mapped_from

__all__ = ["MAX_IDLE_BYTES", "MIN_BYTES", "empty", "idle_bytes"]

#: Outputs smaller than this come from ``torch.empty`` (glibc reuses its heap for them).
MIN_BYTES = 16 << 20
#: Idle kept blocks beyond this many bytes are released.
MAX_IDLE_BYTES = 512 << 20

_lock = threading.Lock()
_blocks: list[torch.Tensor] = []  # 1-D uint8; an output shares one's storage
_idle_uses: int | None = None


def _idle(block: torch.Tensor) -> bool:
    global _idle_uses
    if _idle_uses is None:
        _idle_uses = storage_uses(torch.empty(1, dtype=torch.uint8))
    return storage_uses(block) == _idle_uses


def idle_bytes() -> int:
    """Bytes of kept blocks that no output uses now."""
    with _lock:
        return sum(b.numel() for b in _blocks if _idle(b))


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized contiguous CPU tensor like ``torch.empty(shape, dtype=dtype)``,
    from a kept block when it is large (see the module docstring)."""

    nbytes = math.prod(shape) * dtype.itemsize
    if not MIN_BYTES <= nbytes <= MAX_IDLE_BYTES // 2 or memstat.mapped_from() is not None:
        return torch.empty(shape, dtype=dtype)
    with _lock:
        block = next((b for b in _blocks if b.numel() == nbytes and _idle(b)), None)
        if block is None:
            block = torch.empty(nbytes, dtype=torch.uint8)
            _blocks.append(block)
        idle = [b for b in _blocks if _idle(b) and b is not block]
        while idle and sum(b.numel() for b in idle) > MAX_IDLE_BYTES:
            _blocks.remove(idle.pop(0))  # the oldest idle block goes back to the OS
        out = torch.empty(0, dtype=dtype)
        return out.set_(block.untyped_storage(), 0, shape)
