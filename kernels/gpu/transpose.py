"""CUDA CSC -> CSR transpose: a stable sort by source, one block of edges at a time.

The reference's formulation (one ``argsort`` of all ``E`` sources, a destination id per
edge, a gather) holds three ``int64 [E]`` arrays at once on the device, plus the sort's
own key/value buffers: about 30 bytes an edge, 500 MB at R-MAT 2^20's 17M edges, made
during a training step's first backward, on top of its activations. Here the CSC edges
are taken in blocks of :data:`CHUNK_EDGES` positions, in order: each block is sorted by
source (stable), and its edges go to their source's next free slots of the CSR
(``cursor``, advanced by the block's per-source counts). A source's edges therefore
keep CSC order, within a block by the stable sort and across blocks by the block order,
so the result equals the reference's, while the scratch is a few arrays of one block's
size and three of ``num_src`` int64 (about 100 MB at 2^21 edges a block).
"""

from __future__ import annotations

import torch

from ngra.idtype import offsets_dtype
from ngra.kernels.gpu.util import require_cuda
from ngra.kernels.registry import register

#: CSC positions sorted at once.
CHUNK_EDGES = 1 << 21


@register("transpose_csc", "gpu")
def transpose_csc(indptr, indices, num_src, with_perm=True):
    """See :func:`ngra.kernels.ref.transpose.transpose_csc` (same contract and result)."""
    require_cuda(indptr, indices)
    dev, num_edges = indices.device, indices.numel()
    offsets = offsets_dtype(num_edges)
    counts = torch.bincount(indices, minlength=num_src)
    rev_indptr = torch.zeros(num_src + 1, dtype=torch.int64, device=dev)
    torch.cumsum(counts, 0, out=rev_indptr[1:])
    del counts
    rev_indices = torch.empty(num_edges, dtype=indices.dtype, device=dev)
    rev_perm = torch.empty(num_edges, dtype=offsets, device=dev) if with_perm else None
    ends = indptr[1:].to(torch.int64)  # destination of position e: the first end past e
    cursor = rev_indptr[:-1].clone()  # each source's next free CSR slot
    for e0 in range(0, num_edges, CHUNK_EDGES):
        keys = indices[e0:e0 + CHUNK_EDGES]
        src, order = torch.sort(keys, stable=True)
        per_src = torch.bincount(keys, minlength=num_src)
        # the i-th sorted edge is number i - first[u] of its source u in this block
        slot = cursor - (torch.cumsum(per_src, 0) - per_src)
        pos = slot.index_select(0, src) + torch.arange(keys.numel(), device=dev)
        del src, slot
        order += e0
        rev_indices[pos] = torch.searchsorted(ends, order, right=True,
                                              out_int32=indices.dtype == torch.int32)
        if rev_perm is not None:
            rev_perm[pos] = order.to(offsets)
        cursor += per_src
        del pos, order, per_src
    return rev_indptr.to(offsets), rev_indices, rev_perm
