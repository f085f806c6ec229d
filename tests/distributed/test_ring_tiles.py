"""The ring's tiles of one rank (``build_ring``): exact, lean, no process group needed."""

from __future__ import annotations

import torch

from ngra.distributed.halo import Traffic
from ngra.distributed.ring import build_ring


def _rank_csc(seed: int, bounds: list[int], rank: int, edges: int):
    """A random local CSC of ``rank``: owned destinations, sources anywhere (owned rows
    first, then halo rows), with the global (src, dst) of every local edge."""
    g = torch.Generator().manual_seed(seed)
    lo, hi, n = bounds[rank], bounds[rank + 1], bounds[-1]
    dst = torch.randint(lo, hi, (edges,), generator=g).sort().values
    src = torch.randint(0, n, (edges,), generator=g)
    src[:3] = torch.tensor([lo, n - 1, 0])[: min(3, edges)]  # an owned row, the ends
    halo = torch.unique(src[(src < lo) | (src >= hi)])
    local_of = {int(v): hi - lo + i for i, v in enumerate(halo.tolist())}
    local_src = torch.tensor([s - lo if lo <= s < hi else local_of[s] for s in src.tolist()],
                             dtype=torch.int32)
    counts = torch.bincount(dst - lo, minlength=hi - lo)
    indptr = torch.zeros(hi - lo + 1, dtype=torch.int32)
    indptr[1:] = counts.cumsum(0)
    return indptr, local_src, halo, src, dst


def test_ring_tiles_hold_each_edge_once_by_source_owner():
    bounds = [0, 7, 7, 20, 31]  # rank 1 owns nothing
    for rank in (0, 2, 3):
        indptr, local_src, halo, src, dst = _rank_csc(rank, bounds, rank, 60)
        ring = build_ring(rank, 4, bounds[rank + 1] - bounds[rank], indptr, local_src, halo,
                          torch.tensor(bounds), None, Traffic())
        seen = torch.zeros(src.numel(), dtype=torch.int64)
        for j, v in enumerate(ring.views):
            for t in (v.indptr, v.src_idx, v.edge_ids, *v.rev):
                assert t.dtype == torch.int32  # 32-bit tiles: ids, positions, reverse
            pos = v.edge_ids.long()
            seen[pos] += 1
            tile_dst = torch.repeat_interleave(torch.arange(v.dst_hi - v.dst_lo),
                                               torch.diff(v.indptr.long()))
            assert torch.equal(tile_dst + bounds[rank], dst[pos])  # CSC order kept
            assert torch.equal(v.src_idx.long() + bounds[j], src[pos])  # row in j's chunk
            rev_ip, rev_ix, rev_perm = (t.long() for t in v.rev)
            assert torch.equal(torch.diff(rev_ip), torch.bincount(
                v.src_idx.long(), minlength=bounds[j + 1] - bounds[j]))
            assert torch.equal(rev_ix, tile_dst[rev_perm])
        assert torch.equal(seen, torch.ones_like(seen))  # every local edge exactly once
        assert ring.chunk_rows == [7, 0, 13, 11]
