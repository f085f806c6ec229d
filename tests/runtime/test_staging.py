"""Tile staging: local ids and reverse structures, the cost rule, forced modes, and
gradients that never make an N x F tensor per tile."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ngra import Graph, SagaLayer, kernels
from ngra.models import GCNConv
from ngra.partition import tile_graph
from ngra.runtime import staging
from ngra.runtime.budget import grid_shape
from ngra.runtime.staging import (
    GATHER_FRACTION,
    Stager,
    choose_mode,
    local_view,
    staging_mode,
    staging_summary,
)
from ngra.runtime.tiles import grid_from_tiles, whole_graph_grid

N, F = 300, 8


def _graph(seed: int = 0, n: int = N, m: int = 3000) -> Graph:
    g = torch.Generator().manual_seed(seed)
    return Graph.from_edge_index(torch.randint(0, n, (2, m), generator=g), num_nodes=n)


@pytest.mark.parametrize("mode", ["gather", "span"])
def test_local_view_indexes_the_staged_rows(mode):
    g = _graph(n=60, m=200)
    src_all, dst_all = g.indices, g.dst_index()
    for tile in tile_graph(g, 3, 4):
        view, rows = local_view(tile, mode)
        staged = rows.take(torch.arange(g.num_nodes))  # global id of each staged row
        ids = view.edge_ids
        assert torch.equal(staged[view.src_idx], src_all[ids])
        assert torch.equal(view.dst_idx + view.dst_lo, dst_all[ids])
        assert view.rev[0].numel() == staged.numel() + 1 < g.num_nodes + 1
        want = kernels.transpose_csc(view.indptr, view.src_idx, staged.numel())
        for a, b in zip(view.rev, want):
            assert torch.equal(a, b.long())
        assert (rows.index is not None) == (mode == "gather")


def test_cost_rule_and_forcing():
    assert choose_mode(10, 100) == "gather"
    assert choose_mode(int(GATHER_FRACTION * 100), 100) == "span"
    assert choose_mode(100, 100, "gather") == "gather"
    assert choose_mode(1, 100, "span") == "span"
    with pytest.raises(ValueError, match="staging mode"), staging_mode("copy"):
        pass


def test_whole_graph_staging_is_the_identity():
    g = _graph()
    x = {"a": torch.randn(N, 3), "b": torch.randn(N, 2)}
    w = torch.randn(g.num_edges)
    (tile,) = whole_graph_grid(g).columns[0]
    st = Stager(x, w).stage(tile)
    assert st.mode == "whole" and st.edata is w
    for k, v in x.items():
        assert st.src[k] is v and st.dst[k] is v


def test_only_the_sides_read_are_staged():
    g = _graph()
    x = {"a": torch.randn(N, 3), "b": torch.randn(N, 2)}
    tile = tile_graph(g, 2, 2).tiles[0]
    st = Stager(x, None, reads=({"a"}, {"b"})).stage(tile)
    assert set(st.src) == {"a"} and set(st.dst) == {"b"}
    assert st.dst["b"].shape[0] == tile.dst_hi - tile.dst_lo


@pytest.mark.parametrize("forced", [None, "gather", "span"])
def test_forced_modes_reach_the_executor(forced, monkeypatch):
    g = _graph()
    seen = []
    real = staging.local_view
    monkeypatch.setattr(staging, "local_view", lambda t, m: seen.append(m) or real(t, m))
    layer = GCNConv(F, F)
    gg = g.gcn_norm()
    with grid_shape(3, 3), staging_mode(forced):
        layer(gg, torch.randn(N, F), gg.edge_weight_original())
    assert seen and (forced is None or set(seen) == {forced})
    grid = grid_from_tiles(gg, tile_graph(gg, 3, 3))
    line = staging_summary(grid, forced)
    assert f"of {grid.num_tiles} tiles gather" in line
    if forced is not None:
        assert f"{seen.count('gather')} of" in line


class _NRows(TorchDispatchMode):
    """Counts the new floating tensors with N rows made by the ops it sees (outputs that
    alias an input, such as in-place updates and views, are not new)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [a for a in list(args) + list((kwargs or {}).values())
                  if isinstance(a, torch.Tensor)]
        seen = {a.untyped_storage().data_ptr() for a in inputs}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[0] == N
                    and t.is_floating_point() and t.untyped_storage().data_ptr() not in seen):
                self.count += 1
        return out


class _Tanh(SagaLayer):  # a generic edge stage: recomputed tile by tile in backward
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(F, F)

    def apply_edge(self, edge):
        return torch.tanh(self.lin(edge.src) - edge.dst)


@pytest.mark.parametrize("forced", ["gather", "span"])
@pytest.mark.parametrize("name", ["gcn", "generic"])
def test_backward_makes_no_n_by_f_tensor_per_tile(name, forced):
    """The number of [N, F] tensors backward makes does not grow with the tile count
    (per tile, gradients are the staged rows, added into one gradient per term)."""
    g = _graph()
    layer, graph = (GCNConv(F, F), g.gcn_norm()) if name == "gcn" else (_Tanh(), g)
    counts = []
    for shape in [(3, 3), (6, 6)]:
        x = torch.randn(N, F, requires_grad=True)
        with grid_shape(*shape), staging_mode(forced):
            out = layer(graph, x)
        with _NRows() as probe:
            out.backward(torch.ones_like(out))
        counts.append(probe.count)
    assert counts[0] == counts[1] < 9, counts


def test_explain_reports_the_grid_and_its_staging():
    import ngra

    g = _graph().gcn_norm()
    with grid_shape(3, 3), staging_mode("gather"):
        text = ngra.explain(GCNConv(F, F), g)
    assert "grid    3 x 3 (9 tiles); staging: 9 of 9 tiles gather their source rows" in text
    assert "grid " not in ngra.explain(GCNConv(F, F), g)
