"""``ngra train --nprocs K --plan auto|FILE``: the plan the run takes and its record."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ngra.cli import main
from ngra.distributed.link import calibration_path, save_link
from ngra.planner import load_plans
from ngra.planner.train_plans import runs_in_trainer
from ngra.training.run import plan_for
from ngra.training import TrainConfig

from planner_cases import make_link

SPEC = "sbm:nodes=300"


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("NGRA_CACHE", str(tmp_path / "cache"))
    for k in (1, 2):
        save_link(make_link(k), calibration_path("gloo", "cpu", k))
    return TrainConfig(model="gcn", dataset=SPEC, data_root=str(tmp_path), nprocs=2,
                       epochs=2, progress=False, plan="auto")


def _plans_file(cfg, tmp_path, capsys):
    out = tmp_path / "plans.json"
    assert main(["plan", "--model", "gcn", "--dataset", SPEC, "--devices", "2",
                 "--data-root", cfg.data_root, "--out", str(out)]) == 0
    capsys.readouterr()
    return out, load_plans(json.loads(out.read_text()))


def test_auto_takes_the_top_plan_the_trainer_runs(cfg, tmp_path, capsys):
    record = plan_for(cfg)
    assert record["source"] == "auto"
    used = record["used"]
    assert (used["pipeline"], used["micro_batches"], used["recompute"]) == (1, 1, [False])
    assert used["data"] * used["tensor"] == 2
    _, plans = _plans_file(cfg, tmp_path, capsys)
    runnable = [p for p in plans if runs_in_trainer(p)]
    assert used["label"] == runnable[0].label
    assert used["predicted_time_s"] == pytest.approx(runnable[0].predicted_time_s)
    if runs_in_trainer(plans[0]):  # the planner's pick runs as it is
        assert "planner_top" not in record
    else:  # recorded beside the fastest plan that runs
        assert record["planner_top"]["label"] == plans[0].label and "note" in record


def test_a_plans_file_gives_its_plan_or_a_clear_error(cfg, tmp_path, capsys):
    path, plans = _plans_file(cfg, tmp_path, capsys)
    data = json.loads(path.read_text())
    dp = [p for p in data["plans"] if p["tensor"] == 1][:1]
    tp = [p for p in data["plans"] if p["tensor"] == 2][:1]
    assert dp and tp
    for first in (dp, tp):  # data- and tensor-parallel plans run as the file gives them
        path.write_text(json.dumps({"plans": first + dp + tp}))
        record = plan_for(dataclasses.replace(cfg, plan=str(path)))
        assert record["used"]["label"] == first[0]["label"]
    recomputed = json.loads(json.dumps(dp[0]))
    recomputed["stages"][0]["recompute"] = True
    path.write_text(json.dumps({"plans": [recomputed]}))
    with pytest.raises(ValueError, match="Pipeline, micro-batch and recomputation plans run "
                                         "through ngra.planner.Runner"):
        plan_for(dataclasses.replace(cfg, plan=str(path)))


@pytest.mark.slow  # two ranks train (about 20 s on a busy 2-core machine)
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_train_records_the_plan(cfg, tmp_path, capsys):
    out = tmp_path / "summary.json"
    assert main(["train", "--model", "gcn", "--dataset", SPEC, "--data-root", cfg.data_root,
                 "--nprocs", "2", "--epochs", "2", "--no-progress", "--plan", "auto",
                 "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    used = summary["plan"]["used"]
    assert f"dense layers: plan {used['label']}" in capsys.readouterr().out
    assert summary["world_size"] == 2
    assert (summary["dense_layout"]["data"], summary["dense_layout"]["tensor"]) == \
        (used["data"], used["tensor"])
    assert "extra" not in summary["config"] and summary["config"]["plan"] == "auto"


@pytest.mark.parametrize("argv,message", [
    (["--plan", "auto"], "give --nprocs 2 or more"),
    (["--nprocs", "2", "--plan", "nowhere.json"], "expected auto or a plans file"),
])
def test_bad_plan_flags(cfg, capsys, argv, message):
    assert main(["train", "--model", "gcn", "--dataset", SPEC, "--data-root", cfg.data_root,
                 "--epochs", "1", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_reordered_run_reads_the_book_of_the_reordered_graph(cfg, tmp_path):
    plan_for(dataclasses.replace(cfg, reorder="degree"))
    assert list((tmp_path / "cache").rglob("*-degree-metis-k2-*/book.json"))  # the run's key
