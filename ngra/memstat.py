"""Process memory readings: current RSS, peak RSS, and a resettable high-water mark.

Peak RSS is read from the kernel's per-address-space high-water mark (``VmHWM`` in
``/proc/self/status``), never from ``getrusage(...).ru_maxrss``: Linux carries a
parent's peak across fork and exec into the child's ``ru_maxrss``, so a child started
by a large process (pytest after a thousand tests, a benchmark driver) would report
its parent's peak as its own. ``VmHWM`` belongs to the exec'd address space only, and
writing ``5`` to ``/proc/self/clear_refs`` resets it, so one step's own peak can be
measured. Off Linux, ``ru_maxrss`` is the fallback (it can only overstate).

Memory-mapped arrays (their pages dropped once read, scratch files) are
:mod:`ngra.mapped`'s.
"""

from __future__ import annotations

import ctypes
import gc
import sys

__all__ = ["rss_bytes", "peak_rss_bytes", "reset_peak_rss", "malloc_trim", "release_large_frees",
           "tensor_peak_bytes", "mapped_from", "io_read_bytes"]


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _maxrss_bytes() -> int:
    import resource

    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def rss_bytes() -> int:
    """Current resident set size of this process."""
    kb = _status_kb("VmRSS")
    if kb is not None:
        return kb * 1024
    import psutil

    return psutil.Process().memory_info().rss


def io_read_bytes() -> int:
    """Bytes this process has caused to be read from storage (``read_bytes`` of
    ``/proc/self/io``: page-cache hits are not counted); 0 where unavailable."""
    try:
        with open("/proc/self/io") as fh:
            for line in fh:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_bytes() -> int:
    """Peak RSS of this process since it started or since :func:`reset_peak_rss`."""
    kb = _status_kb("VmHWM")
    return kb * 1024 if kb is not None else _maxrss_bytes()


def reset_peak_rss() -> bool:
    """Free what can be freed and reset the high-water mark to the current RSS.

    Returns False where the reset is unavailable (not Linux, or ``clear_refs`` not
    writable): :func:`peak_rss_bytes` is then the process-lifetime peak.
    """
    gc.collect()
    malloc_trim()
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def malloc_trim() -> None:
    """Give freed heap pages back to the OS (glibc), so a baseline is not inflated."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


_M_MMAP_THRESHOLD = -3  # mallopt parameter (glibc malloc.h)
LARGE_FREE_BYTES = 1 << 20
_released: int | None = None  # the threshold set, once set


def release_large_frees(threshold: int = LARGE_FREE_BYTES) -> bool:
    """Serve allocations of ``threshold`` bytes and more with their own mappings (glibc),
    so that freeing them returns the memory to the OS at once.

    glibc raises its mmap threshold (up to 32 MiB) each time a mapped block is
    freed; afterwards the per-tile temporaries of a chunked walk (staged rows,
    partials, edge slices: 1-32 MiB each, made by two threads) come from heap
    arenas that keep freed pages, and the process peak grows past the working
    set (GCN on R-MAT 2^18 under a 128 MB budget: epoch peak 1.29x unchunked;
    1.06x with this). Process-wide and for the rest of the process (an explicit
    threshold also turns glibc's adaptation off). Large buffers are then
    page-faulted afresh on each allocation, the price of a bounded peak.
    A walk over several tiles calls it (:func:`ngra.runtime.stream.walk`), and a
    multi-process rank (from 8 MiB). A later call only lowers the threshold. Returns
    False where not glibc.
    """
    global _released
    if _released is not None and _released <= threshold:
        return True
    try:
        ok = bool(ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    except (OSError, AttributeError):
        return False
    if ok:
        _released = int(threshold)
    return ok


def mapped_from() -> int | None:
    """The threshold :func:`release_large_frees` set in this process (``None``: glibc's
    own adaptive one)."""
    return _released


def tensor_peak_bytes(fn, device: str = "cpu") -> int:
    """Peak bytes of ``device`` tensors alive at once while ``fn()`` runs, above those alive
    before it, from torch's memory profiler (its allocation and free events, tracked per
    storage). Unlike RSS it counts no allocator slack (glibc heap retention, huge-page
    rounding) and no memory outside torch (numpy/numba buffers): the working set the
    code itself asks for. Raises ``RuntimeError`` where this torch lacks the profiler's
    memory timeline."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        from torch.profiler._memory_profiler import MemoryProfile
    except ImportError as exc:  # pragma: no cover - torch without the timeline
        raise RuntimeError(f"torch {torch.__version__} has no profiler memory timeline") from exc
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        fn()
    live: dict = {}
    cur = peak = 0
    for _, action, (key, _), size in MemoryProfile(prof.profiler.kineto_results).timeline:
        if key.device.type != device:
            continue
        if action.name == "CREATE":
            live[key] = size
            cur += size
        elif action.name == "DESTROY":
            cur -= live.pop(key, 0)
        peak = max(peak, cur)
    return peak
