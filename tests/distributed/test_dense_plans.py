"""``ngra train --plan``'s data x tensor parallel dense layers train as one process.

A plan ``dp d x tp t`` partitions the graph ``d`` ways and runs each partition on ``t``
ranks that split the plan's split Linears (G-GCN's ApplyVertex ``w``, ``col_gather``) and
run its replicated layers whole (:mod:`ngra.distributed.dense`). On 2 ranks (dp1 x tp2) and
4 ranks (dp2 x tp2, halo and ring) the loss of every epoch and the test accuracy equal one
process's, and each rank holds only its shard of a split weight.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import dist_ranks
from ngra.distributed import launch
from ngra.distributed.dense import DenseLayout
from ngra.training.ranks import prepare_shards
from ngra.training import TrainConfig
from ngra.training.run import train

SPEC = "sbm:nodes=400"
EPOCHS = 4


def _record(d: int, t: int, configs: dict[str, str] | None = None) -> dict:
    return {"label": f"pp1 dp{d} tp{t} m1", "devices": d * t, "pipeline": 1, "data": d,
            "tensor": t, "micro_batches": 1, "configs": configs or {}, "recompute": [False],
            "predicted_time_s": 0.0}


def _cfg(root, model, k=1, plan=None, **kw):
    extra = {"plan": {"source": "test", "used": plan}} if plan else {}
    return TrainConfig(model=model, dataset=SPEC, data_root=root, seed=0, epochs=EPOCHS,
                       progress=False, nprocs=k, extra=extra, **kw)


def _losses(summary):
    return [h["loss"] for h in summary["history"]]


SPLIT = {"layers.0.w": "col_gather", "layers.1.w": "col_gather"}


def test_layout_of_a_run():
    cfg = _cfg("/nowhere", "gcn", 4, _record(2, 2, SPLIT))
    lay = DenseLayout.of(cfg.nprocs, cfg.extra.get("plan"))
    assert (lay.data, lay.tensor, lay.configs) == (2, 2, SPLIT)
    assert [lay.replica(r) for r in range(4)] == [0, 0, 1, 1]
    assert [lay.position(r) for r in range(4)] == [0, 1, 0, 1]
    assert DenseLayout.of(3) == DenseLayout(3)
    with pytest.raises(ValueError, match="this run has --nprocs 2"):
        DenseLayout.of(2, {"used": _record(2, 2)})


@pytest.mark.distributed
@pytest.mark.timeout(900)
@pytest.mark.parametrize("d,t", [(1, 2), pytest.param(2, 2, marks=pytest.mark.slow)])  # 4 ranks
def test_tensor_parallel_plans_train_as_one_process(tmp_path, monkeypatch, d, t):
    monkeypatch.setenv("NGRA_CACHE", str(tmp_path / "cache"))
    root = str(tmp_path)
    cases = [("gcn", {}, "halo"), ("ggcn", SPLIT, "halo" if d == 1 else "ring")]
    jobs = []
    for model, splits, exchange in cases:
        cfg = _cfg(root, model, d * t, _record(d, t, splits), exchange=exchange)
        jobs.append((cfg, str(prepare_shards(cfg))))
    out = launch(dist_ranks.train_and_inspect, d * t, jobs, threads=1)[0]
    for (model, splits, exchange), (summary, shapes) in zip(cases, out):
        one = train(_cfg(root, model))
        where = f"{model} dp{d} x tp{t} ({exchange})"
        torch.testing.assert_close(_losses(summary), _losses(one), rtol=1e-4, atol=1e-5,
                                   msg=where)
        assert abs(summary["test_acc"] - one["test_acc"]) <= 0.01, where
        assert summary["world_size"] == d * t and summary["partition"]["parts"] == d
        lay = summary["dense_layout"]
        assert (lay["data"], lay["tensor"], lay["splits"]) == (d, t, splits), where
        assert lay["replica_of_rank"] == [r // t for r in range(d * t)]
        for path in splits:  # ColwiseParallel: a position holds its block of W's rows
            full = _full_shape(model, path)
            rows = [s[path][0] for s in shapes[:t]]  # replica 0's positions
            assert sum(rows) == full[0] and max(rows) < full[0], (where, shapes)
            assert all(s[path][1] == full[1] for s in shapes), (where, shapes)
            assert [s[path] for s in shapes] == [s[path] for s in shapes[:t]] * d
        if d > 1:
            sent = summary["bytes_sent_per_epoch"]["per_rank"]
            assert all(b.get(exchange, 0) > 0 for b in sent), where


def _full_shape(model: str, path: str) -> tuple[int, int]:
    from ngra.datasets import load
    from ngra.models import build_model

    ds = load(SPEC)
    net = build_model(model, ds.x.shape[1], ds.num_classes)
    return tuple(net.get_submodule(path).weight.shape)
