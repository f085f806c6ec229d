"""Helpers shared by the reference kernels."""

from __future__ import annotations

import torch


def dst_ids(indptr: torch.Tensor) -> torch.Tensor:
    """``[E]`` int64 segment (destination) id of every edge of a CSC ``indptr``."""
    # The one-argument form repeats arange(len(counts)); on CPU it is ~100x faster
    # than repeat_interleave(arange, counts, output_size=...) in torch 2.13.
    return torch.repeat_interleave((indptr[1:] - indptr[:-1]).long())


def scatter_extreme(
    seg: torch.Tensor, msg: torch.Tensor, num_seg: int, reduce: str, edge_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment max/min of ``msg`` [E, *F] and the id of the first edge reaching it.

    Empty segments give 0 and id -1. Among tied edges the smallest position
    ``k`` (in ``msg``'s row order) wins; ``edge_ids[k]`` is reported.
    """
    idx = seg.view(-1, *([1] * (msg.dim() - 1))).expand_as(msg)
    out = msg.new_zeros((num_seg,) + msg.shape[1:])
    out.scatter_reduce_(0, idx, msg, "amax" if reduce == "max" else "amin", include_self=False)
    num_edges = msg.shape[0]
    pos = torch.arange(num_edges, device=msg.device).view(-1, *([1] * (msg.dim() - 1)))
    pos = pos.expand_as(msg)
    hit = msg == out.index_select(0, seg)
    cand = torch.where(hit, pos, torch.full_like(pos, num_edges))
    first = torch.full(out.shape, num_edges, dtype=torch.int64, device=msg.device)
    first.scatter_reduce_(0, idx, cand, "amin", include_self=True)
    empty = first == num_edges
    arg = edge_ids[first.clamp(max=max(num_edges - 1, 0))] if num_edges else first
    arg = torch.where(empty, torch.full_like(arg, -1), arg)
    return out, arg
