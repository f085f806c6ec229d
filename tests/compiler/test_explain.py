"""``ngra.explain`` and the ``ngra explain`` / ``ngra train --explain`` CLI."""

from __future__ import annotations

import pytest
import torch
from _compiler_cases import make_graph

import ngra
from ngra import compiler
from ngra.models import GATConv, GCNConv, GGCNConv, GGNNConv, build_model, prepare


def test_explain_ggcn_mentions_hoisted_terms_and_kernel():
    g = make_graph("random")
    text = ngra.explain(GGCNConv(8, 4), g)
    assert "hoist    fired" in text
    assert "t0 = w_h(edge.dst)  [N, 8]" in text and "t1 = w_c(edge.src)  [N, 8]" in text
    assert "fused_edge_aggregate(sigmoid(dst0 + src0) * src1" in text
    assert "no [E, F] tensor" in text


def test_explain_gat_shows_shared_linear_and_softmax_aggregate():
    text = ngra.explain(GATConv(8, 4, heads=2), make_graph("self_loops"))
    assert "lin(edge.src) and lin(edge.dst) are the same lin(x)" in text
    assert "softmax_aggregate(score_src=t1, score_dst=t2, value=t0" in text
    assert "[N, 2]" in text and "[N, 2, 4]" in text


def test_explain_gcn_reorder_widths():
    g = make_graph("random").gcn_norm()
    text = ngra.explain(GCNConv(16, 4), g)
    assert "transform-then-propagate: lin (16 -> 4)" in text
    assert "gspmm(t0, edge_feat=[E], reduce=sum)" in text
    wide = ngra.explain(GCNConv(4, 16), g)
    assert "propagate-then-transform: lin maps 4 -> 16" in wide


def test_explain_typed_and_disabled():
    g = make_graph("random")
    et = torch.randint(0, 2, (g.num_edges,))
    text = ngra.explain(GGNNConv(5, 2), g, edge_data=et)
    assert "gspmm over N*2 virtual sources (typed)" in text
    with compiler.disabled():
        assert "generic UDF executor (compilation disabled" in ngra.explain(GGNNConv(5, 2), g,
                                                                             edge_data=et)


def test_explain_model_lists_every_layer():
    g = make_graph("random")
    model = build_model("gcn", 6, 3, hidden=4)
    pg, ed = prepare("gcn", g)
    text = ngra.explain(model, pg, torch.randn(g.num_nodes, 6), ed)
    assert "== layers.0 ==" in text and "== layers.1 ==" in text
    assert model.training  # restored
    with pytest.raises(ValueError, match="needs its input x"):
        ngra.explain(model, pg)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NGRA_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_cli_explain(capsys, tmp_cache):
    from ngra.cli import main

    assert main(["explain", "--model", "ggcn", "--dataset", "sbm:nodes=60,blocks=2,feat=6",
                 "--hidden", "8"]) == 0
    out = capsys.readouterr().out
    assert "ngra explain: ggcn on sbm" in out and "fused_edge_aggregate" in out


def test_cli_train_explain(capsys, tmp_cache):
    from ngra.cli import main

    assert main(["train", "--model", "gat", "--dataset", "sbm:nodes=60,blocks=2,feat=6",
                 "--epochs", "2", "--explain", "--no-progress",
                 "--out", str(tmp_cache / "s.json")]) == 0
    out = capsys.readouterr().out
    assert out.index("softmax_aggregate") < out.index("test_acc")
