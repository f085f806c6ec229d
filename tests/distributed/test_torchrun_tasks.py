"""Link and graph tasks under torchrun, and synchronized BatchNorm on graph ranks: each
trains as one process does (losses, metrics, weights, running statistics)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import ngra
from killed_rank import kill_a_rank
from ngra.distributed.launch import free_port

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent


def _mutag(shared_data) -> str:
    path = shared_data / "tu" / "MUTAG"
    if not path.is_dir():
        pytest.skip(f"MUTAG not under {shared_data}/tu")
    return f"tu:{path}"


def _torchrun(*args: str, out: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node 2 -m ngra train ... --out out``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(free_port()), "-m", "ngra", "train", *args, "--threads", "1",
           "--no-progress", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def _same_history(got: dict, want: dict, tol: float = 2e-4) -> None:
    assert len(got["history"]) == len(want["history"])
    for hg, hw in zip(got["history"], want["history"]):
        for key in ("loss", "val_loss", "train", "val", "test"):
            if key in hw:
                assert hg[key] == pytest.approx(hw[key], rel=tol, abs=tol, nan_ok=True), \
                    (key, hg, hw)
    assert got["best_epoch"] == want["best_epoch"]
    assert got["test_acc"] == pytest.approx(want["test_acc"], abs=tol)


def _same_weights(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k].to(want[k].dtype), want[k], rtol=1e-3, atol=1e-4,
                                   msg=k)


# --------------------------------------------------------------------------- torchrun
def test_torchrun_trains_graph_classification_as_one_process(shared_data, tmp_path):
    spec = _mutag(shared_data)
    args = ["--task", "graph", "--dataset", spec, "--model", "gin", "--epochs", "2",
            "--batch-size", "64", "--dropout", "0.5"]
    r = _torchrun(*args, out=tmp_path / "r.json")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads((tmp_path / "r.json").read_text())
    assert got["world_size"] == 2 and got["task"] == "graph"
    one = ngra.fit("gin", spec, task="graph", epochs=2, batch_size=64, dropout=0.5, seed=0,
                   threads=1, progress=False)
    _same_history(got, one.summary)


@pytest.mark.slow  # ~25 s quiet: torchrun, shards and a one-process run on Cora
def test_torchrun_trains_link_prediction_as_one_process(shared_data, tmp_path, monkeypatch):
    monkeypatch.setenv("NGRA_CACHE", str(tmp_path / "cache"))  # shards built here, once
    args = ["--task", "link", "--dataset", "cora", "--data-root", str(shared_data),
            "--model", "gcn", "--epochs", "3"]
    r = _torchrun(*args, out=tmp_path / "r.json")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads((tmp_path / "r.json").read_text())
    assert got["world_size"] == 2 and got["task"] == "link"
    assert got["dataset_summary"]["link_split"]  # rank 0's facts about the data
    assert not list((tmp_path / "cache").rglob(".link-*"))  # the pairs are removed
    one = ngra.fit("gcn", "cora", task="link", data_root=str(shared_data), epochs=3, seed=0,
                   threads=1, progress=False)
    _same_history(got, one.summary)
    for k, v in one.summary["metrics"].items():
        assert got["metrics"][k] == pytest.approx(v, abs=2e-4), k


def fails_on_rank_one(num_features: int, num_classes: int) -> nn.Module:
    """A GIN encoder whose rank 1 raises at its third training forward."""

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = ngra.models.GINConv(num_features, num_classes)
            self.calls = 0

        def forward(self, graph, x):
            self.calls += self.training
            if self.calls == 3 and os.environ.get("RANK") == "1":
                raise RuntimeError("a user error on rank 1")
            return self.conv(graph, x)

    return Encoder()


@pytest.mark.slow  # ~25 s: a torchrun run until its rank 1 fails
def test_a_failing_torchrun_rank_is_named(shared_data, tmp_path):
    """The rank's own error, named, ends both ranks (no collective left waiting)."""
    spec = _mutag(shared_data)
    t0 = time.monotonic()
    r = _torchrun("--task", "graph", "--dataset", spec, "--model",
                  "test_torchrun_tasks:fails_on_rank_one", "--epochs", "50", "--batch-size",
                  "64", out=tmp_path / "r.json", timeout=200)
    assert r.returncode != 0 and time.monotonic() - t0 < 150
    assert "ngra train: rank 1 of 2: error: RuntimeError: a user error on rank 1" in r.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow  # a 2-rank run killed mid-training; ~25 s
def test_a_killed_torchrun_rank_ends_the_run(shared_data, tmp_path):
    psutil = pytest.importorskip("psutil")
    spec = _mutag(shared_data)
    ck = tmp_path / "ck"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(free_port()), "-m", "ngra", "train", "--task", "graph",
           "--dataset", spec, "--model", "gin", "--epochs", "100000", "--threads", "1",
           "--no-progress", "--checkpoint", str(ck), "--checkpoint-every", "1"]
    victim, ranks, code, err, took = kill_a_rank(cmd, ck, lambda line: "ngra" in line)
    assert took < 60 and code not in (0, None)
    assert "SIGKILL" in err and str(victim.pid) in err, err[-3000:]  # torchrun names it
    for p in ranks:
        assert not p.is_running() or p.status() == psutil.STATUS_ZOMBIE


# --------------------------------------------------------------------------- BatchNorm
class GINWithNorm(ngra.SagaLayer):
    """PyG's GIN layer: BatchNorm inside the MLP of ``apply_vertex``. The Linears that
    feed a BatchNorm have no bias: BatchNorm takes the mean off, so a bias there has no
    gradient but float noise, which Adam would turn into steps of ``lr`` that differ
    between any two summation orders (one process, two ranks)."""

    gather = "sum"

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(f_in, f_out, bias=False), nn.BatchNorm1d(f_out),
                                 nn.ReLU(), nn.Linear(f_out, f_out, bias=False))

    def apply_edge(self, edge):
        return edge.src

    def apply_vertex(self, vertex, acc):
        return self.mlp(vertex + acc)


def batch_norm_gin(num_features: int, num_classes: int) -> nn.Module:
    """Two GIN layers with BatchNorm in the first one's MLP and between them."""

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = GINWithNorm(num_features, 16)
            self.norm = nn.BatchNorm1d(16, momentum=None)  # a cumulative average
            self.conv2 = ngra.models.GINConv(16, num_classes)

        def forward(self, graph, x):
            return self.conv2(graph, torch.relu(self.norm(self.conv1(graph, x))))

    return Encoder()


def test_batch_norm_on_two_ranks_is_one_process_s(shared_data):
    """MUTAG's 150 training graphs in batches of 149 and 1: the one-graph batch leaves
    rank 0 an empty share, which still joins the statistics' sums."""
    spec = _mutag(shared_data)
    kw = dict(task="graph", epochs=3, batch_size=149, val=0.1, test=0.1, embedding_dim=16,
              seed=0, threads=1, progress=False)
    one = ngra.fit(batch_norm_gin, spec, **kw)
    two = ngra.fit(batch_norm_gin, spec, nprocs=2, **kw)
    _same_history(two.summary, one.summary)
    assert two.summary["world_size"] == 2
    assert "BatchNorm statistics over all ranks" in two.summary["placement"]
    want, got = one.model.state_dict(), two.model.state_dict()
    stats = [k for k in want if "running" in k]
    # the selected weights: two batches an epoch up to the best one
    tracked = float(want["encoder.norm.num_batches_tracked"])
    assert len(stats) == 4 and tracked == 2 * one.summary["best_epoch"], tracked
    _same_weights(got, want)
    # the running statistics moved off their start (zeros and ones)
    assert not torch.allclose(want["encoder.norm.running_var"], torch.ones(16))
