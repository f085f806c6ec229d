"""Graph classification on several ranks equals one process: the same batches, each rank
a slice of every batch, the same losses, accuracies and weights to float tolerance."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import ngra
from ngra.cli import main
from ngra.datasets import GraphDataset
from ngra.training.graph_ranks import share_bounds

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]


def _mutag(shared_data) -> str:
    path = shared_data / "tu" / "MUTAG"
    if not path.is_dir():
        pytest.skip(f"MUTAG not under {shared_data}/tu")
    return f"tu:{path}"


def _synthetic(num_graphs: int = 24, seed: int = 0) -> GraphDataset:
    """Graphs of 0..7 nodes (an empty and a one-node graph among them), random edges with
    self-loops and multi-edges, features that carry the label."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 8, num_graphs)
    counts[:2] = [0, 1]
    node_ptr = np.concatenate(([0], np.cumsum(counts)))
    edges = rng.integers(0, 3 * counts + 1)  # per graph
    graph = np.repeat(np.arange(num_graphs), edges)
    size = np.maximum(counts[graph], 1)
    src = node_ptr[graph] + rng.integers(0, 1 << 30, graph.size) % size
    dst = node_ptr[graph] + rng.integers(0, 1 << 30, graph.size) % size
    labels = rng.integers(0, 2, num_graphs)
    x = rng.standard_normal((int(node_ptr[-1]), 4)).astype(np.float32)
    x[:, 0] += np.repeat(labels, counts)
    return GraphDataset.from_edges("synthetic", src, dst, node_ptr, labels, x,
                                   info={"x": "given"})


def _fit(model, data, nprocs=1, **kw):
    kw.setdefault("epochs", 3)
    return ngra.fit(model, data, task="graph", seed=0, progress=False, threads=1,
                    nprocs=nprocs, **kw)


def _same(one, many, tol=2e-4):
    a, b = one.summary, many.summary
    assert a["world_size"] == 1 and b["world_size"] == 2
    assert len(a["history"]) == len(b["history"])
    for ha, hb in zip(a["history"], b["history"]):
        for key in ("loss", "val_loss", "train", "val", "test"):
            assert hb[key] == pytest.approx(ha[key], rel=tol, abs=tol, nan_ok=True), (key, ha, hb)
    assert (b["best_epoch"], b["val_acc"], b["test_acc"]) == (a["best_epoch"], a["val_acc"],
                                                             a["test_acc"])
    sa, sb = one.model.state_dict(), many.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sb[k], sa[k], rtol=1e-3, atol=1e-4, msg=k)


def test_shares_are_contiguous_slices_that_cover_a_batch():
    for size in range(7):
        for world in (1, 2, 3, 4):
            bounds = [share_bounds(size, r, world) for r in range(world)]
            assert bounds[0][0] == 0 and bounds[-1][1] == size
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert share_bounds(1, 0, 2) == (0, 0)  # a one-graph batch: rank 0 holds none


def test_mutag_on_two_ranks_as_one_process(shared_data):
    """The zoo's GIN with dropout (each rank draws its rows of the batch's masks) on MUTAG."""
    spec = _mutag(shared_data)
    kw = dict(batch_size=32, dropout=0.5)  # graph tasks default to none
    one, two = _fit("gin", spec, **kw), _fit("gin", spec, 2, **kw)
    _same(one, two)
    s = two.summary
    assert s["task"] == "graph" and s["dataset_summary"]["num_graphs"] == 188
    assert s["placement"].startswith("cpu: 2 processes") and "BatchNorm" not in s["placement"]
    sent = s["bytes_sent_per_epoch"]["per_rank"]
    assert len(sent) == 2 and sent[0]["allreduce"] > 0


def test_batches_smaller_than_the_ranks_with_a_user_encoder(user_path):
    """One graph a batch: a rank holds none of it and still meets the all-reduce; a
    user's encoder; the graphs given in memory (empty graphs among them)."""
    ds = _synthetic()
    kw = dict(batch_size=1, embedding_dim=8, epochs=2, val=0.25, test=0.25)
    _same(_fit("user_models:build_model", ds, **kw),
          _fit("user_models:build_model", ds, 2, **kw))


def test_resume_across_process_counts(shared_data, tmp_path):
    """Two epochs on one process, two more resumed on two ranks: the uninterrupted run's."""
    spec = _mutag(shared_data)
    kw = dict(batch_size=64, dropout=0.5)  # the RNG state travels in the checkpoint
    saved = dict(checkpoint=str(tmp_path / "ck"), checkpoint_every=1)
    _fit("gin", spec, epochs=2, **kw, **saved)
    resumed = _fit("gin", spec, 2, epochs=4, resume=True, **kw, **saved)
    whole = _fit("gin", spec, epochs=4, **kw)
    assert [h["epoch"] for h in resumed.summary["history"]] == [1, 2, 3, 4]
    resumed.summary["world_size"] = 2  # _same's check of who trained what
    whole.summary["world_size"] = 1
    _same(whole, resumed)


def test_refusals(shared_data, capsys):
    spec = _mutag(shared_data)
    with pytest.raises(ValueError, match=r"more processes than .* training graphs \(\d+\)"):
        _fit("gin", spec, 400, allow_oversubscribe=True)
    assert main(["train", "--task", "graph", "--dataset", spec, "--nprocs", "400",
                 "--allow-oversubscribe", "--no-progress"]) == 2  # bad input, before any rank
    assert "training graphs" in capsys.readouterr().err


def batch_norm_encoder(num_features: int, num_classes: int) -> nn.Module:
    """A user encoder with a BatchNorm between two GIN layers."""

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = ngra.models.GINConv(num_features, 16)
            self.norm = nn.BatchNorm1d(16)
            self.conv2 = ngra.models.GINConv(16, num_classes)

        def forward(self, graph, x):
            return self.conv2(graph, torch.relu(self.norm(self.conv1(graph, x))))

    return Encoder()


@pytest.mark.slow
def test_cli_runs_and_batch_norm(shared_data, tmp_path, capsys):
    """``ngra train --task graph --nprocs 2 --runs 2 --out``; a model with BatchNorm trains
    and its summary says the statistics are synchronized."""
    spec = _mutag(shared_data)
    out = tmp_path / "r.json"
    argv = ["train", "--task", "graph", "--dataset", spec, "--model", "gin", "--epochs", "2",
            "--batch-size", "64", "--runs", "2", "--threads", "1", "--no-progress"]
    assert main([*argv, "--nprocs", "2", "--out", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["runs"] == 2 and s["world_size"] == 2 and len(s["results"]) == 2
    assert main([*argv, "--out", str(tmp_path / "one.json")]) == 0
    one = json.loads((tmp_path / "one.json").read_text())
    for a, b in zip(one["results"], s["results"]):
        assert b["test_acc"] == a["test_acc"] and b["val_acc"] == a["val_acc"]
    bn = _fit(batch_norm_encoder, spec, 2, epochs=2, batch_size=64, embedding_dim=16)
    assert "BatchNorm statistics over all ranks" in bn.summary["placement"]
    assert 0.0 <= bn.summary["test_acc"] <= 1.0
