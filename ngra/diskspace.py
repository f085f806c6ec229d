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

**Whole files or none.** :func:`atomic_output` (and :func:`write_file`, its one-call form)
writes a file under a temporary name beside it, reserves its bytes when they are known,
syncs it and renames it into place: a failure (a full disk, a signal, a bug) removes the
temporary and leaves the previous file as it was. Partition books, shards, ``--out``
summaries, predictions and calibrations are written this way.

**Leftovers.** A writer that is killed (``SIGKILL``, a power cut) cannot remove its
partial output. Writers name that output with :func:`writer_tag` (this host and process
id); :func:`collect_leftovers` removes the ones whose process is gone from this host,
logging how many bytes it freed. Output of another host's writer (a shared folder) is
left alone. Temporaries that carry no tag (named by an ngra before the tags, with a pid
and no host, or none) cannot be asked about their writer: they are taken as abandoned
when nothing in them has changed for :data:`UNTAGGED_STALE_S` (a day), since a live
writer keeps writing; younger ones are left alone.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import logging
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from ngra.errors import DiskFullError

__all__ = ["DISK_FULL_ERRNOS", "UNTAGGED_STALE_S", "atomic_output", "collect_leftovers",
           "disk_full_error", "format_bytes", "reserve", "sync_folder", "write_file",
           "writer_alive", "writer_tag"]

log = logging.getLogger(__name__)

#: errnos that mean "no room for these bytes": a full disk, a quota, the file-size limit
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
#: Seconds without a change after which a temporary with no writer tag (an older ngra's)
#: is taken as abandoned by :func:`collect_leftovers`.
UNTAGGED_STALE_S = 24 * 3600


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


# -------------------------------------------------------------------- whole files
@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], what: str,
                  needed: int | None = None) -> Iterator[BinaryIO]:
    """Write ``path`` whole or not at all (module docstring): yields a binary file open on
    ``.<name>.<writer tag><random>.tmp`` beside ``path``, with ``needed`` bytes reserved
    first when given (the bytes reserved past what the block wrote are given back). When
    the block ends the file is synced and renamed over ``path``; when it raises, the
    temporary is removed and ``path`` is untouched. A full disk, at the reservation or at
    a write past it, is :class:`~ngra.errors.DiskFullError` naming ``what`` and ``path``.
    Temporaries of ``path`` that killed writers left are collected first."""
    path = Path(path)
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    collect_leftovers(folder, [f".{glob.escape(path.name)}.*tmp*"],
                      f"partial copies of {path.name}")
    tmp = folder / f".{path.name}.{writer_tag()}{uuid.uuid4().hex[:8]}.tmp"
    # a new file with the permissions of any other (mkstemp's would be 0600)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w+b") as fh:
            if needed:
                reserve(fh.fileno(), needed, what, path)
            yield fh
            fh.truncate()  # the reserved bytes past the end
            fh.flush()
            os.fsync(fh.fileno())  # on disk before the rename makes it the file
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        full = disk_full_error(err, what, path, needed)
        if full is not None and full is not err:
            raise full from None
        raise
    sync_folder(folder)


def write_file(path: str | os.PathLike[str], data: bytes | str, what: str) -> None:
    """``data`` (``str``: as UTF-8) to ``path`` through :func:`atomic_output`, its bytes
    reserved first."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    with atomic_output(path, what, len(raw)) as fh:
        fh.write(raw)


def sync_folder(folder: str | os.PathLike[str]) -> None:
    """Make the renames in ``folder`` durable (where the platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


def _abandoned(p: Path, stale_s: float) -> bool:
    """Whether the untagged entry ``p`` (a file, or a folder and all it holds) has not
    changed for ``stale_s`` seconds."""
    newest = 0.0
    try:
        newest = p.lstat().st_mtime
        if p.is_dir() and not p.is_symlink():
            for root, dirs, files in os.walk(p):
                for f in (*dirs, *files):
                    with contextlib.suppress(OSError):
                        newest = max(newest, os.lstat(os.path.join(root, f)).st_mtime)
    except OSError:
        return False
    return time.time() - newest > stale_s


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
                      what: str, untagged_stale_s: float | None = UNTAGGED_STALE_S) -> int:
    """Remove the entries of ``folder`` matching the glob ``patterns`` whose writer (the
    :func:`writer_tag` in their name) is gone from this host, and those with no tag
    unchanged for ``untagged_stale_s`` seconds (``None``: kept); log what was freed.
    Returns the bytes freed."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    freed, count = 0, 0
    for pattern in patterns:
        for p in folder.glob(pattern):
            alive = writer_alive(p.name)
            if alive is None and _TAG.search(p.name) is None and untagged_stale_s is not None:
                alive = not _abandoned(p, untagged_stale_s)  # an older ngra's: by its age
            if alive is not False:
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
