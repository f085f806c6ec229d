"""Caps: repeats shrink to a time budget, memory and other failures become recorded rows."""

from __future__ import annotations

import pytest
import torch

import ngra
from ngra.characterize import measure, runner
from ngra.characterize.measure import RunResult, run_workload
from ngra.characterize.report import result_rows
from ngra.characterize.runner import CharacterizeConfig, execute_run
from ngra.characterize.workloads import prepare_workload


class _DS:
    name, num_classes, edge_type, num_edge_types = "tiny", 3, None, 1

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(2)
        ei = torch.randint(0, 30, (2, 120), generator=gen)
        self.graph = ngra.Graph.from_edge_index(ei, num_nodes=30)
        self.x = torch.randn(30, 6, generator=gen)
        self.y = torch.randint(0, 3, (30,), generator=gen)
        self.train_mask = torch.ones(30, dtype=torch.bool)


def test_repeats_shrink_to_the_budget():
    w = prepare_workload(_DS(), "gcn", hidden=8)
    r = run_workload("ngra", w, "inference", repeats=50, warmup=5, budget_s=1e-6)
    assert r.status == "ok" and r.repeats == 1 and r.warmup == 1
    assert any("repeats cut" in n for n in r.notes)
    r = run_workload("ngra", w, "inference", repeats=2, warmup=1, plain=False)
    assert r.repeats == 2 and r.plain_s != r.plain_s  # NaN: no plain iterations


def test_out_of_memory_and_errors_are_recorded(monkeypatch):
    cfg = CharacterizeConfig(memory_cap_gb=2.0)

    def oom(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate")

    monkeypatch.setattr(measure, "run_workload", oom)
    r = execute_run("pyg", _DS(), "tiny", "gat", "training", cfg)
    assert (r.status, r.reason) == ("skipped", "out of memory (needs more than the 2 GB cap)")

    def broken(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(measure, "run_workload", broken)
    r = execute_run("pyg", _DS(), "tiny", "gat", "training", cfg)
    assert r.status == "failed" and "KeyError" in r.reason
    rows = result_rows([r])
    assert len(rows) == 1 and rows[0]["stage"] == "-" and "KeyError" in rows[0]["notes"]


def test_missing_dataset_is_a_skip_not_a_crash(tmp_path):
    cfg = CharacterizeConfig(models=["gcn"], datasets=["edgelist:/nonexistent/graph.txt"],
                             frameworks=["ngra"], out=str(tmp_path), isolate=False,
                             progress=False, data_root=str(tmp_path))
    results = runner.run_grid(cfg)
    assert [r.status for r in results] == ["skipped"]
    assert "unavailable" in results[0].reason


def test_config_is_checked():
    with pytest.raises(ValueError, match="unknown framework"):
        CharacterizeConfig(frameworks=["tf"]).check()
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        CharacterizeConfig(repeats=0).check()
    assert isinstance(RunResult("a", "b", "c", "inference").remainder_s, float)


def test_rounds_take_turns_and_report_each_runs_median_round(tmp_path, monkeypatch):
    """Round r runs every framework's group before round r + 1 starts; a run reports the
    round with its median time and keeps every round's totals."""
    order, times = [], iter([5.0, 1.0, 3.0, 9.0, 7.0, 8.0])

    def fake(framework, spec, runs, cfg, bar):
        order.append(framework)
        t = next(times)
        return [RunResult(framework, m, spec, mode, plain_s=t, total_s=t, totals=[t])
                for m, mode in runs]

    monkeypatch.setattr(runner, "_group_inprocess", fake)
    cfg = CharacterizeConfig(models=["gcn"], frameworks=["ngra", "dgl"], out=str(tmp_path),
                             isolate=False, progress=False, rounds=3)
    results = runner.run_grid(cfg)
    assert order == ["ngra", "dgl"] * 3
    got = {r.framework: r for r in results}
    assert got["ngra"].plain_s == 5.0 and sorted(got["ngra"].totals) == [3.0, 5.0, 7.0]
    assert got["dgl"].plain_s == 8.0 and "median of 3 of 3 rounds" in got["dgl"].notes[-1]


def test_median_round_skips_failed_rounds():
    ok = [RunResult("ngra", "gcn", "d", "inference", plain_s=t) for t in (4.0, 2.0)]
    bad = RunResult("ngra", "gcn", "d", "inference", status="failed", reason="x")
    assert runner.median_round([bad, *ok]).plain_s == 2.0  # lower median of the ok rounds
    assert runner.median_round([bad, bad]).status == "failed"
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        CharacterizeConfig(rounds=0).check()
