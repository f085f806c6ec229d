"""Training end to end: accuracy parity on Planetoid, the CLI, checkpoint/resume."""

from __future__ import annotations

import json
import re

import pytest
import torch

from ngra.cli import main
from ngra.models import MODELS
from ngra.training import TrainConfig
from ngra.training.run import train


@pytest.mark.parametrize(
    "model, dataset, floor",
    # 200 epochs each (over 20 s): slow; test_gcn_learns_cora_quickly is the default run's
    [("gcn", "cora", 0.79), ("gat", "cora", 0.80), ("gcn", "citeseer", 0.68)],
)
@pytest.mark.slow
def test_accuracy_parity(shared_data, model, dataset, floor):
    s = train(TrainConfig(model=model, dataset=dataset, epochs=200, seed=0,
                          data_root=str(shared_data), progress=False))
    assert s["test_acc"] >= floor, s["test_acc"]


def test_gcn_learns_cora_quickly(shared_data):
    """60 of the paper's 200 epochs already reach most of its accuracy (0.815)."""
    s = train(TrainConfig(model="gcn", dataset="cora", epochs=60, seed=0,
                          data_root=str(shared_data), progress=False))
    assert s["test_acc"] >= 0.75, s["test_acc"]


def test_storage_is_checked_before_loading():
    with pytest.raises(ValueError, match="--storage must be one of"):
        train(TrainConfig(dataset="nosuchset", storage="ram"))
    with pytest.raises(ValueError, match="with --nprocs each rank"):
        train(TrainConfig(dataset="nosuchset", storage="disk", nprocs=2))


def test_cli_writes_summary(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["train", "--model", "sage", "--dataset", "sbm:nodes=300,blocks=3,feat=16",
               "--epochs", "30", "--out", str(out), "--no-progress"])
    assert rc == 0
    s = json.loads(out.read_text())
    for key in ("test_acc", "val_acc", "epochs", "epoch_time_s", "peak_rss_mb", "config"):
        assert key in s
    assert s["epochs"] == 30 and s["config"]["model"] == "sage" and s["config"]["hidden"] == 64
    assert s["test_acc"] > 0.6  # SBM communities are learnable
    assert "test_acc=" in capsys.readouterr().out


def test_cli_bad_input_is_a_clear_error(capsys):
    assert main(["train", "--dataset", "nosuchset", "--epochs", "1", "--no-progress"]) == 2
    assert "error" in capsys.readouterr().err


def test_resume_is_bit_identical(tmp_path):
    common = dict(model="gcn", dataset="sbm:nodes=200,blocks=3,feat=8", seed=3, progress=False)
    full = train(TrainConfig(epochs=8, **common))
    ck = tmp_path / "ck"
    train(TrainConfig(epochs=4, checkpoint=str(ck), checkpoint_every=2, **common))
    resumed = train(TrainConfig(epochs=8, checkpoint=str(ck), checkpoint_every=2, resume=True, **common))
    assert [h["loss"] for h in resumed["history"]] == [h["loss"] for h in full["history"]]
    assert resumed["test_acc"] == full["test_acc"] and resumed["val_acc"] == full["val_acc"]
    assert not list(ck.glob(".ckpt-*"))  # no temp files left behind


def test_resume_without_checkpoint_fails(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint"):
        train(TrainConfig(epochs=2, dataset="sbm:nodes=100,blocks=2,feat=4",
                          checkpoint=str(tmp_path / "none"), resume=True, progress=False))
    torch.manual_seed(0)


def test_memory_budget_training_matches_whole_graph():
    common = dict(model="gcn", dataset="sbm:nodes=300,blocks=3,feat=8", epochs=3, seed=1,
                  progress=False)
    whole = train(TrainConfig(**common))
    chunked = train(TrainConfig(memory_budget="64KB", explain=True, **common))
    for a, b in zip(whole["history"], chunked["history"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    assert "chunked streaming (memory budget)" in chunked["explain"]
    assert "grid " in chunked["explain"]


def test_reorder_keeps_results_equivalent():
    common = dict(model="sage", dataset="sbm:nodes=300,blocks=3,feat=8", epochs=2, seed=1,
                  progress=False, dropout=0.0)
    base = train(TrainConfig(**common))
    rcm = train(TrainConfig(reorder="rcm", **common))
    assert rcm["history"][0]["loss"] == pytest.approx(base["history"][0]["loss"], rel=1e-5)


def test_budget_too_small_is_a_clear_error(capsys):
    rc = main(["train", "--model", "mpnn", "--dataset", "sbm:nodes=300,blocks=3,feat=8",
               "--epochs", "1", "--memory-budget", "1KB", "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "budget" in err and "smallest" in err.lower()


TINY = "sbm:nodes=60,blocks=2,feat=4"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_hyper_parameter_flag_applies_to_every_model(name):
    given = dict(hidden=12, lr=0.02, weight_decay=0.0, dropout=0.1,
                 heads=3 if name == "gat" else None,
                 attention_dropout=0.2 if name == "gat" else None)
    cfg = TrainConfig(model=name, **given)
    resolved = cfg.resolved()
    assert {k: resolved[k] for k in given} == given
    assert all(h is None or h.source == "given" for h in cfg.hyper_parameters().values())
    defaults = TrainConfig(model=name).hyper_parameters()
    assert defaults["hidden"].value == MODELS[name].defaults.hidden.value
    assert defaults["hidden"].source == MODELS[name].defaults.hidden.source != "given"


@pytest.mark.parametrize("argv, message", [
    (["--model", "gcn", "--heads", "4"], r"gcn has no heads setting .*--heads.* its settings are "
                                         r"hidden, lr, weight_decay, dropout"),
    (["--model", "gcn", "--hidden", "0"], r"hidden must be a positive integer; got 0"),
    (["--model", "gat", "--heads", "-2"], r"heads must be a positive integer; got -2"),
    (["--model", "sage", "--dropout", "1"], r"dropout must be a probability in \[0, 1\)"),
    (["--model", "gin", "--lr", "0"], r"lr must be a positive number; got 0.0"),
    (["--model", "rgcn", "--weight-decay=-1e-4"], r"weight_decay must be a number >= 0"),
])
def test_hyper_parameters_a_model_cannot_use_are_errors(capsys, argv, message):
    assert main(["train", "--dataset", TINY, "--epochs", "1", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


def test_explain_refuses_them_too(capsys):
    assert main(["explain", "--model", "ggcn", "--dataset", TINY, "--heads", "2"]) == 2
    assert "ggcn has no heads setting" in capsys.readouterr().err


def test_run_prints_its_hyper_parameters_first_and_records_their_sources(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["train", "--model", "gcn", "--dataset", TINY, "--epochs", "1", "--lr", "0.02",
                 "--no-progress", "--out", str(out)]) == 0
    first, given, source = capsys.readouterr().out.splitlines()[:3]
    assert first == (f"ngra train gcn on {TINY}: hidden=16 lr=0.02 weight_decay=0.0005 "
                     "dropout=0.5 num_layers=2 epochs=1 seed=0")
    assert given == "  given: lr"
    assert source.startswith("  model default: hidden, dropout from Kipf & Welling 2017")
    s = json.loads(out.read_text())
    assert s["config"]["heads"] is None and s["config_sources"]["lr"] == "given"
    assert "heads" not in s["config_sources"]
    assert s["config_sources"]["hidden"] == MODELS["gcn"].defaults.hidden.source
    assert s["dataset_summary"]["reciprocity"] == s["reciprocity"] == 1.0  # SBM is symmetric
def test_runs_report_every_run_and_mean_std(tmp_path, capsys):
    out = tmp_path / "runs.json"
    rc = main(["train", "--model", "gcn", "--dataset", "sbm:nodes=200,blocks=3,feat=8",
               "--epochs", "5", "--seed", "4", "--runs", "3", "--out", str(out),
               "--no-progress"])
    assert rc == 0
    s = json.loads(out.read_text())
    assert s["runs"] == 3 and s["seeds"] == [4, 5, 6]
    accs = [r["test_acc"] for r in s["results"]]
    assert [r["seed"] for r in s["results"]] == [4, 5, 6]
    assert all(len(r["history"]) == 5 for r in s["results"])
    assert s["test_acc_mean"] == pytest.approx(sum(accs) / 3)
    mean = sum(accs) / 3
    assert s["test_acc_std"] == pytest.approx((sum((a - mean) ** 2 for a in accs) / 2) ** 0.5)
    assert "val_acc_std" in s and s["config"]["runs"] == 3
    text = capsys.readouterr().out
    assert "seed 6: test_acc=" in text and "3 runs (seeds 4-6)" in text and "+-" in text
    # the same seed alone gives the same run
    one = train(TrainConfig(model="gcn", dataset="sbm:nodes=200,blocks=3,feat=8", epochs=5,
                            seed=5, progress=False))
    assert one["history"] == s["results"][1]["history"]


def test_patience_stops_on_a_plateau():
    """A learning rate too small to move any weight: validation loss and accuracy stay
    exactly flat, so training stops `patience` epochs after the first."""
    common = dict(model="gcn", dataset="sbm:nodes=200,blocks=3,feat=8", epochs=50,
                  dropout=0.0, lr=1e-30, progress=False)
    s = train(TrainConfig(patience=4, **common))
    assert s["stopped_early"] and s["epochs"] == 5 and len(s["history"]) == 5
    assert len({h["val_loss"] for h in s["history"]}) == 1
    full = train(TrainConfig(**common))
    assert not full["stopped_early"] and full["epochs"] == 50


def test_patience_rule():
    from ngra.training.loop import EarlyStop

    p = EarlyStop(2)
    # first, lower loss alone (improves), a tie of both (does not), worse -> stop
    assert [p.step(a, lo) for a, lo in [(0.5, 1.0), (0.4, 0.9), (0.5, 0.9), (0.45, 0.92)]] == \
        [False, False, False, True]
    assert not EarlyStop(None).step(0.1, 9.0)


def test_patience_resumes_where_it_stopped(tmp_path):
    common = dict(model="gcn", dataset="sbm:nodes=200,blocks=3,feat=8", epochs=30, seed=2,
                  dropout=0.0, lr=1e-30, patience=3, progress=False, checkpoint=str(tmp_path))
    first = train(TrainConfig(**common))
    again = train(TrainConfig(resume=True, **common))
    assert first["epochs"] == again["epochs"] == 4 and again["stopped_early"]


@pytest.mark.parametrize("flags, message", [
    (["--runs", "0"], "runs must be an integer >= 1"),
    (["--patience", "-3"], "patience must be an integer >= 1"),
    (["--attention-dropout", "1"], r"attention_dropout must be a probability in \[0, 1\); "
                                   r"got 1.0"),
    (["--attention-dropout", "-0.1"], r"in \[0, 1\)"),
    (["--model", "gcn", "--attention-dropout", "0.5"],
     r"gcn has no attention_dropout setting .*--attention-dropout"),
])
def test_bad_run_flags_are_clear_errors(flags, message, capsys):
    argv = ["train", "--model", "gat", "--dataset", "sbm:nodes=50,blocks=2,feat=4",
            "--epochs", "1", "--no-progress"]
    assert main(argv + flags) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err


def test_gcn_decays_its_first_layer_only():
    from ngra.models import build_model, param_groups

    gcn = build_model("gcn", 8, 3)
    groups = param_groups("gcn", gcn, 5e-4)
    assert [g["weight_decay"] for g in groups] == [5e-4, 0.0]
    assert [g.get("decay", True) for g in groups] == [True, False]
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in gcn.layers[0].parameters()}
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in gcn.layers[1].parameters()}
    gat = build_model("gat", 8, 3)
    (only,) = param_groups("gat", gat, 5e-4)
    assert len(only["params"]) == len(list(gat.parameters()))


def test_normalize_features_divides_non_negative_rows_by_their_sum(tmp_path):
    from dataclasses import replace

    from ngra.datasets import load
    from ngra.training.data import normalize_features

    ds = load("sbm:nodes=60,blocks=2,feat=5")
    assert normalize_features(ds) is ds  # N(0, 1) features: a row sum is no scale
    x = ds.x.abs()
    x[3] = 0
    out = normalize_features(replace(ds, x=x)).x
    sums = out.sum(1)
    assert torch.equal(out[3], torch.zeros(5))
    torch.testing.assert_close(sums[torch.arange(60) != 3], torch.ones(59))
    # features mapped from disk stay mapped (normalized, they would be a copy in memory)
    import numpy as np

    from ngra.mapped import is_mapped, register_mapped

    np.save(tmp_path / "x.npy", x.numpy())
    mapped = np.load(tmp_path / "x.npy", mmap_mode="c")
    register_mapped(mapped)
    on_disk = replace(ds, x=torch.from_numpy(mapped))
    assert is_mapped(on_disk.x) and normalize_features(on_disk) is on_disk
    assert TrainConfig(model="gcn").resolved()["normalize_features"]
    assert not TrainConfig(model="sage").resolved()["normalize_features"]
    assert not TrainConfig(model="gat", normalize_features=False).resolved()["normalize_features"]
