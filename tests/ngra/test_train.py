"""Training end to end: accuracy parity on Planetoid, the CLI, checkpoint/resume."""

from __future__ import annotations

import json

import pytest
import torch

from ngra.cli import main
from ngra.train import TrainConfig, train


@pytest.mark.parametrize(
    "model, dataset, floor",
    [("gcn", "cora", 0.79), ("gat", "cora", 0.80), ("gcn", "citeseer", 0.68)],
)
def test_accuracy_parity(shared_data, model, dataset, floor):
    s = train(TrainConfig(model=model, dataset=dataset, epochs=200, seed=0,
                          data_root=str(shared_data), progress=False))
    assert s["test_acc"] >= floor, s["test_acc"]


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
