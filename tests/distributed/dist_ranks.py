"""Rank functions for the launcher tests (module level: ranks are spawned, not forked)."""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist


def rank_and_sum(scale: int) -> tuple[int, int, float]:
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), float(t) * scale


def fail_on(rank: int, how: str) -> None:
    t = torch.ones(4)
    for step in range(400):
        dist.all_reduce(t)
        if step == 5 and dist.get_rank() == rank:
            if how == "raise":
                raise ValueError(f"injected failure on rank {rank}")
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.02)
