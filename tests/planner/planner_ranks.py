"""Rank functions of the planner's execution tests (module level: ranks are spawned).

Every check runs plans on the ranks and compares with one process on the same data:
outputs, and gradients over two SGD steps (so that parameters updated through torch's
tensor-parallel + DDP transform are checked too).
"""

from __future__ import annotations

import torch
from torch import nn

WIDTHS = (16, 32, 32, 8)
ROWS = 16
LR = 0.1
GNN = ("gin", "sbm:nodes=200,blocks=4")


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    a, b, c, d = WIDTHS
    return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, c), nn.Tanh(), nn.Linear(c, d))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1 + step)
    return (torch.randn(ROWS, WIDTHS[0], generator=g), torch.randn(ROWS, WIDTHS[-1], generator=g))


def _max_err(got: dict, want: dict) -> float:
    return max((float((g - want[n]).abs().max()) for n, g in got.items()), default=0.0)


def _mlp_reference() -> list[tuple[torch.Tensor, dict]]:
    from ngra.planner.execute import mse_loss

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = []
    for step in range(2):
        x, y = batch(step)
        opt.zero_grad()
        y_hat = model(x)
        mse_loss(y_hat, y).backward()
        out.append((y_hat.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        opt.step()
    return out


def _check_mlp(record: dict, ref: list) -> dict:
    from ngra.planner import ParallelPlan
    from ngra.planner.execute import Runner

    plan = ParallelPlan.from_json(record)
    runner = Runner(mlp(), plan, optimizer=lambda ps: torch.optim.SGD(ps, lr=LR))
    err_out = err_grad = 0.0
    for step, (ref_out, ref_grads) in enumerate(ref):
        x, y = batch(step)
        out = runner.step(x, y)
        if out is not None:
            err_out = max(err_out, float((out.detach() - runner.rows(ref_out)).abs().max()))
        err_grad = max(err_grad, _max_err(runner.full_grads(), ref_grads))
    return {"plan": plan.label, "out": err_out, "grad": err_grad,
            "params": len(runner.params)}


def _gnn_data() -> tuple:
    from ngra.datasets import load
    from ngra.models import build_model, prepare

    name, spec = GNN
    ds = load(spec)
    graph, edge_data = prepare(name, ds.graph)
    torch.manual_seed(0)
    model = build_model(name, ds.x.shape[1], ds.num_classes, hidden=32, dropout=0.0)
    target = torch.randn(ds.x.shape[0], ds.num_classes, generator=torch.Generator().manual_seed(3))
    return model, graph, ds.x, edge_data, target


def _check_gnn(record: dict) -> dict:
    """A zoo GNN parallelized by apply_plan: every replica runs the whole graph and takes
    the loss of its own rows (the row split a partitioned run makes)."""
    from ngra.planner import ParallelPlan
    from ngra.planner.execute import apply_plan, full_grads, mse_loss, plan_mesh

    model, graph, x, edge_data, target = _gnn_data()
    out = model(graph, x, edge_data)
    mse_loss(out, target).backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    plan = ParallelPlan.from_json(record)
    mesh = plan_mesh(plan)
    model, graph, x, edge_data, target = _gnn_data()
    wrapped = apply_plan(model, plan, mesh)
    params = dict(model.named_parameters())
    replica = mesh["dp"].get_local_rank()
    got = wrapped(graph, x, edge_data)
    mine = got.tensor_split(plan.data)[replica]
    mse_loss(mine, target.tensor_split(plan.data)[replica]).backward()
    return {"plan": plan.label, "out": float((got.detach() - out.detach()).abs().max()),
            "grad": _max_err(full_grads(params), ref), "params": len(params)}


def check_plans(mlp_plans: list[dict], gnn_plans: list[dict]) -> list[dict]:
    """Each plan's largest difference to one process, in order (on every rank)."""
    import torch.distributed as dist

    ref = _mlp_reference()
    results = []
    for record in mlp_plans:
        results.append(_check_mlp(record, ref))
        dist.barrier()
    for record in gnn_plans:
        results.append(_check_gnn(record))
        dist.barrier()
    return results
