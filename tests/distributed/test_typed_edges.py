"""Models that read typed edges (R-GCN) train on several ranks as on one process: each
shard keeps its edges' types in local CSC order (``DistGraph.to_csc_order``)."""

from __future__ import annotations

import pytest
import torch

import ngra

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(600)]

SPEC = "sbm:nodes=500,blocks=3,feat=8,edge_types=3"


def test_rgcn_node_classification_on_two_ranks_equals_one_process(tmp_path, monkeypatch):
    monkeypatch.setenv("NGRA_CACHE", str(tmp_path))
    kw = dict(epochs=4, seed=0, progress=False, threads=1)
    one = ngra.fit("rgcn", SPEC, **kw)
    two = ngra.fit("rgcn", SPEC, nprocs=2, **kw)
    la = [h["loss"] for h in one.summary["history"]]
    lb = [h["loss"] for h in two.summary["history"]]
    assert lb == pytest.approx(la, rel=1e-4, abs=1e-5)
    assert two.summary["test_acc"] == one.summary["test_acc"]
    for k, v in one.model.state_dict().items():
        torch.testing.assert_close(two.model.state_dict()[k], v, rtol=1e-3, atol=1e-5)
