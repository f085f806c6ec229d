"""SyncBatchNorm1d on 2 gloo ranks == nn.BatchNorm1d on the concatenated batch: outputs,
input and parameter gradients, running statistics; an empty share; eval mode."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ngra.distributed.batchnorm import SyncBatchNorm1d, batch_stats, sync_batch_norm
from ngra.distributed.launch import launch

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

#: (rows of rank 0, rows of rank 1, trailing shape) per training step: empty shares among them
STEPS = [(5, 7, ()), (0, 6, ()), (3, 0, ()), (4, 2, (3,))]


def _inputs(step: int, a: int, b: int, tail: tuple[int, ...], c: int = 4
            ) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(a + b, c, *tail, generator=g, dtype=torch.float64) * 3 + 5
    return x, torch.randn(x.shape, generator=g, dtype=torch.float64)


def _bn(momentum: float | None) -> nn.BatchNorm1d:
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(4, momentum=momentum).double()
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    return bn


def shares_on_ranks(momentum: float | None) -> list[dict[str, torch.Tensor]]:
    """Rank function: each step's rows ``[lo, hi)`` of this rank through one model with
    its BatchNorm swapped; returns per step the rank's outputs and gradients."""
    rank = dist.get_rank()
    model = nn.Sequential(_bn(momentum))
    assert sync_batch_norm(model) == 1 and isinstance(model[0], SyncBatchNorm1d)
    bn, out = model[0], []
    for step, (a, b, tail) in enumerate(STEPS):
        x, dy = _inputs(step, a, b, tail)
        lo, hi = (0, a) if rank == 0 else (a, a + b)
        mine = x[lo:hi].clone().requires_grad_()
        bn.zero_grad()
        y = model(mine)
        (y * dy[lo:hi]).sum().backward()
        out.append({"y": y.detach(), "dx": mine.grad, "dw": bn.weight.grad.clone(),
                    "db": bn.bias.grad.clone(), "mean": bn.running_mean.clone(),
                    "var": bn.running_var.clone(), "n": bn.num_batches_tracked.clone()})
    model.eval()
    out.append({"eval": model(_inputs(99, 3, 0, ())[0]).detach()})  # running statistics
    if rank == 0:  # eval joins no collective, even on the batch's own statistics
        own = SyncBatchNorm1d(4, track_running_stats=False).double().eval()
        out[-1]["own"] = own(_inputs(99, 3, 0, ())[0]).detach()
    try:
        model.train()(torch.ones(1 - rank, 4, dtype=torch.float64))  # 1 row over the ranks
    except ValueError as exc:
        out.append({"one_row": str(exc)})
    return out


def both_momenta() -> list[list[dict[str, torch.Tensor]]]:
    """Rank function: :func:`shares_on_ranks` with an exponential and a cumulative average."""
    return [shares_on_ranks(m) for m in MOMENTA]


MOMENTA = (0.1, None)


def test_two_shares_normalize_as_the_whole_batch():
    # a collective on one rank alone would fail at the timeout
    for momentum, ranks in zip(MOMENTA, zip(*launch(both_momenta, 2, threads=1,
                                                    timeout_s=60))):
        _check(momentum, ranks)


def _check(momentum: float | None, ranks: tuple[list[dict[str, torch.Tensor]], ...]) -> None:
    bn = _bn(momentum)
    for step, (a, b, tail) in enumerate(STEPS):
        x, dy = _inputs(step, a, b, tail)
        x.requires_grad_()
        bn.zero_grad()
        y = bn(x)
        (y * dy).sum().backward()
        got = [r[step] for r in ranks]
        torch.testing.assert_close(torch.cat([g["y"] for g in got]), y.detach())
        torch.testing.assert_close(torch.cat([g["dx"] for g in got]), x.grad)
        # each rank's parameter gradient is its rows' part: summed, one process's
        torch.testing.assert_close(got[0]["dw"] + got[1]["dw"], bn.weight.grad)
        torch.testing.assert_close(got[0]["db"] + got[1]["db"], bn.bias.grad)
        for g in got:  # every rank holds one process's running statistics
            torch.testing.assert_close(g["mean"], bn.running_mean)
            torch.testing.assert_close(g["var"], bn.running_var)
            assert int(g["n"]) == int(bn.num_batches_tracked)
    bn.eval()
    x = _inputs(99, 3, 0, ())[0]
    want = bn(x)
    for r in ranks:
        torch.testing.assert_close(r[len(STEPS)]["eval"], want)
        assert "more than 1 value per channel" in r[-1]["one_row"]
    torch.testing.assert_close(ranks[0][len(STEPS)]["own"],
                               nn.functional.batch_norm(x, None, None, training=True))


def test_statistics_are_the_batch_s_mean_and_biased_variance():
    """One process (no reduction): float64 sums from centred values, even far from 0."""
    x = torch.randn(50, 3, dtype=torch.float32) * 1e-2 + 1e3
    mean, var, n = batch_stats(x)
    assert n == 50
    torch.testing.assert_close(mean, x.double().mean(0))
    torch.testing.assert_close(var, x.double().var(0, unbiased=False), rtol=1e-4, atol=0)
    mean, var, n = batch_stats(torch.empty(0, 3))
    assert n == 0 and not mean.any() and not var.any()


def test_without_a_process_group_it_is_batch_norm_and_refuses_bad_shapes():
    bn = _bn(0.1)
    sync = SyncBatchNorm1d.of(_bn(0.1))
    x = torch.randn(6, 4, dtype=torch.float64)
    torch.testing.assert_close(sync(x), bn(x))
    assert sync.weight is not bn.weight and sync.state_dict().keys() == bn.state_dict().keys()
    with pytest.raises(ValueError, match=r"got 3 channels"):
        sync(torch.randn(6, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"expects \[rows, C\] or \[rows, C, L\]"):
        sync(torch.randn(6))
