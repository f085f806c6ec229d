"""Binary multi-task graph classification on two ranks equals one process: the masked
BCE divided by the whole batch's labeled entries, and AP from every rank's scores
gathered (:mod:`ngra.training.graph_ranks`)."""

from __future__ import annotations

import pytest
import torch

import ngra
from ogbg_folder import ogbg_tasks_folder

# 2 ranks twice over the gloo start-up: about 45 s on a loaded 2-core machine
pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(600)]


def _fit(spec, nprocs):
    return ngra.fit("gin", spec, task="graph", seed=0, progress=False, threads=1,
                    nprocs=nprocs, batch_size=8, embedding_dim=16, epochs=3)


def test_multi_task_binary_on_two_ranks_as_one_process(tmp_path):
    """ogbg-molpcba's layout (3 tasks, a quarter of the labels missing)."""
    spec = f"ogbg:{ogbg_tasks_folder(tmp_path, master='binary classification,ap')}"
    one, two = _fit(spec, 1), _fit(spec, 2)
    a, b = one.summary, two.summary
    assert (a["world_size"], b["world_size"], b["metric"]) == (1, 2, "ap")
    for ha, hb in zip(a["history"], b["history"], strict=True):
        for key in ("loss", "val_loss", "train", "val", "test"):
            assert hb[key] == pytest.approx(ha[key], rel=2e-4, abs=2e-4), (key, ha, hb)
    assert b["best_epoch"] == a["best_epoch"]
    for key, value in a["metrics"].items():  # both OGB metrics of every part
        assert b["metrics"][key] == pytest.approx(value, rel=1e-4), key
    for k, v in one.model.state_dict().items():
        torch.testing.assert_close(two.model.state_dict()[k], v, rtol=1e-3, atol=1e-4, msg=k)
