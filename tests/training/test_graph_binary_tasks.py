"""Binary multi-task graph classification (OGB's ogbg-molhiv / -molpcba layout): the
masked BCE loss against plain torch, OGB's metric on every part, model selection on it,
the JSON summary and ``ngra train``; a tiny folder written by the test."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

import ngra
from ngra.cli import main
from ngra.datasets import GraphLoader, load
from ngra.metrics import mean_over_tasks
from ngra.training.graph_task import GraphSession, graph_model, loss_sum
from ngra.training.config import TrainConfig
from ogbg_folder import ogbg_tasks_folder


def _plain_masked_bce(out, y):
    """Binary cross-entropy written out, averaged over the labeled (non-NaN) entries."""
    mask = ~torch.isnan(y)
    p, t = torch.sigmoid(out[mask].double()), y[mask].double()
    return -(t * torch.log(p) + (1 - t) * torch.log(1 - p)).mean()


def _session(folder, **kw):
    ds = load(f"ogbg:{folder}")
    cfg = TrainConfig(model="gin", dataset=f"ogbg:{folder}", task="graph", **kw)
    parts = {k: v.numpy() for k, v in ds.split.items()}
    return ds, GraphSession(graph_model(cfg, ds.num_features, ds.num_outputs), ds, parts,
                            batch_size=16, seed=0, budget=None, info={})


def test_loss_is_plain_masked_bce_and_an_unlabeled_batch_adds_zero(tmp_path):
    ds, s = _session(ogbg_tasks_folder(tmp_path))
    batch = next(iter(GraphLoader(ds, 16)))
    assert torch.isnan(batch.y).any() and (~torch.isnan(batch.y)).any()
    out = s.forward(batch)
    assert out.shape == (16, 3)
    loss, value = s.loss(out, batch)
    want = _plain_masked_bce(out, batch.y)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5) and value == pytest.approx(
        want.item(), rel=1e-5)
    grad = torch.autograd.grad(loss, s.net.head.weight, retain_graph=True)[0]
    want_grad = torch.autograd.grad(want, s.net.head.weight, retain_graph=True)[0]
    torch.testing.assert_close(grad, want_grad.float(), rtol=1e-4, atol=1e-6)
    # no labeled entry: zero loss and zero gradients, no NaN
    missing = torch.full_like(batch.y, float("nan"))
    total, count = loss_sum(out, missing, "binary")
    assert count == 0 and total.item() == 0.0
    (g,) = torch.autograd.grad(total, s.net.head.weight)
    assert torch.equal(g, torch.zeros_like(g))


def test_fit_selects_on_the_folders_metric_and_names_it(tmp_path):
    folder = ogbg_tasks_folder(tmp_path, master="binary classification,ap")
    r = ngra.fit("gin", f"ogbg:{folder}", task="graph", epochs=4, batch_size=8,
                 progress=False, seed=0)
    s = r.summary
    assert s["metric"] == "ap" and s["dataset_summary"]["task_type"] == "binary"
    assert set(s["metrics"]) == {f"{p}_{m}" for p in ("train", "val", "test")
                                 for m in ("roc_auc", "ap")}
    best = max(h["val"] for h in s["history"])
    assert s["val_acc"] == best == s["metrics"]["val_ap"]
    assert s["history"][s["best_epoch"] - 1]["test"] == s["test_acc"]
    # the model holds the selected weights: its val AP is the summary's, as OGB computes it
    ds = load(f"ogbg:{folder}")
    val = ds.subset(ds.split["val"].numpy())
    r.model.eval()
    with torch.no_grad():
        scores = torch.cat([r.model(b.graph, b.x, b.ptr) for b in GraphLoader(val, 7)])
    assert mean_over_tasks(val.y, scores, "ap")[0] == pytest.approx(s["val_acc"], rel=1e-6)
    probs = r.predict(f"ogbg:{folder}", output="probabilities")
    assert probs.shape == (40, 3) and bool(((probs >= 0) & (probs <= 1)).all())


def test_cli_summary_names_the_metric(tmp_path, capsys):
    folder = ogbg_tasks_folder(tmp_path)
    out = tmp_path / "r.json"
    assert main(["train", "--task", "graph", "--dataset", f"ogbg:{folder}", "--model", "gin",
                 "--epochs", "2", "--batch-size", "8", "--no-progress", "--out",
                 str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["metric"] == "roc_auc" and s["dataset_summary"]["num_tasks"] == 3
    assert "test_roc_auc=" in capsys.readouterr().out


def test_a_part_without_both_labels_is_nan_with_one_warning(tmp_path, caplog):
    _, s = _session(ogbg_tasks_folder(tmp_path))
    y = torch.tensor([[1.0, float("nan")], [1.0, 1.0]])
    outputs = {"train": (torch.tensor([[0.5, 0.1], [0.2, 0.3]]), torch.tensor([[1.0, 0], [0, 1]])),
               "val": (torch.zeros(2, 2), y), "test": (torch.zeros(2, 2), y)}
    with caplog.at_level(logging.WARNING, logger="ngra.training.graph_task"):
        values, val_loss = s.scored(outputs)
        s.scored(outputs)
    assert values["train"] == 1.0 and math.isnan(values["val"]) and math.isnan(values["test"])
    assert val_loss == pytest.approx(math.log(2))  # logits 0 on three labeled entries
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "among the 2 val graphs, so their roc_auc is NaN" in warned[0]
