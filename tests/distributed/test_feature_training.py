"""Feature-parallel layers (``--exchange feature``) train as one process: the zoo's GCN and
GAT (split by heads; its one-head output layer by columns) and a user layer, METIS and
range; auto decides alike on every rank; what cannot split, or does not fit, is refused."""

from __future__ import annotations

import pytest
import torch

import dist_ranks
import ngra
from ngra.distributed import launch
from ngra.training.ranks import prepare_shards
from ngra.training.run import train
from test_training import _cfg, _losses, data  # noqa: F401 (data: a fixture)

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]


def _check(summary, one, where, k):
    torch.testing.assert_close(_losses(summary), _losses(one), rtol=1e-4, atol=1e-5, msg=where)
    assert abs(summary["test_acc"] - one["test_acc"]) <= 0.01, where
    layers = summary["exchange"]
    assert len(layers) == 2, where
    assert all(lay["strategy"] == "feature" and lay["forced"] for lay in layers), where
    sent = summary["bytes_sent_per_epoch"]["per_rank"]
    assert len(sent) == k and all(b.get("feature", 0) > 0 for b in sent), where
    assert all("halo" not in b and "ring" not in b for b in sent), where


def _jobs(data, k, models, methods, **kw):
    jobs, keys = [], []
    for model in models:
        for method in methods:
            cfg = _cfg(data, model, nprocs=k, partition_method=method, exchange="feature",
                       **kw)
            jobs.append((cfg, str(prepare_shards(cfg))))
            keys.append((model, method))
    return jobs, keys


def test_feature_layers_train_as_one_process_on_two_ranks(data):
    """GCN on METIS, GAT (attention dropout, 8 heads split 4 / 4) on range, and the
    explain lines of a forced run."""
    single = {m: train(_cfg(data, m, epochs=2)) for m in ("gcn", "gat")}
    jobs, keys = _jobs(data, 2, ("gcn",), ("metis",), epochs=2)
    more, more_keys = _jobs(data, 2, ("gat",), ("range",), epochs=2, explain=True)
    jobs += more
    keys += more_keys
    out = launch(dist_ranks.train_configs, 2, jobs, threads=1)[0]
    for (model, method), summary in zip(keys, out):
        _check(summary, single[model], f"{model} {method} feature on 2 ranks", 2)
    explained = out[-1]["explain"]
    assert "feature: one all_to_all to 8 heads split 4 a rank over 2 ranks" in explained
    assert "columns: 7 columns split 3/4 a rank over 2 ranks: the layer splits by columns" \
        in explained  # the one-head output layer: its value's columns
    assert "predicted halo" in explained and "vs feature" in explained


@pytest.mark.slow  # over 20 s: the other model x partition cells on 2 ranks, and 4 ranks
@pytest.mark.parametrize("k", [2, 4])
def test_feature_layers_train_as_one_process_everywhere(data, k):
    single = {m: train(_cfg(data, m)) for m in ("gcn", "gat")}
    if k == 2:
        jobs, keys = _jobs(data, 2, ("gcn",), ("range",))
        more, more_keys = _jobs(data, 2, ("gat",), ("metis",))
        jobs, keys = jobs + more, keys + more_keys
    else:
        jobs, keys = _jobs(data, 4, ("gcn", "gat"), ("metis", "range"))
    out = launch(dist_ranks.train_configs, k, jobs, threads=1)[0]
    for (model, method), summary in zip(keys, out):
        _check(summary, single[model], f"{model} {method} feature on {k} ranks", k)


def test_a_user_layer_trains_on_feature_ranks_as_on_one(data):
    """dist_ranks.UserLayer: max of relu(a(src) + b(dst)), a fused element-wise edge
    expression read on both sides, split column by column."""
    from ngra.datasets import load

    ds = load("cora", root=data)
    one = dist_ranks.user_steps(ds.graph, ds.x, ds.y, ds.train_mask, 3, seed=3)
    folder = str(prepare_shards(_cfg(data, "sage", nprocs=2, partition_method="range")))
    got = launch(dist_ranks.user_model_on_ranks, 2, folder, "feature", 3, 3, threads=1)[0]
    torch.testing.assert_close(got, one, rtol=1e-4, atol=1e-5)


class Mixing(ngra.SagaLayer):
    """An edge UDF whose columns mix: each message scaled by its endpoints' rowdot."""

    gather = "sum"

    def apply_edge(self, edge):
        return edge.src * (edge.src * edge.dst).sum(-1, keepdim=True)

    def apply_vertex(self, vertex, acc):
        return acc


def auto_and_refusals(folder: str) -> dict:
    """On each rank: the auto choices of the zoo's GCN (with the calibrated link) and
    GAT, and the error of a forced feature exchange on a layer whose columns mix."""
    import torch.distributed as dist

    from ngra.distributed.link import link_model
    from ngra.distributed.shards import load_shard
    from ngra.models import build_model

    r, k = dist.get_rank(), dist.get_world_size()
    link = link_model()
    out = {}
    for model in ("gcn", "gat"):
        sh = load_shard(folder, r, k, exchange="auto", link=link)
        m = sh.meta
        torch.manual_seed(0)
        net = build_model(model, m["num_features"], m["num_classes"])
        net.train()
        net(sh.graph, sh.x, sh.edge_data).sum().backward()
        out[model] = sh.graph.choices()
    sh = load_shard(folder, r, k, exchange="feature", link=link)
    try:
        Mixing()(sh.graph, sh.x)
    except ValueError as err:
        out["refused"] = str(err)
    return out


def test_auto_decides_alike_on_every_rank_and_a_mixing_layer_is_refused(data):
    folder = str(prepare_shards(_cfg(data, "gcn", nprocs=2)))
    ranks = launch(auto_and_refusals, 2, folder, threads=1)
    assert ranks[0] == ranks[1]  # the same choices and predictions, to the last digit
    for model in ("gcn", "gat"):
        for lay in ranks[0][model]:
            assert lay["strategy"] in ("halo", "ring", "feature") and not lay["forced"]
            assert lay["predicted_feature_s"] is not None and lay["predicted_feature_s"] > 0
            assert lay["feature_why"] == "" and lay["structure_bytes"] > 0
            picked = min(("halo", "ring", "feature"), key=lambda s: lay[f"predicted_{s}_s"])
            assert lay["strategy"] == picked, lay
    refused = ranks[0]["refused"]
    assert refused.startswith("Mixing: --exchange feature cannot run this layer: ")
    assert "Use --exchange auto, halo or ring" in refused


def test_feature_refused_before_training_when_the_structure_does_not_fit(data):
    cfg = _cfg(data, "gcn", nprocs=2, exchange="feature", memory_budget="128KB")
    with pytest.raises(ValueError, match=r"--exchange feature keeps the whole graph on every "
                                         r"rank, and the whole graph's structure \([\d,]+ bytes "
                                         r"a rank for 2,708 vertices and [\d,]+ edges\) does "
                                         r"not fit the memory budget of 128,000 bytes"):
        train(cfg)
    with pytest.raises(ValueError, match="--halo-bits 8 quantizes the halo exchange, and "
                                         "--exchange feature transposes exact columns"):
        train(_cfg(data, "gcn", nprocs=2, exchange="feature", halo_bits=8))

