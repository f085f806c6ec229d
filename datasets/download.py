"""Fetching raw files from their public home, with checksums and progress."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import urllib.error
import urllib.request
import uuid
import zipfile
from pathlib import Path, PurePosixPath

from tqdm import tqdm

from ngra.errors import DownloadError

__all__ = ["DownloadError", "fetch", "fetch_folder", "sha256_of"]

log = logging.getLogger(__name__)

_TIMEOUT_S = 30


def sha256_of(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(
    url: str, dest: str | os.PathLike[str], sha256: str | None = None, progress: bool | None = None
) -> Path:
    """Download ``url`` to ``dest`` atomically, verifying ``sha256`` when given.

    The file is streamed to a temporary name next to ``dest`` and renamed only
    once complete and verified, so an interrupted download never leaves a
    truncated file under the final name.

    Raises:
        DownloadError: network failure, HTTP error, or checksum mismatch.
        PermissionError: ``dest``'s folder is not writable.
    """
    dest = Path(dest)
    made_dir = not dest.parent.exists()
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _fetch(url, dest, sha256, progress)
    except BaseException:
        if made_dir and not any(dest.parent.iterdir()):
            dest.parent.rmdir()  # leave no empty folder behind a failed download
        raise


def _fetch(url: str, dest: Path, sha256: str | None, progress: bool | None) -> Path:
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")
    log.info("downloading %s -> %s", url, dest)
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as resp, open(tmp, "wb") as out:
            total = resp.headers.get("Content-Length")
            with tqdm(
                total=int(total) if total else None,
                unit="B",
                unit_scale=True,
                desc=dest.name,
                disable=None if progress is None else not progress,
            ) as bar:
                for block in iter(lambda: resp.read(1 << 16), b""):
                    out.write(block)
                    h.update(block)
                    bar.update(len(block))
    except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
        tmp.unlink(missing_ok=True)
        raise DownloadError(f"could not download {url}: {err}") from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    digest = h.hexdigest()
    if sha256 is not None and digest != sha256:
        tmp.unlink(missing_ok=True)
        raise DownloadError(
            f"checksum mismatch for {url}: expected sha256 {sha256}, got {digest}. "
            "The upstream file changed or the download was corrupted; nothing was saved."
        )
    os.replace(tmp, dest)
    return dest


def fetch_folder(url: str, dest: str | os.PathLike[str], progress: bool | None = None) -> Path:
    """Download the zip archive ``url`` and unpack it as the folder ``dest``, atomically.

    An archive holding one top-level folder (``MUTAG/...``, ``hiv/...``) becomes ``dest``
    itself; otherwise its members go into ``dest``. The archive and the unpacked files
    stay under temporary names beside ``dest`` until complete, so an interrupted or
    failed download leaves neither a partial folder nor the archive.

    Raises:
        DownloadError: network failure, HTTP error, a file that is not a zip archive, or a
            member whose path leaves the archive (``..``, absolute).
    """
    dest = Path(dest)
    tag = uuid.uuid4().hex[:8]
    archive = dest.with_name(f".{dest.name}.{tag}.zip")
    unpacked = dest.with_name(f".{dest.name}.{tag}.part")
    try:
        fetch(url, archive, progress=progress)
        try:
            with zipfile.ZipFile(archive) as z:
                names = [m for m in z.namelist() if not m.endswith("/")]
                for m in names:
                    parts = PurePosixPath(m).parts
                    if PurePosixPath(m).is_absolute() or ".." in parts or not parts:
                        raise DownloadError(f"{url}: archive member {m!r} leaves the archive; "
                                            "nothing was saved.")
                z.extractall(unpacked)
        except zipfile.BadZipFile as err:
            raise DownloadError(f"{url} is not a zip archive ({err}); nothing was saved.") from err
        tops = {PurePosixPath(m).parts[0] for m in names}
        top = unpacked / tops.pop() if len(tops) == 1 else None
        try:
            os.replace(top if top is not None and top.is_dir() else unpacked, dest)
        except OSError:
            if not dest.is_dir():  # else another process unpacked it first: use theirs
                raise
        return dest
    finally:
        archive.unlink(missing_ok=True)
        shutil.rmtree(unpacked, ignore_errors=True)
