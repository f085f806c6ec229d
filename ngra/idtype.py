"""Index dtypes: 32-bit vertex ids and edge offsets wherever they fit, 64-bit past 2**31.

Every index array ngra keeps (a graph's ``indptr`` / ``indices`` / ``perm``, its reverse
CSR, tile index arrays, the dataset cache's structure files) takes the narrowest signed
dtype that holds its largest value: ``int32`` up to ``2**31 - 1``, else ``int64``. Vertex
ids are bounded by ``num_nodes - 1``, edge offsets and edge positions by ``num_edges``.
This module is the one place that rule lives; kernels take either dtype as given (numba
compiles both; plain-torch kernels widen where a torch op insists on int64).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["INT32_MAX", "idtype_for", "ids_dtype", "np_idtype", "offsets_dtype", "narrow"]

#: The largest value an int32 index holds.
INT32_MAX = 2**31 - 1


def idtype_for(max_value: int) -> torch.dtype:
    """``torch.int32`` when ``max_value`` fits in 31 bits, else ``torch.int64``."""
    return torch.int32 if int(max_value) <= INT32_MAX else torch.int64


def ids_dtype(num_nodes: int) -> torch.dtype:
    """The dtype of vertex ids of a graph with ``num_nodes`` vertices."""
    return idtype_for(max(int(num_nodes) - 1, 0))


def offsets_dtype(num_edges: int) -> torch.dtype:
    """The dtype of edge offsets (``indptr``) and edge positions of ``num_edges`` edges."""
    return idtype_for(num_edges)


def np_idtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of an index ``torch.dtype``."""
    return np.dtype(np.int32) if dtype == torch.int32 else np.dtype(np.int64)


def narrow(t: torch.Tensor, max_value: int) -> torch.Tensor:
    """``t`` in :func:`idtype_for(max_value) <idtype_for>` (no copy when it already is)."""
    want = idtype_for(max_value)
    return t if t.dtype == want else t.to(want)
