"""Rank jobs of the stale-halo checkpoint test (importable by spawned ranks)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch.distributed as dist


def train_or_copy(jobs: list) -> list | None:
    """Each job on every rank in turn: ``(cfg, shard folder)`` runs ``run_rank`` (rank 0's
    summary kept), ``("copy", src, dst)`` copies a checkpoint folder on rank 0 (the ranks
    wait for it). Returns rank 0's summaries (``None`` for a copy)."""
    from ngra.training.ranks import run_rank

    out = []
    for job in jobs:
        if job[0] == "copy":
            if dist.get_rank() == 0:
                shutil.copytree(job[1], job[2])
            dist.barrier()
            out.append(None)
            continue
        cfg, folder = job
        summary, _ = run_rank(cfg, Path(folder))
        out.append(summary)
    return out if dist.get_rank() == 0 else None
