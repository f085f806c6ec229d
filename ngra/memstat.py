"""Process memory readings: current RSS, peak RSS, and a resettable high-water mark.

Peak RSS is read from the kernel's per-address-space high-water mark (``VmHWM`` in
``/proc/self/status``), never from ``getrusage(...).ru_maxrss``: Linux carries a
parent's peak across fork and exec into the child's ``ru_maxrss``, so a child started
by a large process (pytest after a thousand tests, a benchmark driver) would report
its parent's peak as its own. ``VmHWM`` belongs to the exec'd address space only, and
writing ``5`` to ``/proc/self/clear_refs`` resets it, so one step's own peak can be
measured. Off Linux, ``ru_maxrss`` is the fallback (it can only overstate).
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import weakref

import numpy as np

__all__ = ["rss_bytes", "peak_rss_bytes", "reset_peak_rss", "malloc_trim", "release_large_frees",
           "tensor_peak_bytes", "mapped_from", "register_mapped", "release_mapped", "prefetch_mapped",
           "mapped_file", "register_mmap", "scratch_file", "scratch_mapped", "is_mapped", "io_read_bytes"]


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


# ------------------------------------------------------------- memory-mapped arrays
#: id(mmap) -> (start, end, mmap, base, file): the mapped arrays :func:`release_mapped` knows
_MAPPED: dict[int, tuple[int, int, object, int, str | None]] = {}


def register_mapped(array) -> None:
    """Remember a numpy memmap (the on-disk store's arrays) so that :func:`release_mapped`
    can drop its pages from this process once they are read."""
    import mmap as _mmap

    mm = getattr(array, "_mmap", None)
    if mm is None or array.size == 0:
        return
    offset = int(getattr(array, "offset", 0))
    base = array.ctypes.data - offset % _mmap.ALLOCATIONGRANULARITY  # where the mapping starts
    name = getattr(array, "filename", None)
    _remember(mm, array, base, str(name) if name is not None else None)


def register_mmap(mm, array, name: str | None = None) -> None:
    """Remember an array over the whole of ``mmap.mmap`` ``mm`` (mapped from offset 0),
    as :func:`register_mapped` does for a numpy memmap; ``name`` is what
    :func:`mapped_file` answers for it."""
    if array.size:
        _remember(mm, array, array.ctypes.data, name)


def _remember(mm, array, base: int, name: str | None) -> None:
    _MAPPED[id(mm)] = (array.ctypes.data, array.ctypes.data + array.nbytes, mm, base, name)
    weakref.finalize(array, _MAPPED.pop, id(mm), None)  # forget it (and unmap) with the array


def scratch_file(near, prefix: str) -> tuple[int, str]:
    """``(fd, path)`` of a new empty file in the folder the memory-mapped ``near`` was
    mapped from (else, or if that folder is not writable, the temp folder): where a large
    array derived from data on disk goes. The caller unlinks it once opened or mapped."""
    import tempfile

    folder = os.path.dirname(mapped_file(near) or "") if near is not None else ""
    try:
        return tempfile.mkstemp(prefix=prefix, suffix=".bin", dir=folder or None)
    except OSError:
        return tempfile.mkstemp(prefix=prefix, suffix=".bin")


def scratch_mapped(near, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A new writable array in a file on disk, mapped: where a result derived from a
    memory-mapped array (``near``) is as large as it, it goes to disk beside it instead of
    into memory. The file is made in the folder ``near`` was mapped from (else the temp
    folder) and unlinked at once, so its disk space goes back when the array is freed, or
    the process ends. Writers drop the pages they wrote with :func:`release_mapped`."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype=dtype)
    fd, path = scratch_file(near, ".ngra-scratch-")
    try:
        os.ftruncate(fd, nbytes)
        a = np.memmap(path, dtype=dtype, mode="r+", shape=tuple(shape))
    finally:
        os.close(fd)
        os.unlink(path)
    register_mapped(a)
    return a


def _mapping(t) -> tuple[int, int, object, int, str | None] | None:
    if not _MAPPED:
        return None
    ptr = t.data_ptr() if hasattr(t, "data_ptr") else t.ctypes.data
    for entry in list(_MAPPED.values()):
        if entry[0] <= ptr < entry[1]:
            return entry
    return None


def _advise(t, lo: int | None, hi: int | None, advice: int) -> bool:
    import mmap as _mmap

    entry = _mapping(t)
    if entry is None:
        return False
    _, _, mm, base, _ = entry
    ptr = t.data_ptr() if hasattr(t, "data_ptr") else t.ctypes.data
    nbytes = (t.numel() * t.element_size()) if hasattr(t, "numel") else t.nbytes
    shape0 = t.shape[0] if len(t.shape) else 1
    row = nbytes // max(shape0, 1)
    a = ptr + (0 if lo is None else lo * row)
    b = ptr + (nbytes if hi is None else hi * row)
    page = _mmap.PAGESIZE
    a0 = max((a - base) // page * page, 0)
    b0 = min(-(-(b - base) // page) * page, len(mm))
    if b0 > a0:
        try:
            mm.madvise(advice, a0, b0 - a0)
        except (OSError, ValueError, AttributeError):
            return False
    return True


def release_mapped(t, lo: int | None = None, hi: int | None = None) -> bool:
    """Drop the pages of rows ``[lo, hi)`` of a memory-mapped tensor or array from this
    process's resident set (``madvise(MADV_DONTNEED)``; the data stays on disk and in
    the page cache, and is read again on the next access). A no-op for ordinary memory.

    Reading a file-backed mapping adds its pages to the RSS until the kernel reclaims
    them; streaming readers call this after each block so the RSS stays at a block.
    """
    import mmap as _mmap

    return _advise(t, lo, hi, _mmap.MADV_DONTNEED)


def prefetch_mapped(t, lo: int | None = None, hi: int | None = None) -> bool:
    """Start reading rows ``[lo, hi)`` of a memory-mapped tensor or array from disk in the
    background (``madvise(MADV_WILLNEED)``): a streaming reader asks for its next block
    before computing on the current one, so the reads overlap the compute. A no-op for
    ordinary memory."""
    import mmap as _mmap

    return _advise(t, lo, hi, _mmap.MADV_WILLNEED)


def mapped_file(t) -> str | None:
    """The file a memory-mapped tensor or array was mapped from (``None``: not mapped)."""
    entry = _mapping(t)
    return entry[4] if entry is not None else None


def is_mapped(t) -> bool:
    """Whether ``t`` lies in a memory-mapped array registered with :func:`register_mapped`."""
    return _mapping(t) is not None
