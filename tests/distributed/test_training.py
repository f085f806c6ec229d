"""Multi-process training equals one process: the zoo's GCN, GAT and G-GCN on Cora over 2 and
4 gloo ranks, both exchanges, both partition methods; a user-defined layer; faults;
checkpoints across process counts; bad input refused before training."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dist_ranks
from killed_rank import kill_a_rank
from ngra.distributed import DistributedError, launch
from ngra.training.ranks import prepare_shards
from ngra.training import TrainConfig
from ngra.training.run import train

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

MODELS = ("gcn", "gat", "ggcn")
EPOCHS = 5


@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory):
    # datasets and partitions cached in a private folder (the shared data root is read-only)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NGRA_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield str(shared_data)


def _cfg(data, model, **kw):
    kw.setdefault("epochs", EPOCHS)
    return TrainConfig(model=model, dataset="cora", data_root=data, seed=0, progress=False, **kw)


@pytest.fixture(scope="module")
def single(data):
    return {m: train(_cfg(data, m)) for m in MODELS}


def _losses(summary):
    return [h["loss"] for h in summary["history"]]


@pytest.mark.slow  # over 20 s; 2-rank runs against one process stay in the default run
@pytest.mark.parametrize("k", [2, 4])
def test_ranks_train_as_one_process(data, single, k):
    jobs, keys = [], []
    for model in MODELS:
        for method in ("metis", "range"):
            base = _cfg(data, model, nprocs=k, partition_method=method)
            folder = str(prepare_shards(base))
            for exchange in ("halo", "ring"):
                jobs.append((dataclasses.replace(base, exchange=exchange), folder))
                keys.append((model, method, exchange))
    # the memory budget holds within each rank (its local layers fit 4 MB whole: 1 x 1)
    jobs.append((dataclasses.replace(jobs[0][0], memory_budget="4MB", explain=True),
                 jobs[0][1]))
    keys.append(("gcn", "metis", "halo"))
    # and a rank's local graph streams in tiles (a forced 3 x 2 grid) to the same result
    gat = keys.index(("gat", "metis", "halo"))
    jobs.append((*jobs[gat], (3, 2)))
    keys.append(keys[gat])
    jobs.append((dataclasses.replace(jobs[0][0], exchange="auto", explain=True), jobs[0][1]))
    keys.append(("gcn", "metis", "auto"))
    out = launch(dist_ranks.train_configs, k, jobs, threads=1)[0]
    for (model, method, exchange), summary in zip(keys, out):
        one = single[model]
        where = f"{model} {method} {exchange} on {k} ranks"
        torch.testing.assert_close(_losses(summary), _losses(one), rtol=1e-4, atol=1e-5,
                                   msg=where)
        assert abs(summary["test_acc"] - one["test_acc"]) <= 0.01, where
        assert summary["world_size"] == k
        layers = summary["exchange"]
        assert len(layers) == 2 and all(lay["strategy"] in ("halo", "ring", "feature")
                                        for lay in layers)
        if exchange != "auto":
            assert all(lay["strategy"] == exchange and lay["forced"] for lay in layers), where
        sent = summary["bytes_sent_per_epoch"]["per_rank"]
        assert len(sent) == k and all(b.get(exchange if exchange != "auto" else
                                            layers[0]["strategy"], 0) > 0 for b in sent), where
        assert all(b["allreduce"] > 0 for b in sent)
        assert len(summary["peak_rss_mb_per_rank"]) == k
        assert summary["large_frees_released"], where  # a rank's peak bounded over epochs
        assert summary["partition"]["parts"] == k
    budgeted = out[-3]["explain"]
    assert "chunked streaming (memory budget)" in budgeted and "of budget 3.81 MiB" in budgeted
    auto = out[-1]
    assert not any(lay["forced"] for lay in auto["exchange"])
    assert all(lay["predicted_halo_s"] > 0 and lay["predicted_ring_s"] > 0
               for lay in auto["exchange"])
    assert "exchange (rank 0 of 2, between pre and edge)" in auto["explain"] or k != 2
    # GCN exchanges x @ W (16 floats a row), not Cora's 1,433 input features
    assert auto["exchange"][0]["row_bytes"] == 16 * 4


@pytest.mark.slow  # two 2-rank runs, ~40 s; a user model on 2 ranks runs in tests/training
def test_a_user_defined_layer_trains_on_ranks_as_on_one(data):
    from ngra.datasets import load

    ds = load("cora", root=data)
    one = dist_ranks.user_steps(ds.graph, ds.x, ds.y, ds.train_mask, 4, seed=3)
    folder = str(prepare_shards(_cfg(data, "sage", nprocs=2, partition_method="range")))
    for exchange in ("halo", "ring"):
        got = launch(dist_ranks.user_model_on_ranks, 2, folder, exchange, 4, 3, threads=1)[0]
        torch.testing.assert_close(got, one, rtol=1e-4, atol=1e-5, msg=exchange)


def test_a_rank_that_raises_is_named(data):
    folder = str(prepare_shards(_cfg(data, "sage", nprocs=2)))
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match=r"rank 1 of 2 \(pid \d+\) failed: RuntimeError: "
                                               r"a user error on rank 1 at step 2"):
        launch(dist_ranks.user_model_on_ranks, 2, folder, "halo", 6, 0, 2, threads=1)
    assert time.monotonic() - t0 < 120


def test_a_killed_rank_ends_the_run_with_its_name(data, tmp_path):
    psutil = pytest.importorskip("psutil")
    ck = tmp_path / "ck"
    cmd = [sys.executable, "-m", "ngra", "train", "--model", "gcn", "--dataset", "cora",
           "--data-root", data, "--nprocs", "2", "--epochs", "100000", "--no-progress",
           "--checkpoint", str(ck), "--checkpoint-every", "1", "--exchange", "halo"]
    # the ranks: the launcher's spawned workers (their RANK is set after exec, so
    # /proc/<pid>/environ does not show it; the message names the pid)
    victim, ranks, code, err, took = kill_a_rank(cmd, ck, lambda line: "spawn_main" in line,
                                                 env=os.environ.copy())
    assert took < 60
    assert code not in (0, None)
    assert re.search(rf"rank [01] of 2 \(pid {victim.pid}\) was killed by SIGKILL", err), err
    for p in ranks:
        assert not p.is_running() or p.status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("first,then", [(2, 1), (1, 2)])
def test_resume_on_another_number_of_processes(data, tmp_path, first, then):
    ck = str(tmp_path / "ck")
    full = train(_cfg(data, "gcn", epochs=8))
    train(_cfg(data, "gcn", epochs=4, nprocs=first, checkpoint=ck, checkpoint_every=2))
    resumed = train(_cfg(data, "gcn", epochs=8, nprocs=then, checkpoint=ck, checkpoint_every=2,
                         resume=True))
    torch.testing.assert_close(_losses(resumed), _losses(full), rtol=1e-4, atol=1e-5)
    assert abs(resumed["test_acc"] - full["test_acc"]) <= 0.01


def _cli(*args, data):
    return subprocess.run([sys.executable, "-m", "ngra", *args, "--data-root", data],
                          capture_output=True, text=True, env=os.environ.copy())


@pytest.mark.slow  # over 20 s (a process per refusal); tests/training refuses in-process
def test_bad_input_is_refused_before_training(data, tmp_path):
    r = _cli("train", "--dataset", "cora", "--nprocs", "0", data=data)
    assert r.returncode == 2 and "--nprocs must be an int >= 1" in r.stderr
    r = _cli("train", "--dataset", "cora", "--nprocs", "5000", data=data)
    assert r.returncode == 2 and "more processes than cora has vertices (2708)" in r.stderr
    book = tmp_path / "citeseer-book"
    r = _cli("partition", "--dataset", "citeseer", "--parts", "2", "--out", str(book), data=data)
    assert r.returncode == 0, r.stderr
    figures = json.loads((book / "book.json").read_text())["figures"]
    assert figures["parts"] == 2 and len(figures["halo_rows"]) == 2 and figures["edge_cut"] > 0
    r = _cli("train", "--dataset", "cora", "--nprocs", "2", "--partition", str(book), data=data)
    assert r.returncode == 2 and "built for citeseer" in r.stderr and "not for cora" in r.stderr
    # a stale book: the edge list changed after it was partitioned
    edges = tmp_path / "g.txt"
    edges.write_text("".join(f"{i} {(i * 7 + 1) % 60}\n" for i in range(60)))
    spec = f"edgelist:{edges}"
    r = _cli("partition", "--dataset", spec, "--parts", "2", "--out", str(tmp_path / "b"),
             data=data)
    assert r.returncode == 0, r.stderr
    edges.write_text(edges.read_text() + "3 5\n")
    r = _cli("train", "--dataset", spec, "--nprocs", "2", "--partition", str(tmp_path / "b"),
             data=data)
    assert r.returncode == 2 and "stale" in r.stderr and "ngra partition" in r.stderr, r.stderr


def test_torchrun_starts_the_same_training(data, tmp_path):
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(__import__("ngra.distributed.launch", fromlist=["x"])
                                             .free_port()),
                        "-m", "ngra", "train", "--model", "gcn", "--dataset", "cora",
                        "--data-root", data, "--epochs", "3", "--no-progress",
                        "--out", str(out)], capture_output=True, text=True, env=os.environ.copy(),
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["world_size"] == 2 and len(summary["history"]) == 3
    one = train(_cfg(data, "gcn", epochs=3))
    torch.testing.assert_close(_losses(summary), _losses(one), rtol=1e-4, atol=1e-5)


def test_a_world_of_one_rank_trains_as_one_process(data, single):
    """``torchrun --nproc_per_node 1`` (one GPU's NCCL run): the ring's hops go to the rank
    itself, which gloo cannot send to."""
    base = _cfg(data, "gcn", nprocs=1)
    folder = str(prepare_shards(base))
    jobs = [(dataclasses.replace(base, exchange=ex), folder) for ex in ("halo", "ring")]
    for summary in launch(dist_ranks.train_configs, 1, jobs, threads=1)[0]:
        assert summary["world_size"] == 1
        torch.testing.assert_close(_losses(summary), _losses(single["gcn"]), rtol=1e-4,
                                   atol=1e-5)


def test_a_shard_holds_only_its_rank_s_rows_and_edges(data):
    """A slice of the whole graph's arrays saved as is would carry the whole array."""
    folder = Path(prepare_shards(_cfg(data, "gcn", nprocs=4, partition_method="range")))
    for r in range(4):
        shard = torch.load(folder / f"rank{r}.pt", weights_only=True)
        for key, t in shard.items():
            if isinstance(t, torch.Tensor):
                assert t.untyped_storage().nbytes() == t.nbytes, (r, key)
        assert shard["x"].shape[0] == shard["num_own"] < 2708


def test_runs_and_early_stop_on_ranks_as_on_one(data, tmp_path):
    """GAT with its attention dropout, two seeds, early stop on a plateau (a learning rate
    too small to move a weight): the ranks stop where one process stops, with its losses."""
    kw = dict(epochs=6, runs=2, patience=2, lr=1e-30)
    one = train(_cfg(data, "gat", **kw))
    out = tmp_path / "runs.json"
    many = train(_cfg(data, "gat", nprocs=2, exchange="ring", out=str(out), **kw))
    assert json.loads(out.read_text())["seeds"] == many["seeds"] == [0, 1]
    assert many["world_size"] == 2
    for a, b in zip(one["results"], many["results"]):
        assert a["stopped_early"] and b["stopped_early"] and a["epochs"] == b["epochs"] == 3
        torch.testing.assert_close(_losses(b), _losses(a), rtol=1e-4, atol=1e-5)
    assert _losses(many["results"][0]) != _losses(many["results"][1])  # the seeds differ
