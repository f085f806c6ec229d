"""Disk space: reserved before a file is written, and reclaimed from killed writers.

**Reserving.** A file written through a memory map (a cache entry's streamed arrays, a
scratch array) is sparse until its pages are written; on a full disk the write of a page
then fails with ``SIGBUS``, which ends the process with no message. :func:`reserve`
allocates the file's blocks first (``posix_fallocate``), so a full disk is an
:class:`~ngra.errors.DiskFullError` raised before anything is written, saying what was
being written, how many bytes it needed and where. Plain writes (``write``, ``torch.save``)
reserve too, so a full disk fails before a file is half written; :func:`disk_full_error`
turns a failed write's ``ENOSPC`` / ``EFBIG`` / ``EDQUOT`` (also one that ``torch.save``
wrapped in a ``RuntimeError``) into the same error.

**Leftovers.** A writer that is killed (``SIGKILL``, a power cut) cannot remove its
partial output. Writers name that output with :func:`writer_tag` (this host and process
id); :func:`collect_leftovers` removes the ones whose process is gone from this host,
logging how many bytes it freed. Output of another host's writer (a shared folder) is
left alone.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import socket
from collections.abc import Iterable
from pathlib import Path

from ngra.errors import DiskFullError

__all__ = ["DISK_FULL_ERRNOS", "collect_leftovers", "disk_full_error", "format_bytes",
           "reserve", "writer_alive", "writer_tag"]

log = logging.getLogger(__name__)

#: errnos that mean "no room for these bytes": a full disk, a quota, the file-size limit
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def format_bytes(n: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"`` (``None`` -> ``"an unknown number of bytes"``)."""
    if n is None:
        return "an unknown number of bytes"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{int(v)} B" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    raise AssertionError("unreachable")


def _free_bytes(path: str | os.PathLike[str]) -> int | None:
    folder = Path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def disk_full_error(err: BaseException, what: str, path: str | os.PathLike[str],
                    needed: int | None) -> DiskFullError | None:
    """The :class:`~ngra.errors.DiskFullError` that ``err`` stands for (an ``OSError`` of
    :data:`DISK_FULL_ERRNOS`, itself or as the cause / context of another error, as
    ``torch.save`` wraps it), or ``None`` when ``err`` is something else."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, DiskFullError):
            return e
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return _error(e.errno, what, path, needed)
        e = e.__cause__ or e.__context__
    return None


def _error(code: int, what: str, path: str | os.PathLike[str],
           needed: int | None) -> DiskFullError:
    free = _free_bytes(path)
    why = ("the file-size limit (ulimit -f) was reached" if code == errno.EFBIG else
           "the disk quota is exceeded" if code == errno.EDQUOT else "no space left on device")
    return DiskFullError(
        path, needed,
        f"could not write {what} to {path}: {why} ({format_bytes(needed)} needed, "
        f"{format_bytes(free) if free is not None else 'unknown'} free there); free some "
        "space or write elsewhere. Nothing was left half-written.", code)


def reserve(fd: int, nbytes: int, what: str, path: str | os.PathLike[str],
            offset: int = 0) -> None:
    """Allocate bytes ``[offset, offset + nbytes)`` of the open file ``fd`` on disk before
    they are written (``posix_fallocate``). Raises :class:`~ngra.errors.DiskFullError`
    naming ``what`` and ``path`` when the disk (or quota, or file-size limit) has no room.
    A file system that cannot preallocate (``EOPNOTSUPP``, ``EINVAL``) is left as is."""
    if nbytes <= 0:
        return
    try:
        os.posix_fallocate(fd, offset, nbytes)
    except OSError as err:
        if err.errno in DISK_FULL_ERRNOS:
            raise _error(err.errno, what, path, nbytes) from None
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise


# ------------------------------------------------------------------------ leftovers
_TAG = re.compile(r"@(?P<host>[A-Za-z0-9_.-]+)~(?P<pid>\d+)@")


def writer_tag() -> str:
    """``@host~pid@``: put in the name of a partial output, so that a later run can tell
    whether its writer is still alive (:func:`writer_alive`)."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname()) or "host"
    return f"@{host}~{os.getpid()}@"


def writer_alive(name: str) -> bool | None:
    """Whether the writer tagged in ``name`` runs: ``None`` when ``name`` has no tag or
    its host is not this one (nothing can be said)."""
    m = _TAG.search(name)
    if m is None or m["host"] != writer_tag()[1:].split("~")[0]:
        return None
    pid = int(m["pid"])
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    # a live pid may be a new process that reused the number: trust it unless it is a zombie
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _size(p: Path) -> int:
    if p.is_symlink() or not p.is_dir():
        try:
            return p.lstat().st_size
        except OSError:
            return 0
    total = 0
    for root, _, files in os.walk(p):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def collect_leftovers(folder: str | os.PathLike[str], patterns: Iterable[str],
                      what: str) -> int:
    """Remove the entries of ``folder`` matching the glob ``patterns`` whose writer (the
    :func:`writer_tag` in their name) is gone from this host; log what was freed. Returns
    the bytes freed."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    freed, count = 0, 0
    for pattern in patterns:
        for p in folder.glob(pattern):
            if writer_alive(p.name) is not False:
                continue
            size = _size(p)
            try:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
            except FileNotFoundError:
                continue  # another run collected it first
            except OSError as err:
                log.warning("could not remove %s left by a stopped run: %s", p, err)
                continue
            freed += size
            count += 1
    if count:
        log.warning("removed %d %s left by stopped runs in %s, freeing %s", count, what,
                    folder, format_bytes(freed))
    return freed
