"""The feature layout in the exchange cost model, and which compiled plans split by columns
(``ngra.distributed.cost``, ``ngra.distributed.feature``); no ranks."""

from __future__ import annotations

import pytest
import torch

import ngra
from ngra.compiler import compile_layer
from ngra.distributed.cost import (PartitionStats, check_structure_fits, choose_exchange,
                                   predict_feature, structure_bytes)
from ngra.distributed.feature import ColumnSplit, column_slices, column_split, sliced_plan
from ngra.distributed.link import AlphaBeta, LinkModel
from ngra.models import build_model
from test_feature_training import Mixing  # an edge UDF whose columns mix


def _link(beta: float) -> LinkModel:
    ops = {op: AlphaBeta(1e-4, beta) for op in
           ("p2p", "all_to_all", "all_reduce", "all_gather", "broadcast")}
    return LinkModel("gloo", "cpu", 4, "test", ops, gemm_flops=1e11, gather_bytes=2e9,
                     stream_bytes=4e9, shared=1.0)


def _stats(rows: int, halo: int, local_edges: int, remote_edges: int) -> PartitionStats:
    edges = tuple(tuple(local_edges if r == j else remote_edges for j in range(4))
                  for r in range(4))
    return PartitionStats((rows,) * 4, (halo,) * 4, (halo,) * 4, edges)


def test_feature_is_priced_from_the_same_link():
    st = _stats(100_000, 250_000, 1_000_000, 1_000_000)
    link = _link(1e-9)
    n, e, k, b = 400_000, 16_000_000, 4, 256
    comm = link.all_to_all(max(100_000 * 3 / 4, 300_000 / 4) * b)
    work = link.stream_time((4 * 100_000 + 10 * n / k) * b)
    want = 4 * comm + 3 * e * b / link.gather_bytes / k + work
    assert predict_feature(st, b, link) == pytest.approx(want)
    choice = choose_exchange(st, b, link, feature=True)
    d = choice.as_dict()
    assert d["predicted_feature_s"] == pytest.approx(want)
    assert d["feature_bytes"] == 2 * 100_000 * 3 // 4 * b  # the other ranks' columns, both ways
    assert d["structure_bytes"] == structure_bytes(n, e)
    assert "feature" in choice.describe()


def test_auto_takes_feature_when_the_halo_is_the_whole_graph():
    """Every rank reads almost every other rank's rows (a power-law graph's halo): the
    transposes move a quarter of what the halo moves, and the edges split four ways."""
    st = _stats(100_000, 299_000, 1_000_000, 1_000_000)
    link = _link(1e-8)
    choice = choose_exchange(st, 256, link, overlap=True, feature=True)
    assert choice.strategy == "feature" and not choice.forced
    assert choice.feature_s < min(choice.halo_s, choice.ring_s)
    assert choice.feature_bytes < choice.halo_bytes
    # a small halo stays a halo: the transposes move every rank's rows
    small = _stats(100_000, 2_000, 1_000_000, 10_000)
    assert choose_exchange(small, 256, link, overlap=True, feature=True).strategy == "halo"
    # without a link nothing is predicted and auto keeps the halo
    assert choose_exchange(st, 256, None, feature=True).strategy == "halo"


def test_a_layer_that_does_not_split_is_never_picked_and_refused_when_forced():
    st = _stats(100_000, 299_000, 1_000_000, 1_000_000)
    link = _link(1e-8)
    why = "its edge stage is a generic UDF (apply_edge as written), whose columns may mix"
    choice = choose_exchange(st, 256, link, feature=why)
    assert choice.strategy != "feature" and choice.feature_s is None
    assert choice.as_dict()["feature_why"] == why and why in choice.describe()
    with pytest.raises(ValueError, match="--exchange feature cannot run this layer: its edge "
                                         "stage is a generic UDF"):
        choose_exchange(st, 256, link, "feature", feature=why)


def test_the_whole_structure_must_fit_the_budget():
    st = _stats(100_000, 299_000, 1_000_000, 1_000_000)
    link = _link(1e-8)
    need = structure_bytes(400_000, 16_000_000)
    assert need == 16 * 400_001 + 16 * 16_000_000
    fits = choose_exchange(st, 256, link, feature=True, budget=need)
    assert fits.strategy == "feature"
    tight = choose_exchange(st, 256, link, feature=True, budget=need - 1)
    assert tight.strategy != "feature" and "does not fit the memory budget" in tight.feature_why
    with pytest.raises(ValueError, match=f"structure \\({need:,} bytes a rank for 400,000 "
                                         "vertices and 16,000,000 edges\\) does not fit"):
        choose_exchange(st, 256, link, "feature", feature=True, budget=need - 1)
    with pytest.raises(ValueError, match="--exchange feature keeps the whole graph on every "
                                         "rank.*larger --memory-budget"):
        check_structure_fits(400_000, 16_000_000, 1 << 20)
    check_structure_fits(400_000, 16_000_000, None)  # no budget: nothing to fit


def test_column_slices_are_as_even_as_possible():
    assert column_slices(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert column_slices(8, 2) == [(0, 4), (4, 8)]
    assert sum(hi - lo for lo, hi in column_slices(7, 3)) == 7


def _plan(layer, graph, x, edata=None):
    p = compile_layer(layer, graph, x, edata)
    return p, p.pre(x).terms


@pytest.fixture(scope="module")
def small():
    torch.manual_seed(0)
    ei = torch.randint(0, 50, (2, 300))
    g = ngra.Graph.from_edge_index(ei, num_nodes=50)
    return g, torch.randn(50, 12)


def test_which_compiled_plans_split_by_columns(small):
    g, x = small
    from ngra.models import prepare
    from ngra.runtime.executor import edge_data_csc

    gcn = build_model("gcn", 12, 5).layers[0]
    gg, ed = prepare("gcn", g, None, 1)  # normalized weights as factors
    plan, terms = _plan(gcn, gg, x, edge_data_csc(gg, ed))
    split = column_split(plan, terms, 2)
    assert isinstance(split, ColumnSplit) and split.unit == "columns" and split.axis == 0
    assert split.width == terms[next(iter(split.sliced))].shape[1]
    gat = build_model("gat", 12, 5).layers
    plan, terms = _plan(gat[0], g, x)  # 8 heads of 8: split by heads
    split = column_split(plan, terms, 4)
    assert split.unit == "heads" and split.width == 8 and split.heads_dropout
    assert "3 heads" in column_split(plan, terms, 3) or \
        "divide its 8 heads" in column_split(plan, terms, 3)  # dropout per head: 8 % 3
    h = torch.randn(50, 64)
    plan, terms = _plan(gat[1], g, h)  # one head: its value's columns split
    split = column_split(plan, terms, 2)
    assert split.unit == "columns" and split.axis == 1 and split.whole
    sliced = sliced_plan(plan, 3, split.axis)
    assert sliced is not plan and sliced.program.lowering[None].weights is None
    assert plan.program.lowering[None].weights is not None  # the original is untouched


class _Elementwise(ngra.SagaLayer):
    gather = "max"

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(12, 6)

    def apply_edge(self, edge):
        return torch.relu(self.a(edge.src) + edge.dst[:, :6])

    def apply_vertex(self, vertex, acc):
        return acc


def test_a_udf_that_mixes_columns_does_not_split(small):
    g, x = small
    plan, terms = _plan(Mixing(), g, x)
    why = column_split(plan, terms, 2)
    assert isinstance(why, str) and ("mix" in why or "interpreted" in why), why
    plan, terms = _plan(_Elementwise(), g, x)
    assert isinstance(column_split(plan, terms, 2), ColumnSplit)
    assert column_split(plan, terms, 7) == "it has 6 columns, fewer than the 7 ranks"
    with ngra.compiler.disabled():
        plan, terms = _plan(_Elementwise(), g, x)
    assert "generic UDF" in column_split(plan, terms, 2)


def test_the_planner_prices_the_feature_layout_of_a_layer_that_splits():
    from ngra.planner.chain import Chain, Layer
    from ngra.planner.cost import BYTES, Shape, graph_exchange, layer_cost

    link = _link(1e-9)
    lin = Layer("w", "linear", 64, 64, param_bytes=4 * 64 * 64, saved_width=64)

    def chain(feature_width):
        g = Layer("g", "graph", 64, 64, edges=100_000, read_width=64, exchange_width=64,
                  feature_width=feature_width)
        return Chain("gnn", (lin, g), 10_000, 64, halo=((2, 5_000), (4, 7_500)))

    whole = chain(64)
    assert Chain.from_json(whole.to_json()) == whole  # the width travels in plan files
    layout, s = graph_exchange(whole, whole.layers[1], link, 4)
    want = 2 * link.all_to_all(10_000 / 4 * 3 / 4 * 64 * BYTES, 4)
    assert layout == "feature" and s == pytest.approx(want)
    f, b, _, _ = layer_cost(whole, 1, link, Shape(1, 4, 1, 1), "rep")
    assert f[4] == b[4] == pytest.approx(want)
    # a layer that does not split, or splits over fewer columns than ranks: the halo
    halo = link.all_to_all(7_500 * 64 * BYTES, 4)
    for width in (0, 3):
        c = chain(width)
        assert graph_exchange(c, c.layers[1], link, 4) == ("halo", pytest.approx(halo))
    # a small halo costs less than the transposes
    small = Chain("gnn", whole.layers, 10_000, 64, halo=((4, 100),))
    assert graph_exchange(small, small.layers[1], link, 4)[0] == "halo"


def test_the_planner_reads_which_zoo_layers_split(small):
    from ngra.models import prepare
    from ngra.planner.gnn import gnn_chain

    g, x = small
    widths = {}
    for name in ("gcn", "gat"):
        gg, ed = prepare(name, g, None, 1)
        chain = gnn_chain(build_model(name, 12, 5), gg, x, ed, parts=(2,))
        widths[name] = [lay.feature_width for lay in chain.layers if lay.kind == "graph"]
    # GCN aggregates its 12 inputs (the Linear sunk past the gather); GAT 8 heads, then one
    # head's 5 columns
    assert widths == {"gcn": [12, 5], "gat": [8, 5]}
