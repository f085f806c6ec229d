"""Analytic FLOPs and bytes against hand computations on a small hand-made graph."""

from __future__ import annotations

import pytest
import torch

import ngra
from ngra.characterize.metrics import Count, LayerDims, layer_counts, layer_dims, model_counts
from ngra.characterize.workloads import build_ngra, prepare_workload, synthetic_edge_types

# The hand-made graph: 4 vertices, 6 directed edges (each vertex receives 1 or 2).
#   0 -> 1, 1 -> 2, 2 -> 0, 0 -> 2, 3 -> 1, 2 -> 3
EDGES = torch.tensor([[0, 1, 2, 0, 3, 2], [1, 2, 0, 2, 1, 3]])
N, E = 4, 6
FLOAT, INDEX = 4, 8


def test_gcn_layer_by_hand():
    # GCN layer 5 -> 3: propagate min(5, 3) = 3 columns (transform first).
    c = layer_counts(LayerDims("gcn", 5, 3), N, E)
    p = 3
    # Scatter: read one 3-wide row per edge (6*3 floats), the source index (6 int64),
    # write the [6, 3] per-edge tensor. No arithmetic.
    assert c["Scatter"] == Count(0, 6 * 3 * FLOAT + 6 * INDEX + 6 * 3 * FLOAT)  # 192 B
    # ApplyEdge: src * w, one multiply per element (18); read [6,3] + 6 weights, write [6,3].
    assert c["ApplyEdge"] == Count(18, 72 + 24 + 72)
    # Gather (sum): 18 adds; read [6,3], indptr (N+1 int64), write [4,3].
    assert c["Gather"] == Count(18, 72 + 5 * INDEX + 4 * p * FLOAT)  # 160 B
    # ApplyVertex: 4x5 @ 5x3 = 2*4*5*3 = 120 FLOPs + 12 bias adds; read x (4*5), W and b
    # (15 + 3), write 4*3.
    assert c["ApplyVertex"] == Count(132, 80 + 72 + 48)
    # Fused g-SpMM (u_mul_e, sum): 18 multiplies + 18 adds; gathered rows + index + weights
    # + indptr + result, no per-edge tensor written.
    f = layer_counts(LayerDims("gcn", 5, 3), N, E, fused=True)
    assert f["Gather"] == Count(36, 72 + 48 + 24 + 40 + 48)  # 232 B
    assert f["Scatter"] == Count(0, 0) and f["ApplyEdge"] == Count(0, 0)
    assert f["ApplyVertex"] == c["ApplyVertex"]


def test_gat_layer_by_hand():
    # GAT layer 5 -> 2 heads x 3: hd = 6.
    c = layer_counts(LayerDims("gat", 5, 3, heads=2), N, E)
    # ApplyEdge, hoisted per vertex: W x = 2*4*5*6 = 240 FLOPs; a_src.Wx and a_dst.Wx:
    # 2 dot products of width 3 per head per vertex = 2 * (4*6 mul + 4*6 add) = 96.
    # bytes: x 80, W 120, write Wx 96, read Wx 96, a_src/a_dst 48, write el/er 2*4*2*4 = 64.
    hoisted = Count(336, 80 + 120 + 96 + 96 + 48 + 64)
    # ApplyEdge per edge: el[src] + er[dst] and leaky_relu: 2 * E * heads = 24 FLOPs;
    # read the two gathered [6, 2] score terms, write [6, 2].
    per_edge = Count(24, 2 * 6 * 2 * FLOAT + 6 * 2 * FLOAT)
    assert c["ApplyEdge"] == hoisted + per_edge
    # Scatter: Wx[src] (6), el[src] (2), er[dst] (2) per edge: 10 floats read and written,
    # plus source and destination indices.
    assert c["Scatter"] == Count(0, 2 * 6 * 10 * FLOAT + 2 * 6 * INDEX)  # 576 B
    # Gather (softmax): max, subtract, exp, sum over E*heads scores (4*12 = 48), weighted
    # values: multiply + add over E*hd (72), normalize N*hd (24) = 144 FLOPs.
    # bytes: scores 48, values 144, indptr 40, result 96.
    assert c["Gather"] == Count(144, 48 + 144 + 40 + 96)
    # ApplyVertex: + bias on [4, 6].
    assert c["ApplyVertex"] == Count(24, 2 * 4 * 6 * FLOAT + 6 * FLOAT)
    # Fused softmax aggregation: per-edge score (24) + softmax gather (144) = 168 FLOPs;
    # reads Wx[src] (144 B), el[src] (48), er per destination (32), index (48), indptr (40);
    # writes the result (96).
    f = layer_counts(LayerDims("gat", 5, 3, heads=2), N, E, fused=True)
    assert f["Gather"] == Count(168, 144 + 48 + 32 + 48 + 40 + 96)
    assert f["ApplyEdge"] == hoisted and f["Scatter"] == Count(0, 0)


def test_model_counts_sum_layers_and_training_adds_backward():
    layers = [LayerDims("gcn", 5, 3), LayerDims("gcn", 3, 2)]
    inf = model_counts(layers, N, E)
    one, two = layer_counts(layers[0], N, E), layer_counts(layers[1], N, E)
    for s in inf:
        assert inf[s] == one[s] + two[s]
    tr = model_counts(layers, N, E, training=True)
    # backward = 2x forward, except Scatter: a scatter-add of the gathered elements
    assert tr["Gather"] == inf["Gather"].scale(3, 3)
    assert tr["ApplyVertex"] == inf["ApplyVertex"].scale(3, 3)
    gathered = E * 3 + E * 2
    assert tr["Scatter"] == Count(gathered, 2 * inf["Scatter"].bytes)
    assert inf["Gather"].intensity == pytest.approx(inf["Gather"].flops / inf["Gather"].bytes)
    with pytest.raises(ValueError, match="one flag per layer"):
        model_counts(layers, N, E, fused=[True])


def test_counts_follow_the_prepared_workload():
    # GCN on the hand-made graph: prepare() adds one self-loop per vertex: E = 6 + 4.
    g = ngra.Graph.from_edge_index(EDGES, num_nodes=N)

    class DS:  # the NodeDataset fields prepare_workload reads
        name, graph, x = "hand", g, torch.randn(N, 5)
        y, train_mask = torch.tensor([0, 1, 0, 1]), torch.ones(N, dtype=torch.bool)
        num_classes, edge_type, num_edge_types = 2, None, 1

    w = prepare_workload(DS, "gcn", hidden=3)
    assert (w.num_nodes, w.num_edges) == (4, 10)
    assert w.layers == [LayerDims("gcn", 5, 3), LayerDims("gcn", 3, 2)]
    c = model_counts(w.layers, w.num_nodes, w.num_edges)
    # layer 1 propagates 3 columns, layer 2 propagates 2: 10 * (3 + 2) multiplies in ApplyEdge
    assert c["ApplyEdge"].flops == 10 * 3 + 10 * 2
    # GAT: hidden 16 = 8 heads x 2, then one head of num_classes
    wg = prepare_workload(DS, "gat", hidden=16)
    assert wg.layers == [LayerDims("gat", 5, 2, heads=8), LayerDims("gat", 16, 2, heads=1)]
    net = build_ngra(wg)
    assert net.layers[0].heads == 8 and net.layers[0].f_out == 2
    # typed models on an untyped dataset get 3 deterministic, direction-symmetric types
    wr = prepare_workload(DS, "rgcn", hidden=4)
    assert wr.num_types == 3 and wr.notes
    t = synthetic_edge_types(g)
    assert torch.equal(t, synthetic_edge_types(g)) and int(t.max()) < 3
    sym = ngra.Graph.from_edge_index(torch.tensor([[0, 1], [1, 0]]), num_nodes=2)
    ts = synthetic_edge_types(sym)
    assert ts[0] == ts[1]


def test_layer_dims_rejects_unknown_models():
    with pytest.raises(ValueError, match="no analytic model"):
        layer_dims("mpnn", 4, 8, 2)
    assert len(layer_dims("ggnn", 7, 8, 2, num_types=3)) == 2
