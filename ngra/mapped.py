"""Memory-mapped arrays: their pages dropped once read, read ahead, and scratch files.

A dataset mapped from disk (``storage="disk"``) is read a block at a time; once a block
is read, :func:`release_mapped` tells the kernel (``madvise(MADV_DONTNEED)``) that this
process is done with its pages, so the resident set stays near one block, and
:func:`prefetch_mapped` (``MADV_WILLNEED``) reads the next block ahead. Only arrays this
module was told about (:func:`register_mapped`, :func:`register_mmap`) are advised;
:func:`is_mapped` and :func:`mapped_file` answer for them. :func:`scratch_file` and
:func:`scratch_mapped` make derived arrays on disk beside the data they come from.
"""

from __future__ import annotations

import os
import weakref

import numpy as np

from ngra.diskspace import reserve

__all__ = ["is_mapped", "mapped_file", "prefetch_mapped", "register_mapped", "register_mmap",
           "release_mapped", "scratch_file", "scratch_mapped"]


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
    the process ends. Its bytes are reserved on disk first: a full disk raises
    :class:`~ngra.errors.DiskFullError`. Writers drop the pages they wrote with :func:`release_mapped`."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype=dtype)
    fd, path = scratch_file(near, ".ngra-scratch-")
    try:
        # a sparse file's pages fail with SIGBUS on a full disk: reserve them first
        reserve(fd, nbytes, f"a {tuple(shape)} {dtype} scratch array derived from data on disk",
                os.path.dirname(path))
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
