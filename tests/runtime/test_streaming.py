"""Chunked streaming == whole-graph execution, forward, backward and training,
with tiles staged by gathering their source rows and by slicing their span."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ngra
from ngra import Graph, SagaLayer, compiler
from ngra.models import MODELS, build_model, prepare
from ngra.runtime.budget import grid_shape
from ngra.runtime.device_schedule import device_streaming
from ngra.runtime.staging import staging_mode

N = 48
SHAPES = [(2, 1), (1, 3), (3, 2)]


def _graph(seed: int) -> Graph:
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, 300), generator=g)
    ei = torch.cat([ei, torch.tensor([[5, 5, 7], [5, 5, 9]])], 1)  # self-loop, multi-edge
    ei = ei[:, ei[1] != N - 1]  # an isolated destination
    return Graph.from_edge_index(ei, num_nodes=N)


def _double(d):
    if isinstance(d, torch.Tensor):
        return d.double() if d.is_floating_point() else d
    if isinstance(d, dict):
        return {k: _double(v) for k, v in d.items()}
    return d


def _setup(name: str, seed: int):
    g = _graph(seed)
    types = 3 if name in ("ggnn", "rgcn") else 1
    et = torch.randint(0, types, (g.num_edges,)) if types > 1 else None
    pg, ed = prepare(name, g, et, types)
    torch.manual_seed(seed)
    model = build_model(name, 5, 3, hidden=8, heads=2 if name == "gat" else None,
                        num_edge_types=types).double()
    return pg, _double(ed), model


def _grads(out, model, x, go):
    ps = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(out, [x] + ps, go, allow_unused=True)


@pytest.mark.parametrize("staging", ["gather", "span"])
@pytest.mark.parametrize("mode", ["compiled", "generic"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_chunked_equals_whole_graph(name, mode, staging):
    seed = int(torch.randint(1 << 20, ()))
    pg, ed, model = _setup(name, seed)
    model.eval()
    x = torch.randn(N, 5, dtype=torch.float64, requires_grad=True)
    ctx = compiler.disabled() if mode == "generic" else contextlib.nullcontext()
    with ctx:
        out = model(pg, x, ed)
        go = torch.randn_like(out)
        ref = _grads(out, model, x, go)
        for shape in SHAPES:
            with grid_shape(*shape), staging_mode(staging):
                out2 = model(pg, x, ed)
            what = f"{name} {shape} {staging}"
            torch.testing.assert_close(out2, out, msg=f"{what} forward (seed {seed})")
            for a, b in zip(_grads(out2, model, x, go), ref):
                if a is None or b is None:
                    assert a is None and b is None or (a if b is None else b).abs().max() == 0
                    continue
                torch.testing.assert_close(a, b, msg=f"{what} backward (seed {seed})")


@pytest.mark.parametrize("name", ["gcn", "gat", "mpnn"])
def test_chunked_training_losses_match(name):
    seed = int(torch.randint(1 << 20, ()))
    pg, ed, model = _setup(name, seed)
    x = torch.randn(N, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (N,))
    init = {k: v.clone() for k, v in model.state_dict().items()}

    def run(shape):
        model.load_state_dict(init)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        torch.manual_seed(seed)  # dropout masks must match too
        losses = []
        for _ in range(5):
            opt.zero_grad()
            with grid_shape(*shape) if shape else contextlib.nullcontext():
                loss = F.cross_entropy(model(pg, x, ed), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    whole = run(None)
    for shape in SHAPES:
        assert run(shape) == pytest.approx(whole, rel=1e-9, abs=1e-12), shape


class _Reducer(SagaLayer):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def apply_edge(self, edge):
        return torch.tanh(self.lin(edge.src) - edge.dst)

    def apply_vertex(self, vertex, acc):
        return acc * 2


@pytest.mark.parametrize("staging", ["gather", "span"])
@pytest.mark.parametrize("how", ["sum", "mean", "max", "min"])
def test_every_gather_streams(how, staging):
    layer = type(f"R_{how}", (_Reducer,), {"gather": how})().double()
    g = _graph(int(torch.randint(1 << 20, ())))
    x = torch.randn(N, 4, dtype=torch.float64, requires_grad=True)
    out = layer(g, x)
    go = torch.randn_like(out)
    ref = torch.autograd.grad(out, [x, layer.lin.weight], go)
    with grid_shape(3, 3), staging_mode(staging):
        out2 = layer(g, x)
    torch.testing.assert_close(out2, out)
    for a, b in zip(torch.autograd.grad(out2, [x, layer.lin.weight], go), ref):
        torch.testing.assert_close(a, b)


class _Tied(SagaLayer):
    """Messages equal to ``b`` exactly wherever the ReLU is all zero: extremes that
    several tiles of a column hold at once."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.b = nn.Parameter(torch.randn(4))

    def apply_edge(self, edge):
        return torch.relu(self.lin(edge.src)) + self.b


@pytest.mark.parametrize("mode", ["compiled", "generic"])
@pytest.mark.parametrize("how", ["max", "min"])
def test_extreme_ties_across_tiles_get_the_gradient_once(how, mode):
    """A tie's gradient goes to the first tile that holds it, as the kernels give it to
    the first extreme edge: not once per tile (which doubled ``b``'s gradient)."""
    layer = type(f"T_{how}", (_Tied,), {"gather": how})().double()
    with torch.no_grad():
        layer.lin.bias.fill_(-1.0)  # with x in [0, 0.1): every ReLU zero, every message b
    g = _graph(int(torch.randint(1 << 20, ())))
    x = (torch.rand(N, 4, dtype=torch.float64) * 0.1).requires_grad_()
    ctx = compiler.disabled() if mode == "generic" else contextlib.nullcontext()
    with ctx:
        out = layer(g, x)
        go = torch.randn_like(out)
        ref = torch.autograd.grad(out, [x, layer.lin.weight, layer.b], go)
        has = (g.in_degrees() > 0).unsqueeze(1).double()
        torch.testing.assert_close(ref[2], (go * has).sum(0))  # each extreme is b, once
        for shape in ((3, 3), (4, 1)):
            for staging in ("gather", "span"):
                with grid_shape(*shape), staging_mode(staging):
                    out2 = layer(g, x)
                got = torch.autograd.grad(out2, [x, layer.lin.weight, layer.b], go)
                for a, b in zip(got, ref):
                    torch.testing.assert_close(a, b, msg=lambda m: f"{shape} {staging}: {m}")
        with device_streaming("cpu", parts=3):
            out3 = layer(g, x)
        got = torch.autograd.grad(out3, [x, layer.lin.weight, layer.b], go)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, msg=lambda m: f"device streaming: {m}")


class _DropEdge(SagaLayer):
    def apply_edge(self, edge):
        return F.dropout(edge.src, 0.5, self.training)


def test_recompute_replays_dropout():
    g = _graph(3)
    x = torch.randn(N, 4, dtype=torch.float64, requires_grad=True)
    layer = _DropEdge()
    with grid_shape(2, 2):
        torch.manual_seed(0)
        out = layer(g, x)
        (gx,) = torch.autograd.grad(out, x, torch.ones_like(out))
    with compiler.disabled():
        torch.manual_seed(0)
        # same masks per tile only under the same grid; check the gradient is the
        # mask-weighted out-degree the forward actually used: d out / d x = sum of kept edges
        with grid_shape(2, 2):
            out_b = layer(g, x)
    torch.testing.assert_close(out_b, out)
    # each kept edge (scaled by 2) contributes 2 to d sum(out) / d x[src]; the forward
    # sum equals sum over kept edges of 2 * x[src]: consistent only if backward replayed the masks
    torch.testing.assert_close((gx * x).sum(), out.sum())


def test_memory_budget_picks_a_grid_and_explains_too_small():
    g = _graph(0)
    layer = _Reducer().double()
    type(layer).gather = "sum"
    x = torch.randn(N, 4, dtype=torch.float64)
    ref = layer(g, x)
    with ngra.memory_budget("40KB"):
        out = layer(g, x)
    torch.testing.assert_close(out, ref)
    with pytest.raises(ValueError, match="budget"):
        with ngra.memory_budget(64):
            layer(g, x)


def _costs(name: str, f: int = 8, grad: bool = False):
    from ngra.compiler import compile_layer
    from ngra.runtime.budget import measure_tile_cost
    from ngra.runtime.executor import edge_data_csc
    from ngra.runtime.staging import plan_parameters

    graph, edge_data = prepare(name, _graph(1))
    layer = build_model(name, f, 3).layers[0]
    x = torch.randn(N, f, requires_grad=grad)
    edata = edge_data_csc(graph, edge_data)
    plan = compile_layer(layer, graph, x, edata)
    terms, params = plan.pre(x).terms, plan_parameters(plan)
    cost = measure_tile_cost(plan, graph, terms, edata, params)
    return graph, edge_data, layer, x, (plan, graph, terms, edata, params), cost


def test_a_budget_the_whole_layer_fits_walks_the_whole_graph():
    """The 1 x 1 grid stages, copies and indexes nothing: priced so, it is taken whenever it
    fits, also where the tiles' cost model (staged rows, index arrays) would have tiled."""
    from ngra.runtime.budget import grid_for

    graph, edge_data, layer, x, args, cost = _costs("gcn", grad=True)
    n, e = graph.num_nodes, graph.num_edges
    fits, tiled = cost.whole.tile_bytes(n, n, e), cost.tiles.tile_bytes(n, n, e)
    assert fits < tiled  # no staged rows, no index arrays, no accumulator beside the output
    # g-SpMM creates nothing per edge: the lean transpose, an int32 id an edge (no positions:
    # its backward reads no edge data) and an offset a row; the graph's own indices that it
    # saves are not counted again
    assert cost.whole.bytes_per_edge == 4 and cost.whole.bytes_per_dst_row == 4
    # with its backward walking the CSC: no transpose, nothing per edge or row
    assert cost.whole_walk.bytes_per_edge == 0 and cost.whole_walk.bytes_per_dst_row == 0
    # an input that needs no gradient: no backward over the graph at all
    assert _costs("gcn")[-1].whole.bytes_per_edge == 0
    between = int((fits + tiled) / 2)
    grid, choice, walk = grid_for(*args, between)
    assert choice.shape == (1, 1) and grid.num_tiles == 1 and not walk
    # too tight for the transpose: still the whole graph, its backward walking the CSC
    grid, choice, walk = grid_for(*args, int(fits * 0.95))
    assert choice.shape == (1, 1) and grid.num_tiles == 1 and walk
    ref = layer(graph, x, edge_data)
    ref_grad = torch.autograd.grad(ref.sum(), x)[0]
    for budget, transposed in ((between, True), (int(fits * 0.95), False)):
        graph, edge_data = prepare("gcn", _graph(1))  # the same graph, no transpose made yet
        with ngra.memory_budget(budget):
            out = layer(graph, x, edge_data)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0], ref_grad)
        assert graph.deferred_csr().built == transposed


def test_the_whole_graph_counts_what_the_edge_stage_creates_and_saves():
    """Priced from what the sample tile's forward and backward create per edge (seen by a
    dispatch mode, not only what autograd saves) and what it saves per row; measuring leaves
    the layer's own autograd graph intact (the sample's backward stops at the terms)."""
    from ngra.runtime.budget import TRANSPOSE_BYTES_PER_EDGE

    _, _, _, _, _, gcn = _costs("gcn")
    assert gcn.whole.bytes_per_edge < 4 * TRANSPOSE_BYTES_PER_EDGE  # g-SpMM: ids at most
    graph, edge_data, layer, x, (plan, _, terms, edata, params), mpnn = _costs("mpnn", f=16)
    assert mpnn.whole.bytes_per_edge > gcn.whole.bytes_per_edge
    assert mpnn.whole.bytes_per_dst_row > 0  # the edge program's per-row state for backward
    *_, gat = _costs("gat")
    assert gat.whole.bytes_per_edge >= 2 * TRANSPOSE_BYTES_PER_EDGE  # its backward reads perm
    x = x.requires_grad_()
    with ngra.memory_budget(int(1e9)):  # measured inside a live forward...
        out = layer(graph, x, edge_data)
    out.sum().backward()  # ...whose backward still runs
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_the_whole_graph_is_priced_from_the_kernels_it_runs():
    """The 1 x 1 grid's price is measured on a small graph run whole (the first vertices'
    induced subgraph), so GAT's is its fused ``attention_aggregate`` (nothing per edge but the
    transpose with positions), not the tile kernel's edge buffers; it then fits budgets its
    tiles would not."""
    from ngra.runtime.budget import PERM_BYTES_PER_EDGE, TRANSPOSE_BYTES_PER_EDGE

    graph, edge_data, layer, x, args, gat = _costs("gat", grad=True)
    assert gat.whole.bytes_per_edge <= TRANSPOSE_BYTES_PER_EDGE + PERM_BYTES_PER_EDGE
    assert gat.tiles.bytes_per_edge > 4 * gat.whole.bytes_per_edge
