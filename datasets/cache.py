"""On-disk cache of built datasets: one ``.npy`` per array plus a small ``meta.json``.

Entries live in ``<cache root>/<name>-<hash>/`` where the cache root is
``$NGRA_CACHE``, else ``<data root>/cache`` (``~/.ngra/cache`` when the data root is
read-only), and the hash covers the canonical spec
string, the cache format version and the size and mtime (ns) of the source files
(an edge list's, and its ``features=``/``labels=``/``split=`` files), so a changed
input or a new format never returns stale data. Entries are written
into a temporary folder and renamed into place, so readers never see half an
entry and concurrent writers cannot corrupt one.

Disk space: every array's bytes are reserved before they are written (mapped ones
included: :func:`ngra.diskspace.reserve`), so a full disk is an
:class:`~ngra.errors.DiskFullError` naming the array, the bytes and the folder, never a
``SIGBUS``; the partial folder is removed and an existing entry is untouched. The
temporary folder's name carries its writer's host and pid
(``.tmp-<entry>-@host~pid@<random>``): a new writer removes those of writers that are
gone (killed) and logs the space freed.

``meta.json`` keeps the dataset's ``info`` values that are strings, numbers or lists
of strings (``synthesized``), so a cache hit reports the same provenance.

Layout: ``indptr`` / ``indices`` (/ ``perm``) in the graph's own narrow dtypes
(:mod:`ngra.idtype`: int32 while they fit), ``x``, ``y``, the masks, and optional
``edge_weight`` / ``edge_type``. Builders of large graphs write their arrays straight
into the entry, chunk by chunk (:class:`EntryWriter`), so no second copy is made.

Integrity: ``meta.json`` records every array's shape, dtype and a CRC-32 per 64 MiB
block. An entry is verified against them (a full read) the first time it is opened
after being written or modified; the verified state is stamped with each file's
size, mtime and inode (``verified.json``), so later opens only ``stat`` the files. A
truncated, overwritten or half-written file fails that check: :func:`load_cached`
raises :class:`CacheError` naming the file and what is wrong, and
:func:`ngra.datasets.load` logs it, deletes the entry and rebuilds it. Damaged data
is never returned.

Opening with ``mmap=True`` maps the arrays instead of reading them (the on-disk store
of :mod:`ngra.datasets.store`); ``mmap=False`` reads them into memory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ngra.diskspace import collect_leftovers, disk_full_error, reserve, writer_tag
from ngra.graph import Graph
from ngra.mapped import register_mapped, release_mapped
from ngra.settings import get

from .base import NodeDataset, writable
from .base import data_root as resolve_data_root

__all__ = [
    "CACHE_ENV",
    "CACHE_VERSION",
    "CacheError",
    "EntryWriter",
    "book_folder",
    "cache_key",
    "cache_root",
    "load_cached",
    "remove_entry",
    "save_cached",
    "source_stamp",
]

log = logging.getLogger(__name__)

#: Environment variable overriding the cache folder.
CACHE_ENV = "NGRA_CACHE"
#: Bump when the stored layout or any loader's output changes: old entries are then ignored.
CACHE_VERSION = 4  # 2: edge direction in info, symmetric adds only missing reverses;
#   3: narrow structure arrays, CRC-32 per block; 4: info["synthesized"] (a list of str)
#: Cache folder used when the data root is read-only and ``NGRA_CACHE`` is unset.
USER_CACHE = "~/.ngra/cache"
#: Bytes covered by one CRC-32 of an array's data.
CHECK_BLOCK = 64 << 20

_META = "meta.json"
_VERIFIED = "verified.json"
_GRAPH_ARRAYS = ("indptr", "indices", "perm", "edge_weight")


class CacheError(RuntimeError):
    """A cache entry is damaged: a file is missing, truncated or does not match its checksum."""


def cache_root(data_root: Path) -> Path:
    """Where cache entries go: ``$NGRA_CACHE``, else ``<data_root>/cache``.

    A data root marked read-only (no write permission bits, like a shared folder
    of raw data) is never written to, even by root: the cache then goes to
    ``~/.ngra/cache``.
    """
    env = get(CACHE_ENV)
    if env:
        return Path(env).expanduser().resolve()
    preferred = Path(data_root) / "cache"
    if writable(preferred):
        return preferred
    fallback = Path(USER_CACHE).expanduser()
    log.info("data root %s is read-only; caching datasets in %s", data_root, fallback)
    return fallback


def book_folder(spec: str, parts: int, *, method: str, reorder: str, seed: int,
                data_root: str | os.PathLike[str] | None) -> Path:
    """Where the cached partition book of dataset ``spec`` in ``parts`` parts lives
    (made with ``method`` and METIS ``seed``, on the dataset relabeled by ``reorder``):
    ``<cache root>/partitions/<key>``."""
    name = f"{cache_key(spec)}-{reorder}-{method}-k{parts}-s{seed}"
    return cache_root(resolve_data_root(data_root)) / "partitions" / name


def source_stamp(paths: list[Path]) -> list[list[Any]]:
    """``[path, size, mtime_ns]`` of each file (``[path, None, None]`` if missing)."""
    out = []
    for p in paths:
        try:
            st = Path(p).stat()
            out.append([str(p), st.st_size, st.st_mtime_ns])
        except OSError:
            out.append([str(p), None, None])
    return out


def cache_key(spec: str, stamp: list[list[Any]] | None = None) -> str:
    """Folder name for a canonical spec: ``<dataset name>-<16 hex digits>``."""
    blob = json.dumps([CACHE_VERSION, spec, stamp or []], sort_keys=True).encode()
    name = "".join(ch if ch.isalnum() else "_" for ch in spec.split(":", 1)[0])[:32]
    return f"{name}-{hashlib.sha256(blob).hexdigest()[:16]}"


# ------------------------------------------------------------------------- writing
class EntryWriter:
    """A cache entry being built in a temporary folder next to its final place.

    Builders of large graphs ask for arrays with :meth:`array` (``.npy`` files mapped
    into memory) and fill them chunk by chunk; :func:`save_cached` then writes only the
    arrays that are not in the folder yet, checksums everything and renames the folder
    into place. :meth:`discard` removes the folder (also when building fails).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        collect_leftovers(self.directory.parent, [".tmp-*"], "partial cache folders")
        self.tmp = self.directory.parent / (
            f".tmp-{self.directory.name}-{writer_tag()}{uuid.uuid4().hex[:8]}")
        self.tmp.mkdir(parents=True)
        self._arrays: dict[str, np.memmap] = {}

    def array(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.memmap:
        """A new ``name.npy`` of ``shape`` / ``dtype`` in the entry, mapped for writing;
        its bytes are reserved on disk first (:class:`~ngra.errors.DiskFullError` when
        they do not fit)."""
        path = self.tmp / f"{name}.npy"
        a = np.lib.format.open_memmap(path, mode="w+", dtype=np.dtype(dtype),
                                      shape=tuple(int(s) for s in shape))
        fd = os.open(path, os.O_RDWR)
        try:
            reserve(fd, os.fstat(fd).st_size,
                    f"array {name!r} {tuple(a.shape)} {a.dtype} of a dataset cache entry",
                    self.tmp)
        finally:
            os.close(fd)
        register_mapped(a)  # writers drop written blocks' pages (ngra.mapped.release_mapped)
        self._arrays[name] = a
        return a

    def holds(self, name: str, t: torch.Tensor) -> bool:
        """Whether ``t`` is (a tensor over) the entry's own array ``name``."""
        a = self._arrays.get(name)
        return a is not None and a.size == t.numel() and (
            t.numel() == 0 or t.data_ptr() == a.ctypes.data)

    def discard(self) -> None:
        self._arrays.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _dataset_arrays(ds: NodeDataset) -> dict[str, torch.Tensor]:
    g = ds.graph
    arrays: dict[str, torch.Tensor] = {"indptr": g.indptr, "indices": g.indices}
    if g.has_perm:
        arrays["perm"] = g.perm
    if g.weighted:
        arrays["edge_weight"] = g.edge_weight
    arrays.update(x=ds.x, y=ds.y, train_mask=ds.train_mask, val_mask=ds.val_mask,
                  test_mask=ds.test_mask)
    if ds.edge_type is not None:
        arrays["edge_type"] = ds.edge_type
    return arrays


def _block_crcs(a: np.ndarray, progress: Any = None) -> list[int]:
    """CRC-32 of each ``CHECK_BLOCK`` bytes of ``a``'s data (C order)."""
    flat = a.reshape(-1).view(np.uint8) if a.size else np.zeros(0, np.uint8)
    out = []
    for lo in range(0, flat.size, CHECK_BLOCK):
        out.append(zlib.crc32(memoryview(flat[lo:lo + CHECK_BLOCK])))
        _release(a)
        if progress is not None:
            progress.update(min(CHECK_BLOCK, flat.size - lo))
    return out or [zlib.crc32(b"")]


def _release(a: np.ndarray) -> None:
    """Drop the mapped pages of a memory-mapped array from this process (no-op otherwise)."""
    if isinstance(a, np.memmap):
        register_mapped(a)
    release_mapped(a)


def save_cached(ds: NodeDataset, directory: Path, spec: str,
                writer: EntryWriter | None = None) -> bool:
    """Write ``ds`` to ``directory`` atomically. Returns ``False`` (and logs) if it cannot.

    With ``writer`` (the :class:`EntryWriter` the dataset was built into), arrays it
    already holds are kept in place instead of being written again.
    """
    directory = Path(directory)
    arrays = _dataset_arrays(ds)
    try:
        writer = writer or EntryWriter(directory)
    except OSError as err:
        log.warning("could not write dataset cache %s (%s); set NGRA_CACHE to a writable folder",
                    directory, err)
        return False
    tmp = writer.tmp
    meta = {
        "version": CACHE_VERSION,
        "spec": spec,
        "name": ds.name,
        "num_nodes": ds.graph.num_nodes,
        "num_classes": ds.num_classes,
        "num_edge_types": ds.num_edge_types,
        "info": {
            k: v
            for k, v in ds.info.items()
            if k != "cache" and (isinstance(v, (str, int, float, bool)) or (
                isinstance(v, list) and all(isinstance(i, str) for i in v)))
        },
        "check_block": CHECK_BLOCK,
        "arrays": {},
    }
    try:
        total = sum(t.numel() * t.element_size() for t in arrays.values())
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"cache {ds.name}",
                  disable=None if total > 1 << 30 else True) as bar:
            for k, t in arrays.items():
                if writer.holds(k, t):
                    a = writer._arrays[k]
                    a.flush()
                else:
                    a = t.detach().contiguous().numpy()
                    _save_npy(tmp / f"{k}.npy", a, f"array {k!r} of a dataset cache entry")
                meta["arrays"][k] = {"shape": list(t.shape),
                                     "dtype": str(t.dtype).replace("torch.", ""),
                                     "crc32": _block_crcs(a, bar)}
        (tmp / _META).write_text(json.dumps(meta, indent=1))
        _write_verified(tmp, meta)
        if directory.exists():  # a stale or concurrent entry: replace it
            shutil.rmtree(directory, ignore_errors=True)
        os.rename(tmp, directory)
    except OSError as err:
        writer.discard()
        if directory.is_dir() and (directory / _META).is_file():
            return True  # another process finished the same entry first
        full = disk_full_error(err, "a dataset cache entry", tmp, None)
        log.warning(
            "could not write dataset cache %s (%s); set NGRA_CACHE to a writable folder",
            directory,
            full if full is not None else err,
        )
        return False
    log.info("cached %s in %s", spec, directory)
    return True


def _save_npy(path: Path, a: np.ndarray, what: str) -> None:
    """``np.save`` with the bytes reserved first (a header is at most 4 KiB here)."""
    with open(path, "w+b") as fh:
        reserve(fh.fileno(), a.nbytes + 4096, what, path.parent)
        np.save(fh, a, allow_pickle=False)
        fh.truncate()


def remove_entry(directory: Path) -> None:
    """Delete a cache entry (a damaged one, before it is rebuilt)."""
    shutil.rmtree(directory, ignore_errors=True)


# ------------------------------------------------------------------------- reading
def _file_stamp(directory: Path, meta: dict) -> dict[str, list[int]]:
    out = {}
    for k in meta["arrays"]:
        st = (directory / f"{k}.npy").stat()
        out[k] = [st.st_size, st.st_mtime_ns, st.st_ino]
    return out


def _write_verified(directory: Path, meta: dict) -> None:
    (directory / _VERIFIED).write_text(json.dumps(_file_stamp(directory, meta)))


def _is_verified(directory: Path, meta: dict) -> bool:
    try:
        return json.loads((directory / _VERIFIED).read_text()) == _file_stamp(directory, meta)
    except (OSError, ValueError):
        return False


def _open_array(directory: Path, name: str, want: dict, mmap: bool) -> np.ndarray:
    path = directory / f"{name}.npy"
    if not path.is_file():
        raise CacheError(f"{path} is missing")
    try:
        a = np.load(path, mmap_mode="c" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:  # numpy reports a short file this way
        raise CacheError(f"{path} is truncated or not a .npy array ({err})") from None
    if list(a.shape) != want["shape"] or str(a.dtype) != want["dtype"]:
        raise CacheError(f"{path} holds shape {list(a.shape)} / dtype {a.dtype}; meta.json "
                         f"says {want['shape']} / {want['dtype']}")
    if mmap:
        register_mapped(a)  # streaming readers drop its pages once read
    return a


def _verify(directory: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    total = sum(a.nbytes for a in arrays.values())
    with tqdm(total=total, unit="B", unit_scale=True, desc=f"verify {directory.name}",
              disable=None if total > 1 << 30 else True) as bar:
        for k, a in arrays.items():
            want = meta["arrays"][k].get("crc32")
            got = _block_crcs(a, bar)
            if want != got:
                bad = next((i for i, (w, g) in enumerate(zip(want or [], got)) if w != g),
                           min(len(want or []), len(got)))
                block = meta.get("check_block", CHECK_BLOCK)
                raise CacheError(f"{directory / (k + '.npy')} does not match its checksum "
                                 f"(bytes {bad * block}-{(bad + 1) * block} of the data differ "
                                 "from what was written)")


def load_cached(directory: Path, spec: str, *, mmap: bool = False) -> NodeDataset | None:
    """Read an entry written by :func:`save_cached`.

    Returns ``None`` when there is no entry for ``spec`` (absent, or of another format
    version or spec). With ``mmap=True`` the arrays are memory-mapped, not read.

    Raises:
        CacheError: the entry is damaged (the message names the file and the problem).
    """
    directory = Path(directory)
    meta_path = directory / _META
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as err:
        raise CacheError(f"{meta_path} is unreadable ({err})") from None
    if (not isinstance(meta, dict) or meta.get("version") != CACHE_VERSION
            or meta.get("spec") != spec):
        return None
    try:
        arrays = {k: _open_array(directory, k, want, mmap) for k, want in meta["arrays"].items()}
        if not _is_verified(directory, meta):
            _verify(directory, arrays, meta)
            _write_verified(directory, meta)
        t = {k: torch.from_numpy(a) for k, a in arrays.items()}
        n = int(meta["num_nodes"])
        graph = Graph.from_csc(t["indptr"], t["indices"], num_nodes=n, validate=False)
        if "perm" in t or "edge_weight" in t:
            graph = Graph(graph.indptr, graph.indices, t.get("perm"), n, t.get("edge_weight"))
        info = dict(meta.get("info", {}))
        info.update(spec=spec, cache="hit", cache_dir=str(directory),
                    storage="disk" if mmap else "memory")
        return NodeDataset(
            name=meta["name"],
            graph=graph,
            x=t["x"],
            y=t["y"],
            train_mask=t["train_mask"],
            val_mask=t["val_mask"],
            test_mask=t["test_mask"],
            num_classes=int(meta["num_classes"]),
            edge_type=t.get("edge_type"),
            num_edge_types=int(meta["num_edge_types"]),
            info=info,
        )
    except (KeyError, TypeError) as err:
        raise CacheError(f"{meta_path} is malformed ({type(err).__name__}: {err})") from None
    except OSError as err:
        raise CacheError(f"{directory} cannot be read ({err})") from None
