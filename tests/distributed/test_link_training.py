"""Link prediction on several ranks equals one process: the same split, the same
negatives each epoch, the same losses, metrics and weights to float tolerance."""

from __future__ import annotations

import pytest
import torch

import ngra

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

EPOCHS = 4


@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:  # partitions cached in a private folder
        mp.setenv("NGRA_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield str(shared_data)


def _fit(data, nprocs=1, **kw):
    kw.setdefault("epochs", EPOCHS)
    return ngra.fit(kw.pop("model", "gcn"), kw.pop("dataset", "cora"), task="link",
                    data_root=data, seed=0, progress=False, threads=1, nprocs=nprocs, **kw)


def _same(one, many, tol=2e-4):
    a, b = one.summary, many.summary
    assert b["world_size"] == 2
    la = [h["loss"] for h in a["history"]]
    lb = [h["loss"] for h in b["history"]]
    assert la == pytest.approx(lb, rel=tol, abs=tol), (la, lb)
    for k, v in a["metrics"].items():
        assert b["metrics"][k] == pytest.approx(v, abs=tol), k
    assert b["test_acc"] == pytest.approx(a["test_acc"], abs=tol)
    sa, sb = one.model.state_dict(), many.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sb[k], sa[k], rtol=1e-3, atol=1e-4, msg=k)


@pytest.mark.parametrize("method", ["metis", "range"])
def test_two_ranks_train_link_prediction_as_one_process(data, method):
    _same(_fit(data), _fit(data, 2, partition_method=method))


def test_degree_negatives_and_an_mlp_decoder_on_two_ranks(data):
    kw = dict(negatives="degree", decoder="mlp", embedding_dim=16)
    one = _fit(data, **kw)
    assert one.summary["config"]["negatives"] == "degree"
    _same(one, _fit(data, 2, **kw))


def test_a_user_encoder_on_two_ranks(data, user_path):
    kw = dict(model="user_models:build_model", dataset="sbm:nodes=400,blocks=4,feat=16",
              embedding_dim=8)
    _same(_fit(data, **kw), _fit(data, 2, **kw))


def test_relational_link_prediction_on_two_ranks(data):
    kw = dict(model="rgcn", dataset="sbm:nodes=500,blocks=3,feat=8,edge_types=3",
              decoder="distmult", embedding_dim=16)
    _same(_fit(data, **kw), _fit(data, 2, **kw))
