"""``ngra.fit``: a user's model and data through everything a zoo run gets."""

from __future__ import annotations

import json

import pytest
import torch

import ngra
from ngra.errors import CheckpointError, DatasetError
from ngra.training import FIELDS, SCHEMA_VERSION, TrainResult

SBM = "sbm:nodes=300,blocks=3,feat=16"


def test_fit_a_factory_on_a_spec(user_path):
    import user_models

    r = ngra.fit(user_models.build_model, SBM, epochs=4, progress=False, hidden=8)
    assert isinstance(r, TrainResult) and isinstance(r.model, user_models.Net)
    assert r.model.conv1.w.out_features == 8  # given hyper-parameters reach the factory
    s = r.to_json()
    assert list(s) == list(FIELDS) and s["schema_version"] == SCHEMA_VERSION
    assert s["model"] == "user_models:build_model" and s["epochs"] == 4
    assert s["config_sources"]["hidden"] == "given"
    assert s["config"]["lr"] == 0.01  # the user-model default, with its source
    assert "your own models" in s["config_sources"]["lr"]
    assert len(r.history) == 4 and r.test_acc == s["test_acc"]
    assert s["synthesized"] == ["features", "labels"]
    json.dumps(s)  # plain JSON


def test_the_model_holds_the_selected_weights(user_path, tmp_path):
    import user_models

    r = ngra.fit(user_models.build_model, SBM, epochs=6, progress=False,
                 checkpoint=str(tmp_path / "ck"), checkpoint_every=2)
    ck = torch.load(tmp_path / "ck" / "checkpoint.pt", weights_only=True)  # plain data only
    for k, v in r.model.state_dict().items():
        assert torch.equal(ck["model"][k], v)  # the selected epoch's, not the last one's
    assert ck["best"]["epoch"] == r.best_epoch and set(ck["last"]) == set(ck["model"])
    assert ck["meta"]["model"] == {"kind": "factory", "name": "user_models:build_model",
                                   "importable": True}


def test_fit_a_module_in_place_on_tensors(user_path):
    import user_models

    torch.manual_seed(0)
    n, idx = 60, torch.arange(60)
    data = {"edge_index": torch.randint(0, n, (2, 400)), "x": torch.randn(n, 5),
            "y": torch.randint(0, 3, (n,)), "train_mask": idx < 30,
            "val_mask": (idx >= 30) & (idx < 45), "test_mask": idx >= 45}
    net = user_models.Net(5, 3)
    before = net.conv1.w.weight.detach().clone()
    r = ngra.fit(net, data, epochs=3, progress=False)
    assert r.model is net and not torch.equal(before, net.conv1.w.weight)
    assert r.summary["dataset"] == "tensors" and r.summary["num_nodes"] == n
    assert r.summary["model"] == "user_models.Net"


def test_fit_a_pyg_data_with_its_masks(user_path):
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data

    import user_models

    torch.manual_seed(0)
    n, idx = 50, torch.arange(50)
    data = Data(x=torch.randn(n, 4), y=torch.randint(0, 2, (n,)),
                edge_index=torch.randint(0, n, (2, 300)), train_mask=idx < 20,
                val_mask=(idx >= 20) & (idx < 35), test_mask=idx >= 35)
    r = ngra.fit(user_models.build_model, data, epochs=2, progress=False)
    assert r.summary["dataset_summary"]["train"] == 20  # its own split, not a random one
    assert r.summary["synthesized"] == []


def test_optimizer_factory_and_unknown_option():
    with pytest.raises(TypeError, match="unknown option"):
        ngra.fit("gcn", SBM, epochz=3)
    seen = []

    def sgd(model):
        seen.append(model)
        return torch.optim.SGD(model.parameters(), lr=0.1)

    r = ngra.fit("gcn", SBM, epochs=2, optimizer=sgd, progress=False)
    assert seen and r.summary["config"]["optimizer"].endswith("sgd")


def test_bad_models_are_refused_before_training(user_path):
    with pytest.raises(ValueError, match="does not import"):
        ngra.fit("no_such_pkg.layers:build", SBM, epochs=1)
    with pytest.raises(ValueError, match="has no 'nope'; its callables are"):
        ngra.fit("user_models:nope", SBM, epochs=1)
    with pytest.raises(TypeError, match="must return a torch.nn.Module"):
        ngra.fit("user_models:not_a_module", SBM, epochs=1, progress=False)
    with pytest.raises(ValueError, match=r"class scores \[num_nodes, num_classes\] = \[300, 3\]"):
        ngra.fit("user_models:wrong_width", SBM, epochs=1, progress=False)
    with pytest.raises(ValueError, match="takes no heads"):
        ngra.fit("user_models:build_model", SBM, epochs=1, heads=2, progress=False)
    with pytest.raises(ValueError, match="needs a factory"):
        import user_models

        ngra.fit(user_models.build_model(16, 3), SBM, epochs=1, runs=2)
    with pytest.raises(ValueError, match="task 'edges': ngra trains node, link, graph"):
        ngra.fit("gcn", SBM, task="edges")


def test_a_model_reading_a_global_tensor_cannot_run_distributed(user_path):
    with pytest.raises(ValueError, match="cannot train on 2 processes.*size of tensor"):
        ngra.fit("user_models:reads_outside", SBM, epochs=1, nprocs=2, progress=False)


def test_load_model_and_predict(user_path, tmp_path):
    import user_models

    r = ngra.fit(user_models.build_model, SBM, epochs=3, progress=False,
                 checkpoint=str(tmp_path / "ck"))
    p = ngra.load_model(tmp_path / "ck")
    scores = p.predict(SBM, output="scores")
    assert scores.shape == (300, 3)
    assert torch.equal(scores, r.predict(SBM, output="scores"))  # deterministic evaluation
    assert torch.equal(p.predict(SBM), scores.argmax(-1))
    emb = p.predict(SBM, embeddings="conv1")
    assert emb.shape == (300, 16)
    with pytest.raises(ValueError, match="no layer 'conv9'; its layers are conv1"):
        p.predict(SBM, embeddings="conv9")
    with pytest.raises(DatasetError, match="trained on 16 features"):
        p.predict("sbm:nodes=300,blocks=3,feat=8")


def test_load_model_refuses_another_model(user_path, tmp_path):
    ngra.fit("gcn", SBM, epochs=2, progress=False, checkpoint=str(tmp_path / "gcn"))
    with pytest.raises(CheckpointError, match="trained with another model"):
        ngra.load_model(tmp_path / "gcn", model="user_models:build_model")


def test_zoo_checkpoint_rebuilds_with_its_preparation(tmp_path, shared_data):
    r = ngra.fit("gcn", "cora", epochs=3, progress=False, data_root=str(shared_data),
                 checkpoint=str(tmp_path / "ck"))
    p = ngra.load_model(tmp_path / "ck")
    assert p.meta["normalize_features"] is True  # GCN's recipe, applied again on predict
    a = p.predict("cora", output="scores", root=str(shared_data))
    assert torch.equal(a, r.predict("cora", output="scores", root=str(shared_data)))
    assert float((a.argmax(-1) == a.argmax(-1)).float().mean()) == 1.0


def test_saved_result_reloads(tmp_path):
    r = ngra.fit("sage", SBM, epochs=2, progress=False)
    r.save(tmp_path / "saved")
    p = ngra.load_model(tmp_path / "saved")
    assert torch.equal(p.predict(SBM, output="scores"), r.predict(SBM, output="scores"))
