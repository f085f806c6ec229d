"""One JSON schema for every run; ``ngra train --model module:callable`` and ``ngra predict``;
the command line's paper cuts (abbreviations, usage, help)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import ngra
from ngra.cli import main
from ngra.training import FIELDS

SBM = "sbm:nodes=300,blocks=3,feat=16"


def _keys(summary: dict) -> list[str]:
    return list(summary)


@pytest.mark.distributed
def test_every_run_writes_the_same_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("NGRA_CACHE", str(tmp_path / "cache"))
    common = dict(epochs=2, progress=False, data_root=str(tmp_path))
    one = ngra.fit("gcn", SBM, **common).summary
    two = ngra.fit("gcn", SBM, nprocs=2, dist_timeout=120, **common).summary
    disk = ngra.fit("gcn", SBM, storage="disk", **common).summary
    budget = ngra.fit("gat", SBM, memory_budget="256KB", **common).summary
    runs = ngra.fit("gcn", SBM, runs=2, **common).summary
    for s in (one, two, disk, budget, runs):
        assert _keys(s) == list(FIELDS)
        json.dumps(s)
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert one["test_acc"] == pytest.approx(two["test_acc"], abs=1e-9)  # the same fractions
    for key in ("reciprocity", "dataset_summary", "placement", "storage", "device",
                "resident_mb", "disk_read_mb"):
        assert two[key] is not None, key
    assert disk["storage"] == "disk" and budget["config"]["memory_budget"] == "256KB"
    assert runs["results"] is not None and [_keys(r) for r in runs["results"]] == [
        list(FIELDS)] * 2
    assert runs["test_acc"] is None and runs["test_acc_std"] is not None
    assert one["results"] is None and one["test_acc_mean"] == one["test_acc"]


def _ngra(*args: str, env_path: str, cwd) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "PYTHONPATH": env_path}
    return subprocess.run([sys.executable, "-m", "ngra", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd)


@pytest.mark.distributed
def test_cli_trains_and_predicts_a_user_model(user_path, tmp_path):
    ck = tmp_path / "ck"
    p = _ngra("train", "--model", "user_models:build_model", "--dataset", SBM, "--epochs", "3",
              "--hidden", "8", "--nprocs", "2", "--checkpoint", str(ck), "--no-progress",
              "--out", str(tmp_path / "r.json"), env_path=user_path, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "r.json").read_text())
    assert s["model"] == "user_models:build_model" and s["world_size"] == 2
    assert "synthesized, not real" in p.stdout  # the run header says so
    p = _ngra("predict", "--checkpoint", str(ck), "--dataset", SBM, "--out",
              str(tmp_path / "labels.csv"), env_path=user_path, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = (tmp_path / "labels.csv").read_text().splitlines()
    assert rows[0] == "vertex,label" and len(rows) == 301
    p = _ngra("predict", "--checkpoint", str(ck), "--dataset", SBM, "--out",
              str(tmp_path / "emb.npy"), "--embeddings", "conv1", env_path=user_path,
              cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert np.load(tmp_path / "emb.npy").shape == (300, 8)


def test_cli_refuses_a_factory_that_does_not_import(capsys):
    assert main(["train", "--model", "no_such_pkg:build", "--dataset", SBM, "--epochs", "1",
                 "--no-progress"]) == 2
    assert "module 'no_such_pkg' does not import" in capsys.readouterr().err


def test_flags_are_not_abbreviated_and_errors_show_the_subcommand(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--epoch", "5"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: ngra train" in err and "unrecognized arguments: --epoch 5" in err


def test_train_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for flag, words in [("--epochs", "default: 200"), ("--seed", "default: 0"),
                        ("--num-layers", "default: 2"), ("--checkpoint-every", "default: 10"),
                        ("--no-progress", "progress bar"), ("--model", "module:callable")]:
        at = text.index("\n  " + flag)  # the flag's own entry, not the usage line
        block = text[at:at + 400]
        assert words in " ".join(block.split()), flag
