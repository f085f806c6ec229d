"""Link prediction and graph classification through ``ngra.fit`` and ``ngra train``."""

from __future__ import annotations

import json

import pytest
import torch

import ngra
from ngra.cli import main
from ngra.errors import DatasetError
from ngra.training import FIELDS


def _mutag(shared_data) -> str:
    path = shared_data / "tu" / "MUTAG"
    if not path.is_dir():
        pytest.skip(f"MUTAG not under {shared_data}/tu")
    return f"tu:{path}"


def test_link_prediction_learns_cora(shared_data):
    r = ngra.fit("gcn", "cora", task="link", epochs=100, progress=False,
                 data_root=str(shared_data), seed=0)
    s = r.summary
    assert list(s) == list(FIELDS) and s["task"] == "link" and s["metric"] == "roc_auc"
    # ROC-AUC of held-out edges vs fixed negatives (PyG's link_pred.py: about 0.91)
    assert s["test_acc"] > 0.88, s["test_acc"]
    assert {"test_hits@20", "test_hits@50", "test_hits@100", "val_roc_auc"} <= set(s["metrics"])
    assert s["dataset_summary"]["link_split"]["test_pos"] > 0
    z = r.model(*_encoder_inputs(r, shared_data))
    assert z.shape[1] == 64  # the encoder's embedding width


def _encoder_inputs(r, shared_data):
    from ngra.datasets import load
    from ngra.models import prepare

    ds = load("cora", root=str(shared_data))
    g, e = prepare("gcn", ds.graph)
    x = ds.x / ds.x.sum(1, keepdim=True).clamp(min=1)
    return g, x, e


def test_link_prediction_with_a_user_encoder_and_mlp_decoder(user_path):
    r = ngra.fit("user_models:build_model", "sbm:nodes=300,blocks=3,feat=16", task="link",
                 decoder="mlp", embedding_dim=8, epochs=5, progress=False)
    assert r.summary["metric"] == "roc_auc" and 0.0 <= r.summary["test_acc"] <= 1.0
    assert r.model.encoder.conv2.w.out_features == 8  # the factory built an 8-wide encoder
    assert sum(p.numel() for p in r.model.decoder.parameters()) > 0


def test_graph_classification_on_mutag(shared_data, tmp_path):
    spec = _mutag(shared_data)
    r = ngra.fit("gin", spec, task="graph", epochs=15, batch_size=32, progress=False,
                 seed=0, checkpoint=str(tmp_path / "ck"))
    s = r.summary
    assert list(s) == list(FIELDS) and s["task"] == "graph" and s["metric"] == "accuracy"
    assert s["dataset_summary"]["num_graphs"] == 188
    assert s["val_acc"] > 0.6, s["val_acc"]
    ck = torch.load(tmp_path / "ck" / "checkpoint.pt", weights_only=True)
    assert ck["meta"]["task"] == "graph" and ck["meta"]["readout"] == "sum"


def test_graph_readouts_and_cli(shared_data, tmp_path, capsys):
    spec = _mutag(shared_data)
    out = tmp_path / "r.json"
    assert main(["train", "--task", "graph", "--dataset", spec, "--model", "gin",
                 "--readout", "attention", "--epochs", "2", "--batch-size", "64",
                 "--no-progress", "--out", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["config"]["readout"] == "attention" and s["epochs"] == 2
    assert "test_acc=" in capsys.readouterr().out


def test_link_prediction_from_disk_under_a_budget(tmp_path, monkeypatch):
    # the features mapped from the cache entry (their memory bound: tests/ngra/test_disk_training.py)
    monkeypatch.setenv("NGRA_CACHE", str(tmp_path))
    r = ngra.fit("gcn", "rmat:scale=10,feat=32", task="link", storage="disk",
                 memory_budget="64MiB", epochs=3, progress=False)
    assert r.summary["storage"] == "disk" and r.summary["task"] == "link"
    assert 0.0 <= r.summary["test_acc"] <= 1.0


def test_tasks_refuse_what_they_cannot_run(shared_data):
    with pytest.raises(DatasetError, match="collection of graphs"):
        ngra.fit("gin", "sbm:nodes=100", task="graph", epochs=1, progress=False)
    with pytest.raises(ValueError, match="--task link trains on the CPU"):
        ngra.fit("gcn", "sbm:nodes=100", task="link", device="cuda")
    with pytest.raises(ValueError, match="--negatives must be one of"):
        ngra.fit("gcn", "sbm:nodes=100", task="link", negatives="hard")
    with pytest.raises(ValueError, match="--decoder must be one of"):
        ngra.fit("gcn", "sbm:nodes=100", task="link", decoder="cosine")
    with pytest.raises(ValueError, match="--val and --test"):
        ngra.fit("gcn", "sbm:nodes=100", task="link", val=0.6, test=0.5)
    with pytest.raises(DatasetError, match="--task graph"):  # tu: as a node dataset
        ngra.fit("gin", _mutag(shared_data), epochs=1, progress=False)


def test_link_and_graph_models_reload_and_predict(shared_data, tmp_path):
    spec = _mutag(shared_data)
    g = ngra.fit("gin", spec, task="graph", epochs=2, progress=False,
                 checkpoint=str(tmp_path / "g"))
    p = ngra.load_model(tmp_path / "g")
    labels = p.predict(spec)
    assert labels.shape == (188,)
    assert torch.equal(p.predict(spec, output="scores"), g.predict(spec, output="scores"))
    link = ngra.fit("sage", "sbm:nodes=200,blocks=2,feat=8", task="link", epochs=2,
                    progress=False, checkpoint=str(tmp_path / "l"))
    q = ngra.load_model(tmp_path / "l")
    z = q.predict("sbm:nodes=200,blocks=2,feat=8")
    assert z.shape == (200, 64)
    prob = q.predict("sbm:nodes=200,blocks=2,feat=8", pairs=torch.tensor([[0, 1], [2, 3]]))
    assert prob.shape == (2,) and bool(((prob >= 0) & (prob <= 1)).all())
    assert torch.equal(prob, link.predict("sbm:nodes=200,blocks=2,feat=8",
                                          pairs=torch.tensor([[0, 1], [2, 3]])))


def test_relational_link_prediction_with_distmult(tmp_path):
    """--decoder distmult splits typed pairs, the R-GCN encoder reads the message graph's
    types, and a reloaded model scores (pair, relation) queries."""
    spec = "sbm:nodes=600,blocks=3,feat=8,edge_types=3"
    r = ngra.fit("rgcn", spec, task="link", decoder="distmult", epochs=5, progress=False,
                 checkpoint=str(tmp_path / "dm"))
    s = r.summary
    assert s["dataset_summary"]["link_split"]["relations"] == 3
    assert s["config"]["decoder"] == "distmult" and 0.0 <= s["test_acc"] <= 1.0
    assert r.model.decoder.relations.shape == (3, 64)
    q = ngra.load_model(tmp_path / "dm")
    pairs, rel = torch.tensor([[0, 1], [2, 3]]), torch.tensor([0, 2])
    prob = q.predict(spec, pairs=pairs, relations=rel)
    assert prob.shape == (2,) and torch.equal(prob, r.predict(spec, pairs=pairs, relations=rel))
    with pytest.raises(ValueError, match=r"rel must be \[2\] relation ids"):
        q.predict(spec, pairs=pairs)
    with pytest.raises(DatasetError, match="has no edge types"):
        ngra.fit("gcn", "sbm:nodes=100", task="link", decoder="distmult", progress=False)
