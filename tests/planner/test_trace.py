"""Chains from modules (torch.fx) and from compiled GNN plans."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ngra.planner.trace import TraceError, trace_module


def test_an_mlp_becomes_a_chain():
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 8))
    chain = trace_module(model, 1000)
    assert [(x.name, x.kind, x.in_width, x.out_width) for x in chain.layers] == [
        ("0", "linear", 16, 64), ("1", "elementwise", 64, 64), ("2", "elementwise", 64, 64),
        ("3", "linear", 64, 8)]
    assert chain.layers[0].param_bytes == 4 * (16 * 64 + 64)
    assert chain.layers[3].module == "3" and chain.layers[3].splits == ("col", "row")
    assert chain.rows == 1000 and chain.input_width == 16
    assert chain.grad_flows == (False, True, True, True)


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.norm = nn.Linear(8, 8), nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(x + self.b(torch.relu(self.a(x))))


def test_a_residual_block_is_a_dag():
    chain = trace_module(_Residual(), 100)
    names = [x.name for x in chain.layers]
    assert names == ["a", "relu", "b", "add", "norm"]
    assert chain.inputs(3) == (-1, 2)  # x + b(...)
    assert chain.cut_width(1) == 16  # x waits for the add beside a's output
    assert not chain.chained(3)


class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()

    def forward(self, x):
        return self.inner(x)


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.lin(x)
        return x


@pytest.mark.parametrize("model,match", [
    (_Branchy(), r"cannot trace layer 'inner' \(_Inner\).*control flow"),
    (nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), r"layer '1' \(BatchNorm1d\).*mixes rows"),
    (nn.Sequential(nn.Linear(4, 4), nn.LSTM(4, 4)), r"layer '1' \(LSTM\) is not a dense layer"),
    (nn.Sequential(nn.ReLU()), r"no nn.Linear to take the input width from"),
])
def test_what_the_tracer_cannot_read_is_named(model, match):
    with pytest.raises(TraceError, match=match):
        trace_module(model, 10)


def test_gnn_chains_from_compiled_plans():
    from ngra.datasets import load
    from ngra.models import build_model, prepare
    from ngra.partition import edge_balanced_ranges
    from ngra.planner.gnn import gnn_chain

    ds = load("sbm:nodes=400,blocks=4")
    chains = {}
    for name in ("gcn", "ggcn", "gat", "gin"):
        graph, edge_data = prepare(name, ds.graph)
        net = build_model(name, ds.x.shape[1], ds.num_classes, hidden=64)
        chains[name] = gnn_chain(net, graph, ds.x, edge_data, parts=(2, 4))
        assert chains[name].rows == 400
        assert [p for p, _ in chains[name].halo] == [2, 4]
    graph, _ = prepare("gcn", ds.graph)
    # the default halo: remote sources of the busiest of 2 edge-balanced ranges
    _, mid, _ = edge_balanced_ranges(graph.indptr.to(torch.int64), 2).tolist()
    src = graph.indices.to(torch.int64)
    first = torch.unique(src[: int(graph.indptr[mid])])
    second = torch.unique(src[int(graph.indptr[mid]):])
    want = max(int((first >= mid).sum()), int((second < mid).sum()))
    assert dict(chains["gcn"].halo)[2] == want > 0
    # G-GCN: the gate's Linears are hoisted to pre (run whole); ApplyVertex's w can split;
    # the graph layer reads x and W_C x from sources and W_H x at destinations
    ggcn = {x.name: x for x in chains["ggcn"].layers}
    assert ggcn["layers.0.w_h"].splits == () and ggcn["layers.0.w"].splits == ("col", "row")
    assert ggcn["layers.0.w"].module == "layers.0.w"
    graph0 = ggcn["layers.0.graph(sum)"]
    width = ds.x.shape[1]
    assert graph0.exchange_width == 2 * width and graph0.read_width == 3 * width
    # GAT: the exchanged source rows carry the transformed value and its score
    gat = [x for x in chains["gat"].layers if x.kind == "graph"][0]
    assert gat.exchange_width == 8 * 64 + 8
    # GIN's ApplyVertex reads the layer input beside the gathered rows: a DAG
    gin = chains["gin"]
    mix = [i for i, x in enumerate(gin.layers) if x.kind == "other"][0]
    assert len(gin.inputs(mix)) == 2
    assert [x.splits for x in gin.layers if x.kind == "linear"][0] == ("col", "row")


def test_gnn_chain_wants_a_zoo_model():
    from ngra.planner.gnn import gnn_chain

    with pytest.raises(TypeError, match="reads a zoo GNN"):
        gnn_chain(nn.Linear(2, 2), None, torch.zeros(2, 2))
