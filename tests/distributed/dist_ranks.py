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


def fail_on(rank: int, how: str, stamp: str) -> None:
    """Rank ``rank`` fails at step 5 (raises or kills itself), writing the time to ``stamp``."""
    t = torch.ones(4)
    for step in range(400):
        dist.all_reduce(t)
        if step == 5 and dist.get_rank() == rank:
            with open(stamp, "w") as f:
                f.write(str(time.time()))
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


def train_configs(jobs: list) -> list:
    """``run_rank`` for each ``(cfg, shard folder[, (P, Q)])`` (``(P, Q)``: every layer
    call on a forced ``P x Q`` grid of the rank's local graph); rank 0's summaries."""
    import contextlib
    from pathlib import Path

    from ngra.training.ranks import run_rank
    from ngra.runtime.budget import grid_shape

    out = []
    for cfg, folder, *shape in jobs:
        with grid_shape(*shape[0]) if shape else contextlib.nullcontext():
            summary, _ = run_rank(cfg, Path(folder))
        out.append(summary)
    return out if dist.get_rank() == 0 else None


class UserLayer(__import__("ngra").SagaLayer):
    """A layer that is not in the zoo: max of a gated pair, read on both sides."""

    gather = "max"

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.a = torch.nn.Linear(f_in, f_out)
        self.b = torch.nn.Linear(f_in, f_out)

    def apply_edge(self, edge):
        return torch.relu(self.a(edge.src) + self.b(edge.dst))

    def apply_vertex(self, vertex, acc):
        return acc


class UserNet(torch.nn.Module):
    def __init__(self, f_in: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.l1, self.l2 = UserLayer(f_in, hidden), UserLayer(hidden, classes)

    def forward(self, graph, x, edge_data=None):
        from ngra.kernels import dropout

        h = self.l1(graph, dropout(x, 0.5, self.training))
        return self.l2(graph, dropout(h, 0.5, self.training))


class FieldsLayer(__import__("ngra").SagaLayer):
    """A gather per field (PNA-style): the mean and the max of one message."""

    gather = {"mean": "mean", "max": "max"}

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.a = torch.nn.Linear(f_in, f_out)
        self.out = torch.nn.Linear(2 * f_out, f_out)

    def apply_edge(self, edge):
        m = torch.relu(self.a(edge.src))
        return {"mean": m, "max": m}

    def apply_vertex(self, vertex, acc):
        return self.out(torch.cat([acc["mean"], acc["max"]], -1))


class FieldsNet(UserNet):
    def __init__(self, f_in: int, hidden: int, classes: int) -> None:
        torch.nn.Module.__init__(self)
        self.l1, self.l2 = FieldsLayer(f_in, hidden), FieldsLayer(hidden, classes)


#: the test-only models by name (the rest are the zoo's)
USER_NETS = {"user": UserNet, "fields": FieldsNet}


def user_steps(graph, x, y, mask, steps: int, seed: int, reduce=None, n_train=None,
               row_ids=None, fail_at: int | None = None, classes: int = 7) -> list[float]:
    """Adam steps of UserNet; on ranks, the loss is summed over ranks (``reduce``)."""
    import torch.nn.functional as F

    from ngra.kernels import dropout_rows

    torch.manual_seed(seed)
    net = UserNet(x.shape[1], 16, classes)
    model, sync = net, None
    if reduce is not None:
        from ngra.distributed import GradientSync

        sync = GradientSync(net.parameters())
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        if fail_at is not None and step == fail_at and dist.get_rank() == 1:
            raise RuntimeError(f"a user error on rank 1 at step {step}")
        opt.zero_grad()
        with dropout_rows(row_ids):
            out = model(graph, x)
        if reduce is None:
            loss = F.cross_entropy(out[mask], y[mask])
            value = float(loss.detach())
        else:
            local = F.cross_entropy(out[mask], y[mask], reduction="sum")
            loss = local / n_train
            t = local.detach().clone()
            reduce(t)
            value = float(t) / n_train
        loss.backward()
        if sync is not None:
            sync.finish()
        opt.step()
        losses.append(value)
    return losses


def user_model_on_ranks(folder: str, exchange: str, steps: int, seed: int,
                        fail_at: int | None = None) -> list[float]:
    from ngra.distributed.shards import load_shard

    r, k = dist.get_rank(), dist.get_world_size()
    sh = load_shard(folder, r, k, group=dist.new_group(list(range(k))), exchange=exchange)
    return user_steps(sh.graph, sh.x, sh.y, sh.masks["train"], steps, seed, dist.all_reduce,
                      sh.meta["split_sizes"]["train"], sh.row_ids, fail_at)


def train_and_inspect(jobs: list) -> list:
    """:func:`train_configs`, and for each job this rank's local shape of every Linear its
    plan splits (after the run: what tensor parallelism left on the rank)."""
    from pathlib import Path

    from ngra.distributed import dense
    from ngra.training.ranks import run_rank

    seen: dict[str, tuple[int, ...]] = {}
    real = dense.split_linears

    def spy(model, layout, tp):
        out = real(model, layout, tp)
        for path in layout.configs:
            w = model.get_submodule(path).weight
            seen[path] = tuple((w.to_local() if hasattr(w, "to_local") else w).shape)
        return out

    dense.split_linears = spy
    import ngra.training.ranks as trainer

    trainer.split_linears = spy
    out = []
    try:
        for cfg, folder in jobs:
            seen.clear()
            summary, _ = run_rank(cfg, Path(folder))
            out.append((summary, dict(seen)))
    finally:
        dense.split_linears = trainer.split_linears = real
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, [s for _, s in out])
    return [(summary, [g[i] for g in gathered]) for i, (summary, _) in enumerate(out)] \
        if dist.get_rank() == 0 else None


def overlap_steps(jobs: list, seed: int) -> list:
    """For each ``(model, shard folder)``: one training-mode forward and backward with the
    halo blocking, then overlapped (``model``: a zoo name or one of :data:`USER_NETS`),
    as :func:`model_step` returns them, with each layer's exchange stats; rank 0's list of
    ``{False: blocking, True: overlapped}``, the outputs gathered from every rank."""
    import torch.nn.functional as F

    from ngra.distributed.shards import load_shard
    from ngra.kernels import dropout_rows
    from ngra.models import build_model

    r, k = dist.get_rank(), dist.get_world_size()
    out = []
    for model, folder in jobs:
        both = {}
        # the layer with a gather per field also over the ring (key "ring")
        for overlap in (False, True) + (("ring",) if model == "fields" else ()):
            sh = load_shard(folder, r, k, exchange="ring" if overlap == "ring" else "halo",
                            overlap=overlap is True)
            m = sh.meta
            torch.manual_seed(seed)
            if model in USER_NETS:
                net = USER_NETS[model](m["num_features"], 16, m["num_classes"])
            else:
                net = build_model(model, m["num_features"], m["num_classes"],
                                  num_edge_types=m["num_edge_types"])
            net.train()
            torch.manual_seed(seed + 1)
            with dropout_rows(sh.row_ids):
                logits = net(sh.graph, sh.x, sh.edge_data)
            mask = sh.masks["train"]
            loss = F.cross_entropy(logits[mask], sh.y[mask], reduction="sum")
            loss.backward()
            grads = {n: p.grad.clone() for n, p in net.named_parameters()}
            for g in grads.values():
                dist.all_reduce(g)
            total = loss.detach().clone()
            dist.all_reduce(total)
            rows: list = [None] * k
            dist.all_gather_object(rows, (sh.row_ids, logits.detach()))
            both[overlap] = {"ids": torch.cat([i for i, _ in rows]),
                             "out": torch.cat([o for _, o in rows]), "loss": float(total),
                             "grads": grads, "stats": sh.graph.exchange_stats()}
        out.append(both)
    return out if r == 0 else None


def compressed_steps(folder: str, seed: int) -> dict | None:
    """Two Adam steps of the zoo's GCN with exact, 8-bit (``halo_bits=8``) and stale
    (``staleness=1``) overlapped halos: rank 0's losses (summed over ranks) per variant."""
    import torch.nn.functional as F

    from ngra.distributed.shards import load_shard
    from ngra.kernels import dropout_rows
    from ngra.models import build_model

    r, k = dist.get_rank(), dist.get_world_size()
    out = {}
    for name, kw in (("exact", {}), ("bits8", {"halo_bits": 8}), ("stale", {"staleness": 1})):
        sh = load_shard(folder, r, k, exchange="halo", **kw)
        m = sh.meta
        torch.manual_seed(seed)
        net = build_model("gcn", m["num_features"], m["num_classes"])
        opt = torch.optim.Adam(net.parameters(), lr=0.05)
        net.train()
        losses = []
        for step in range(3):
            opt.zero_grad()
            with dropout_rows(sh.row_ids):
                logits = net(sh.graph, sh.x, sh.edge_data)
            mask = sh.masks["train"]
            loss = F.cross_entropy(logits[mask], sh.y[mask], reduction="sum")
            loss.backward()
            for p in net.parameters():
                dist.all_reduce(p.grad)
            total = loss.detach().clone()
            dist.all_reduce(total)
            losses.append(float(total))
            opt.step()
        out[name] = {"losses": losses, "stats": sh.graph.exchange_stats()}
    return out if r == 0 else None


def overlap_and_compressed(jobs: list, seed: int, folder: str) -> tuple | None:
    """:func:`overlap_steps` and :func:`compressed_steps` in one launch."""
    a = overlap_steps(jobs, seed)
    b = compressed_steps(folder, seed)
    return (a, b) if dist.get_rank() == 0 else None
