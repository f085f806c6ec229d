"""The on-disk graph store: a dataset cache entry opened with ``mmap`` instead of read.

``ngra.datasets.load(spec, storage="disk")`` (``ngra train --storage disk``) returns a
:class:`~ngra.datasets.NodeDataset` whose arrays are memory-mapped views of the cache
entry's ``.npy`` files (numpy ``mmap_mode``): nothing is read until used, and readers
that stream an array block by block drop each block's pages once read
(:func:`ngra.mapped.release_mapped`), so the array never becomes resident. Today the
first layer's input (the features, usually the largest array) streams this way:
``ngra.kernels.dropout_linear`` in training and the compiled ``pre`` stage in
evaluation read it block by block.

``storage="auto"`` picks disk when the entry's arrays would not fit in what the machine
has available (:func:`choose_storage`).

Opening part of a graph (multi-device training): :class:`GraphStore` opens an entry
and hands out memory-mapped slices, so a rank that owns destinations ``[lo, hi)`` maps
only their in-edges (:meth:`GraphStore.in_edges`) and rows (:meth:`GraphStore.rows`);
its resident memory then falls with the number of ranks.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ngra.mapped import register_mapped, release_mapped

__all__ = ["STORAGES", "GraphStore", "InEdges", "choose_storage", "entry_bytes",
           "mapped_tensor"]

log = logging.getLogger(__name__)

STORAGES = ("memory", "disk", "auto")
#: ``storage="auto"`` maps the data when it needs more than this share of available memory.
AUTO_SHARE = 0.5


def mapped_tensor(path: Path) -> torch.Tensor:
    """A ``.npy`` file as a tensor over a private (copy-on-write) memory map."""
    a = np.load(path, mmap_mode="c", allow_pickle=False)
    register_mapped(a)
    return torch.from_numpy(a)


def entry_bytes(directory: Path) -> int:
    """Bytes of a cache entry's arrays (what ``storage="memory"`` would make resident)."""
    meta = json.loads((Path(directory) / "meta.json").read_text())
    return sum(int(np.prod(a["shape"])) * np.dtype(a["dtype"]).itemsize
               for a in meta["arrays"].values())


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def choose_storage(storage: str, data_bytes: int, budget: int | None = None) -> str:
    """``"memory"`` or ``"disk"`` for a dataset of ``data_bytes``.

    ``"auto"`` maps the data (disk) when reading it would take more than
    :data:`AUTO_SHARE` of the memory available now, or when a memory ``budget`` is
    given and the data is larger than it; else it reads it (memory).
    """
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}; got {storage!r}.")
    if storage != "auto":
        return storage
    if budget is not None and data_bytes > budget:
        return "disk"
    return "disk" if data_bytes > AUTO_SHARE * _available_bytes() else "memory"


@dataclass(frozen=True)
class InEdges:
    """The in-edges of destinations ``[dst_lo, dst_hi)``.

    Attributes:
        indptr: ``[D + 1]`` int64 offsets, rebased to start at 0.
        indices: ``[E_part]`` global source ids (a memory-mapped slice of the entry).
        edge_lo: position of the first in-edge in the whole graph's CSC order.
    """

    dst_lo: int
    dst_hi: int
    indptr: torch.Tensor
    indices: torch.Tensor
    edge_lo: int

    @property
    def num_edges(self) -> int:
        return int(self.indices.numel())


class GraphStore:
    """A verified cache entry, memory-mapped: whole arrays or the part a rank owns.

    Open one with :meth:`of` (a dataset loaded with ``storage="disk"``) or
    :meth:`from_entry` (a cache entry folder). Nothing is read until used.

    Example (rank ``r`` of ``k`` owning a contiguous destination range)::

        store = GraphStore.of(load("rmat:scale=20", storage="disk"))
        lo, hi = bounds[r], bounds[r + 1]
        part = store.in_edges(lo, hi)          # CSC of [lo, hi): mapped slices
        x_own = store.rows("x", lo, hi)        # features of the owned rows (a view)
        halo = store.gather("x", needed_ids)   # rows of other vertices, read on demand
    """

    def __init__(self, directory: Path, dataset: Any) -> None:
        self.directory = Path(directory)
        self.dataset = dataset

    @classmethod
    def of(cls, dataset: Any) -> GraphStore:
        """The store of a dataset loaded with ``storage="disk"`` (its cache entry)."""
        if dataset.info.get("storage") != "disk" or "cache_dir" not in dataset.info:
            raise ValueError(f"{dataset.info.get('spec', 'this dataset')}: not mapped from a "
                             "cache entry; load it with storage='disk' (and the cache on).")
        return cls(Path(dataset.info["cache_dir"]), dataset)

    @classmethod
    def from_entry(cls, directory: Path) -> GraphStore:
        """The store of a cache entry folder (verified on first open)."""
        from .cache import load_cached

        meta = json.loads((Path(directory) / "meta.json").read_text())
        ds = load_cached(Path(directory), meta["spec"], mmap=True)
        if ds is None:
            raise ValueError(f"{directory} is not a cache entry of this ngra version.")
        return cls(Path(directory), ds)

    @property
    def num_nodes(self) -> int:
        return self.dataset.graph.num_nodes

    @property
    def num_edges(self) -> int:
        return self.dataset.graph.num_edges

    def in_edges(self, dst_lo: int, dst_hi: int) -> InEdges:
        """The in-edges of destinations ``[dst_lo, dst_hi)`` as mapped slices."""
        n = self.num_nodes
        if not 0 <= dst_lo <= dst_hi <= n:
            raise ValueError(f"destination range [{dst_lo}, {dst_hi}) is not inside [0, {n}).")
        g = self.dataset.graph
        ip = g.indptr[dst_lo:dst_hi + 1].to(torch.int64)
        a, b = int(ip[0]), int(ip[-1])
        return InEdges(dst_lo, dst_hi, ip - a, g.indices[a:b], a)

    def _array(self, name: str) -> torch.Tensor:
        arrays = {"x": self.dataset.x, "y": self.dataset.y,
                  "train_mask": self.dataset.train_mask, "val_mask": self.dataset.val_mask,
                  "test_mask": self.dataset.test_mask}
        if name not in arrays:
            raise KeyError(f"unknown vertex array {name!r}; choose one of {sorted(arrays)}.")
        return arrays[name]

    def rows(self, name: str, lo: int, hi: int) -> torch.Tensor:
        """Rows ``[lo, hi)`` of vertex array ``name`` (``x``, ``y``, a mask): a mapped view."""
        return self._array(name)[lo:hi]

    def gather(self, name: str, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` of vertex array ``name``, read into memory (the mapped pages are
        dropped afterwards)."""
        t = self._array(name)
        out = t.index_select(0, ids.to(torch.int64))
        release_mapped(t)
        return out

    def release(self) -> None:
        """Drop every mapped page of the store's arrays from this process."""
        for t in (self.dataset.x, self.dataset.graph.indices, self.dataset.graph.indptr):
            release_mapped(t)
