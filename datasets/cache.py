"""On-disk cache of built datasets: one ``.npy`` per array plus a small ``meta.json``.

Entries live in ``<cache root>/<name>-<hash>/`` where the cache root is
``$NGRA_CACHE``, else ``<data root>/cache`` (``~/.ngra/cache`` when the data root is
read-only), and the hash covers the canonical spec
string, the cache format version and the size and mtime of the source files, so
a changed input or a new format never returns stale data. Entries are written
into a temporary folder and renamed into place, so readers never see half an
entry and concurrent writers cannot corrupt one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ngra.graph import Graph

from .base import NodeDataset, writable

__all__ = [
    "CACHE_ENV",
    "CACHE_VERSION",
    "cache_key",
    "cache_root",
    "load_cached",
    "save_cached",
    "source_stamp",
]

log = logging.getLogger(__name__)

#: Environment variable overriding the cache folder.
CACHE_ENV = "NGRA_CACHE"
#: Bump when the stored layout or any loader's output changes: old entries are then ignored.
CACHE_VERSION = 2  # 2: edge direction in info, symmetric adds only missing reverses
#: Cache folder used when the data root is read-only and ``NGRA_CACHE`` is unset.
USER_CACHE = "~/.ngra/cache"

_META = "meta.json"


def cache_root(data_root: Path) -> Path:
    """Where cache entries go: ``$NGRA_CACHE``, else ``<data_root>/cache``.

    A data root marked read-only (no write permission bits, like a shared folder
    of raw data) is never written to, even by root: the cache then goes to
    ``~/.ngra/cache``.
    """
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser().resolve()
    preferred = Path(data_root) / "cache"
    if writable(preferred):
        return preferred
    fallback = Path(USER_CACHE).expanduser()
    log.info("data root %s is read-only; caching datasets in %s", data_root, fallback)
    return fallback


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


def save_cached(ds: NodeDataset, directory: Path, spec: str) -> bool:
    """Write ``ds`` to ``directory`` atomically. Returns ``False`` (and logs) if it cannot."""
    directory = Path(directory)
    tmp = directory.parent / f".tmp-{directory.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    g = ds.graph
    arrays: dict[str, torch.Tensor] = {
        "indptr": g.indptr,
        "indices": g.indices,
        "x": ds.x,
        "y": ds.y,
        "train_mask": ds.train_mask,
        "val_mask": ds.val_mask,
        "test_mask": ds.test_mask,
    }
    identity = bool(torch.equal(g.perm, torch.arange(g.num_edges)))
    if not identity:
        arrays["perm"] = g.perm
    if g.edge_weight is not None:
        arrays["edge_weight"] = g.edge_weight
    if ds.edge_type is not None:
        arrays["edge_type"] = ds.edge_type
    meta = {
        "version": CACHE_VERSION,
        "spec": spec,
        "name": ds.name,
        "num_nodes": g.num_nodes,
        "num_classes": ds.num_classes,
        "num_edge_types": ds.num_edge_types,
        "info": {
            k: v
            for k, v in ds.info.items()
            if isinstance(v, (str, int, float, bool)) and k != "cache"
        },
        "arrays": {
            k: {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
            for k, t in arrays.items()
        },
    }
    try:
        tmp.mkdir(parents=True)
        for k, t in arrays.items():
            np.save(tmp / f"{k}.npy", t.contiguous().numpy(), allow_pickle=False)
        (tmp / _META).write_text(json.dumps(meta, indent=1))
        if directory.exists():  # a stale or concurrent entry: replace it
            shutil.rmtree(directory, ignore_errors=True)
        os.rename(tmp, directory)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if directory.is_dir() and (directory / _META).is_file():
            return True  # another process finished the same entry first
        log.warning(
            "could not write dataset cache %s (%s); set NGRA_CACHE to a writable folder",
            directory,
            err,
        )
        return False
    log.info("cached %s in %s", spec, directory)
    return True


def load_cached(directory: Path, spec: str) -> NodeDataset | None:
    """Read an entry written by :func:`save_cached`; ``None`` if absent, stale or unreadable."""
    directory = Path(directory)
    meta_path = directory / _META
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("version") != CACHE_VERSION or meta.get("spec") != spec:
            return None
        arrays = {}
        for k, want in meta["arrays"].items():
            a = np.load(directory / f"{k}.npy", allow_pickle=False)
            if list(a.shape) != want["shape"] or str(a.dtype) != want["dtype"]:
                raise ValueError(f"{k}.npy has shape {a.shape} / dtype {a.dtype}, meta says {want}")
            arrays[k] = torch.from_numpy(a)
        n = int(meta["num_nodes"])
        weight = arrays.get("edge_weight")
        if "perm" in arrays:
            # CSC edge i was original edge perm[i]: rebuild from the original order.
            ei = torch.empty(2, arrays["indices"].numel(), dtype=torch.int64)
            dst = torch.repeat_interleave(torch.arange(n), arrays["indptr"].diff())
            ei[0, arrays["perm"]] = arrays["indices"]
            ei[1, arrays["perm"]] = dst
            w = None
            if weight is not None:
                w = torch.empty_like(weight)
                w[arrays["perm"]] = weight
            graph = Graph.from_edge_index(ei, num_nodes=n, edge_weight=w)
        else:
            graph = Graph.from_csc(
                arrays["indptr"], arrays["indices"], num_nodes=n, edge_weight=weight
            )
        info = dict(meta.get("info", {}))
        info.update(spec=spec, cache="hit", cache_dir=str(directory))
        return NodeDataset(
            name=meta["name"],
            graph=graph,
            x=arrays["x"],
            y=arrays["y"],
            train_mask=arrays["train_mask"],
            val_mask=arrays["val_mask"],
            test_mask=arrays["test_mask"],
            num_classes=int(meta["num_classes"]),
            edge_type=arrays.get("edge_type"),
            num_edge_types=int(meta["num_edge_types"]),
            info=info,
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        log.warning("ignoring unreadable dataset cache %s (%s); rebuilding", directory, err)
        return None
