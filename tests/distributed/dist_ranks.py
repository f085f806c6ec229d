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


def model_step(folder: str, model: str, exchange: str, seed: int) -> dict:
    """One training-mode forward and backward of zoo ``model`` on this rank's shard: the
    owned output rows (with their original ids), the loss sum and the summed gradients."""
    import torch.nn.functional as F

    from ngra.distributed.shards import load_shard
    from ngra.kernels import dropout_rows
    from ngra.models import build_model

    r, k = dist.get_rank(), dist.get_world_size()
    sh = load_shard(folder, r, k, exchange=exchange)
    torch.manual_seed(seed)
    m = sh.meta
    net = build_model(model, m["num_features"], m["num_classes"],
                      num_edge_types=m["num_edge_types"])
    net.train()
    torch.manual_seed(seed + 1)
    with dropout_rows(sh.row_ids):
        out = net(sh.graph, sh.x, sh.edge_data)
    mask = sh.masks["train"]
    loss = F.cross_entropy(out[mask], sh.y[mask], reduction="sum")
    loss.backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters()}
    for g in grads.values():
        dist.all_reduce(g)
    total = loss.detach().clone()
    dist.all_reduce(total)
    return {"ids": sh.row_ids, "out": out.detach(), "loss": float(total), "grads": grads,
            "choices": sh.graph.choices(), "traffic": dict(sh.graph.traffic.sent)}
