"""Saved activations on disk: training whose vertex arrays outgrow memory.

A GNN's backward needs the activations its forward saved, ``N x F`` arrays that at
R-MAT 2^26 (67M vertices) are 4 GiB each for 16 features. Under :func:`saved_on_disk`
(training enters it when the data is memory-mapped from disk, ``--storage disk``)
every tensor autograd saves that is a vertex-sized array (two or more dimensions, at
least ``min_bytes``; not a weight or other leaf that requires grad, not mapped from disk
already) is written to a
scratch file beside the data when it is saved, and mapped again when backward asks for
it. Once its consumers have run in forward, such an activation holds no memory until
backward; a tensor saved twice (an activation's output, the next layer's input) is
written once.

Writing goes through ``write()`` (the page cache, not this process's RSS). Each unpack
is a private copy-on-write mapping of the file (:func:`ngra.mapped.register_mmap`):
readers that stream it a block of rows at a time drop each block's pages once read
(:func:`ngra.mapped.release_mapped`, as ``ngra.kernels.dropout_linear`` does for its
input), and a backward that writes over its saved tensor (the zoo's output-saving
activations, :func:`is_spilled`) changes neither the file nor any other unpack. The
scratch file is unlinked when made: its disk space goes back when the last unpack and
the autograd graph let it go, or when the process ends.

A tensor changed in place after it was saved is saved as it was when saved (autograd's
own check of that case does not run on packed tensors).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from collections.abc import Iterator

import numpy as np
import torch

from ngra.diskspace import reserve
from ngra.mapped import is_mapped, mapped_file, register_mmap, scratch_file

__all__ = ["saved_on_disk", "is_spilled", "SPILL_MIN_BYTES"]

#: Saved tensors smaller than this stay in memory (a vertex array of a large graph is
#: hundreds of MiB; a weight or a small graph's array is not worth a file).
SPILL_MIN_BYTES = 64 << 20

#: what :func:`ngra.mapped.mapped_file` answers for an unpacked saved tensor
_UNPACKED = "<a saved tensor's spill file, unpacked>"


def is_spilled(t: torch.Tensor) -> bool:
    """Whether ``t`` is a saved tensor mapped back from its spill file for one backward
    (a private copy-on-write mapping: writing it changes no one else's data)."""
    return mapped_file(t) == _UNPACKED


class _Spilled:
    """One saved tensor's scratch file (unlinked; open while this record lives)."""

    def __init__(self, t: torch.Tensor, near: torch.Tensor | None) -> None:
        fd, path = scratch_file(near, ".ngra-saved-")
        os.unlink(path)
        self.file = os.fdopen(fd, "r+b", buffering=0)
        a = t.detach().numpy()
        self.shape, self.dtype, self.nbytes = a.shape, a.dtype, a.nbytes
        reserve(fd, a.nbytes, f"a saved {tuple(a.shape)} activation (spilled to disk)",
                os.path.dirname(path))
        view = memoryview(a.reshape(-1)).cast("B")  # contiguous: no copy
        while view.nbytes:  # a write() may take less than asked (2 GiB at most on Linux)
            view = view[self.file.write(view):]

    def unpack(self) -> torch.Tensor:
        mm = mmap.mmap(self.file.fileno(), self.nbytes, flags=mmap.MAP_PRIVATE,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
        a = np.frombuffer(mm, dtype=self.dtype).reshape(self.shape)
        register_mmap(mm, a, _UNPACKED)
        return torch.from_numpy(a)


def _eligible(t: torch.Tensor, min_bytes: int) -> bool:
    return (t.device.type == "cpu" and t.dim() >= 2 and t.is_contiguous() and t.numel() > 0
            and t.numel() * t.element_size() >= min_bytes
            and not (t.is_leaf and t.requires_grad) and not t.is_sparse
            and t.dtype in (torch.float16, torch.float32, torch.float64)  # numpy's
            and not is_mapped(t) and not is_spilled(t))


@contextlib.contextmanager
def saved_on_disk(near: torch.Tensor | None = None,
                  min_bytes: int = SPILL_MIN_BYTES) -> Iterator[None]:
    """Inside the block, autograd's saved vertex arrays go to scratch files (see the
    module docstring): beside the file ``near`` is mapped from (the dataset's), else in
    the temp folder."""
    seen: dict[tuple, tuple[weakref.ref, int, _Spilled]] = {}

    def pack(t: torch.Tensor):
        if not _eligible(t, min_bytes):
            return t
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        hit = seen.get(key)
        if hit is not None and hit[0]() is not None and hit[1] == t._version:
            return hit[2]  # the same tensor saved again (an output and the next input)
        rec = _Spilled(t, near)
        seen[key] = (weakref.ref(t), t._version, rec)
        return rec

    def unpack(p):
        return p.unpack() if isinstance(p, _Spilled) else p

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
