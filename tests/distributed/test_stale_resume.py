"""``--halo-staleness 1`` across a checkpoint: a run interrupted and resumed on the same
ranks and partition trains as the uninterrupted run (each rank's stale halo rows and
gradients are in the checkpoint); resumed on another partition its first step is exact,
and the summary says so."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import stale_ranks
from ngra.distributed import launch
from ngra.training import TrainConfig
from ngra.training.checkpoint import load_checkpoint
from ngra.training.ranks import prepare_shards


@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NGRA_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield str(shared_data)


@pytest.mark.distributed
@pytest.mark.timeout(240)  # ~15 s of CPU on 2 cores (45 s wall with the cores shared)
def test_stale_halos_resume_as_uninterrupted(data, tmp_path):
    cfg = TrainConfig(model="gcn", dataset="cora", data_root=data, seed=0, progress=False,
                      nprocs=2, epochs=4, exchange="halo", halo_staleness=1,
                      checkpoint_every=2)
    metis = str(prepare_shards(cfg))
    other = dataclasses.replace(cfg, partition_method="range")
    ranged = str(prepare_shards(other))
    straight, cut, moved = (str(tmp_path / n) for n in ("straight", "cut", "moved"))
    jobs = [(dataclasses.replace(cfg, checkpoint=straight), metis),
            (dataclasses.replace(cfg, epochs=2, checkpoint=cut), metis),
            ("copy", cut, moved),
            (dataclasses.replace(cfg, checkpoint=cut, resume=True), metis),
            (dataclasses.replace(other, epochs=3, checkpoint=moved, resume=True), ranged)]
    one, half, _, resumed, elsewhere = launch(stale_ranks.train_or_copy, 2, jobs,
                                              threads=1)[0]

    def losses(s):
        return [h["loss"] for h in s["history"]]

    assert [lay["how"] for lay in one["exchange_per_layer"]] == ["halo, stale 1"] * 2
    assert resumed["stale_halos_resumed"] == "the checkpoint's stale halo rows and gradients"
    assert len(resumed["history"]) == 4
    # the resumed steps read the stale rows the interrupted run left: the same losses and
    # weights as the uninterrupted run (a first step with exact halos differs by ~1e-4)
    torch.testing.assert_close(losses(resumed), losses(one), rtol=1e-6, atol=1e-7)
    a = load_checkpoint(f"{straight}/checkpoint.pt")
    b = load_checkpoint(f"{cut}/checkpoint.pt")
    assert a["epoch"] == b["epoch"] == 4
    for k, v in a["last"].items():
        torch.testing.assert_close(b["last"][k], v, rtol=1e-6, atol=1e-7)
    saved = b["stale_halos"]
    assert saved["world_size"] == 2 and len(saved["ranks"]) == 2
    assert [st["layer"] for st in saved["ranks"][0]] == ["GCNConv", "GCNConv"]
    # another partition cannot take the rows up: its first step is exact, and it says why
    assert elsewhere["stale_halos_resumed"] == (
        "exact halos at the first step: the checkpoint's stale halos are of another "
        "partition or graph")
    assert len(elsewhere["history"]) == 3
    assert losses(elsewhere)[:2] == losses(half)
