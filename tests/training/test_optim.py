"""ngra's default optimizer (:mod:`ngra.training.optim`): torch's Adam, step for step and
state for state, without importing ``torch._dynamo`` (that part is checked in a fresh
process by tests/distributed/test_rank_fixed_cost.py)."""

from __future__ import annotations

import pytest
import torch

from ngra.training.optim import Adam


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3, generator=g)),
            torch.nn.Parameter(torch.randn(3, generator=g))]


def _train(opt: torch.optim.Optimizer, params, steps: int) -> None:
    for i in range(steps):
        opt.zero_grad()
        (params[0].pow(3).sum() + (params[1] * (i + 1)).exp().sum()).backward()
        opt.step()


@pytest.mark.parametrize("kw", [{}, {"weight_decay": 5e-4}, {"amsgrad": True},
                                {"maximize": True, "betas": (0.8, 0.9)}])
def test_steps_and_state_equal_torch_adam(kw):
    ours, theirs = _params(0), _params(0)
    a = Adam([{"params": ours[:1]}, {"params": ours[1:], "lr": 0.05}], lr=0.01, **kw)
    b = torch.optim.Adam([{"params": theirs[:1]}, {"params": theirs[1:], "lr": 0.05}],
                         lr=0.01, **kw)
    _train(a, ours, 4)
    _train(b, theirs, 4)
    for p, q in zip(ours, theirs):
        assert torch.equal(p, q)
        for key in b.state[q]:
            assert torch.equal(a.state[p][key], b.state[q][key]), key
    assert isinstance(a, torch.optim.Optimizer)
    assert a.param_groups[1]["lr"] == 0.05 and a.param_groups[0]["weight_decay"] == \
        b.param_groups[0]["weight_decay"]


def test_state_dicts_move_between_it_and_torch_adam_and_resume_alike():
    ours, theirs = _params(1), _params(1)
    a, b = Adam(ours, lr=0.01), torch.optim.Adam(theirs, lr=0.01)
    _train(a, ours, 2)
    _train(b, theirs, 2)
    # each resumes from the other's state and keeps stepping as the other would
    a2, b2 = torch.optim.Adam(ours, lr=0.5), Adam(theirs, lr=0.5)
    a2.load_state_dict(a.state_dict())
    b2.load_state_dict(b.state_dict())
    assert b2.param_groups[0]["lr"] == 0.01
    _train(a2, ours, 2)
    _train(b2, theirs, 2)
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs))


def test_step_hooks_run_and_grad_mode_is_restored():
    params = _params(2)
    opt = Adam(params, lr=0.01)
    seen = []
    opt.register_step_pre_hook(lambda o, args, kw: seen.append(("pre", torch.is_grad_enabled())))
    opt.register_step_post_hook(lambda o, args, kw: seen.append("post"))
    _train(opt, params, 1)
    assert seen == [("pre", True), "post"] and torch.is_grad_enabled()


def test_a_bad_group_is_refused_as_torch_refuses_it():
    p = _params(3)
    with pytest.raises(ValueError, match="some parameters appear in more than one"):
        Adam([{"params": p}, {"params": p[:1]}], lr=0.01)
