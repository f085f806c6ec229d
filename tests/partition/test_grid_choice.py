"""The grid choice: the cost formula by hand, smallest fitting grid, the too-small error."""

from __future__ import annotations

import re

import pytest
import torch

import ngra
from ngra.partition import (
    TileBytes,
    choose_grid,
    cost_bounds,
    format_bytes,
    grid_peak_bytes,
    parse_bytes,
    tile_graph,
)
from ngra.partition import grid_choice as budget_mod

from partition_cases import CASES


def brute_peak(g: ngra.Graph, cost: TileBytes, p: int, q: int) -> int:
    """Peak of grid p x q straight from built tiles and the documented formula."""
    d_b, s_b = cost_bounds(g, p, q, cost)
    grid = tile_graph(g, dst_bounds=d_b, src_bounds=s_b)
    peak = cost.fixed
    for t in grid:
        peak = max(
            peak,
            cost.fixed
            + cost.prefetch_factor * cost.bytes_per_src_row * t.num_src_rows
            + cost.bytes_per_dst_row * t.num_dst
            + cost.bytes_per_edge * t.num_edges,
        )
    for c in range(p):  # a column without edges still holds its accumulator
        lo, hi = grid.dst_interval(c)
        if not grid.column(c) and hi > lo:
            peak = max(peak, cost.fixed + cost.bytes_per_dst_row * (hi - lo))
    return int(-(-peak // 1))


def brute_choice(
    g: ngra.Graph, cost: TileBytes, budget: int, max_parts: int
) -> tuple[int, int] | None:
    n = max(g.num_nodes, 1)
    cands = [
        (p, q) for p in range(1, min(max_parts, n) + 1) for q in range(1, min(max_parts, n) + 1)
    ]
    for p, q in sorted(cands, key=lambda c: (c[0] * c[1], -c[0])):
        if brute_peak(g, cost, p, q) <= budget:
            return p, q
    return None


def test_tile_bytes_formula_by_hand():
    cost = TileBytes(bytes_per_src_row=512, bytes_per_dst_row=1024, bytes_per_edge=16, fixed=1000)
    assert cost.tile_bytes(src_rows=10, dst_rows=4, edges=30) == 15816  # the docstring example
    assert TileBytes(512, 1024, 16, 1000, prefetch_factor=1).tile_bytes(10, 4, 30) == 10696
    t = cost.tile_bytes(
        torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.0, 2.0])
    )
    assert t.tolist() == [2024.0, 3080.0]


def test_with_index_arrays():
    c = TileBytes(100, 200, 10, 5).with_index_arrays(torch.int64)
    assert (c.bytes_per_src_row, c.bytes_per_dst_row, c.bytes_per_edge, c.fixed) == (
        116,
        216,
        74,
        5,
    )
    c32 = TileBytes(100, 200, 10, 5, prefetch_factor=1).with_index_arrays(torch.int32)
    assert (c32.bytes_per_src_row, c32.bytes_per_dst_row, c32.bytes_per_edge) == (108, 204, 26)


def test_grid_peak_on_hand_made_tiles():
    # tiles (see test_tiling): (0,0) S=1 D=2 E=1; (1,0) S=2 D=2 E=2; (1,1) S=2 D=2 E=3
    g = ngra.Graph.from_edge_index(
        torch.tensor([[0, 0, 1, 3, 2, 2], [1, 2, 2, 2, 3, 3]]), num_nodes=4
    )
    grid = tile_graph(g, dst_bounds=[0, 2, 4], src_bounds=[0, 2, 4])
    cost = TileBytes(bytes_per_src_row=10, bytes_per_dst_row=100, bytes_per_edge=1, fixed=1000)
    # 1000 + 2*10*2 + 100*2 + 1*3 = 1243 (tile (1,1)); (0,0): 1221, (1,0): 1242
    assert grid_peak_bytes(grid, cost) == 1243
    # a column without edges still holds its accumulator: dst rows 0..2 have no in-edges
    h = ngra.Graph.from_edge_index(torch.tensor([[0], [3]]), num_nodes=4)
    grid = tile_graph(h, dst_bounds=[0, 3, 4], src_bounds=[0, 4])
    assert grid_peak_bytes(grid, cost) == 1000 + 100 * 3  # > 1000 + 20 + 100 + 1
    assert grid_peak_bytes(tile_graph(CASES["empty"]), cost) == 1000


def test_choose_grid_on_a_ring_by_hand():
    # 4-cycle: every vertex has in- and out-degree 1.
    g = ngra.Graph.from_edge_index(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]))
    cost = TileBytes(bytes_per_src_row=10, bytes_per_dst_row=100, bytes_per_edge=1)
    # 1x1: 2*10*4 + 100*4 + 4 = 484; 2x1: 2*10*2 + 100*2 + 2 = 242; 1x2: 40 + 400 + 2 = 442;
    # 3x1 (intervals [0,1) [1,3) [3,4)): 242; 4x1: 20 + 100 + 1 = 121; 2x2: 20 + 200 + 1 = 221.
    assert choose_grid(g, cost, 484).shape == (1, 1)
    c = choose_grid(g, cost, 483)
    assert c.shape == (2, 1) and c.predicted_peak_bytes == 242
    c = choose_grid(g, cost, 241)  # 3x1 is 242 and 1x3 holds all 4 destinations: 4x1 next
    assert c.shape == (4, 1) and c.predicted_peak_bytes == 121 and c.proven_minimal
    assert c.grid is not None and len(c.grid) == 4
    with pytest.raises(
        ValueError, match=r"smallest budget that works is 121 B \(121 bytes\), with the 4 x 1 grid"
    ):
        choose_grid(g, cost, 120)


@pytest.mark.parametrize(
    "cost",
    [
        TileBytes(bytes_per_src_row=64, bytes_per_dst_row=64, bytes_per_edge=8),
        TileBytes(bytes_per_src_row=256, bytes_per_dst_row=16, bytes_per_edge=4, fixed=100),
        TileBytes(bytes_per_src_row=0, bytes_per_dst_row=32, bytes_per_edge=64, prefetch_factor=1),
    ],
    ids=["even", "src-heavy", "edge-heavy"],
)
def test_choose_grid_is_the_smallest_fitting_grid(cost):
    for name in ("isolated", "multi_edges", "hub", "self_loops"):
        g = CASES[name]
        full = brute_peak(g, cost, 1, 1)
        for frac in (1.0, 0.7, 0.45, 0.3, 0.2):
            budget = int(full * frac)
            expect = brute_choice(g, cost, budget, max_parts=8)
            if expect is None:
                with pytest.raises(ValueError, match="too small"):
                    choose_grid(g, cost, budget, max_parts=8)
                continue
            c = choose_grid(g, cost, budget, max_parts=8)
            assert c.shape == expect, (name, frac)
            assert c.predicted_peak_bytes == brute_peak(g, cost, *expect) <= budget
            assert c.proven_minimal


def test_choose_grid_on_power_law(power_law):
    cost = TileBytes(bytes_per_src_row=128, bytes_per_dst_row=256, bytes_per_edge=24, fixed=1 << 10)
    full = brute_peak(power_law, cost, 1, 1)
    c = choose_grid(power_law, cost, full // 6, max_parts=16)
    assert c.predicted_peak_bytes <= full // 6 and c.proven_minimal
    assert grid_peak_bytes(c.grid, cost) == c.predicted_peak_bytes
    assert c.predicted_peak_bytes == brute_peak(power_law, cost, *c.shape)
    # every grid with fewer tiles, or as many tiles and more columns, does not fit
    p, q = c.shape
    for pp in range(1, 17):
        for qq in range(1, 17):
            if (pp * qq, -pp) < (p * q, -p):
                assert brute_peak(power_law, cost, pp, qq) > full // 6, (pp, qq)
    assert c.stats.num_nonempty == len(c.grid)
    text = c.describe()
    assert f"grid {p} x {q}" in text and "predicted peak" in text
    c2 = choose_grid(power_law, cost, full // 6, max_parts=16, verify=False)
    assert (
        c2.grid is None
        and c2.shape == c.shape
        and c2.predicted_peak_bytes == c.predicted_peak_bytes
    )
    assert torch.equal(c2.stats.edges_per_tile, c.stats.edges_per_tile)
    c3 = choose_grid(power_law, cost, full // 6, max_parts=16, index_dtype=torch.int32)
    assert c3.shape == c.shape and c3.grid.index_dtype == torch.int32
    assert c3.grid.tiles[0].indices.dtype == torch.int32


def test_lower_bounds_are_sound(graph_case):
    cost = TileBytes(bytes_per_src_row=40, bytes_per_dst_row=24, bytes_per_edge=8, fixed=7)
    model = budget_mod._GridModel(graph_case, cost)
    n = max(graph_case.num_nodes, 1)
    lb = model.lower_bounds(min(6, n), min(6, n))
    for p in range(1, lb.shape[0] + 1):
        for q in range(1, lb.shape[1] + 1):
            assert lb[p - 1, q - 1] <= model.peak(p, q) == brute_peak(graph_case, cost, p, q)


def test_estimate_path_still_fits(power_law, monkeypatch):
    # Force the large-graph behavior: candidates estimated over budget are skipped.
    monkeypatch.setattr(budget_mod, "_EXACT_WORK", 0)
    cost = TileBytes(bytes_per_src_row=128, bytes_per_dst_row=256, bytes_per_edge=24)
    budget = brute_peak(power_law, cost, 1, 1) // 5
    c = choose_grid(power_law, cost, budget, max_parts=16)
    assert c.predicted_peak_bytes <= budget
    assert c.predicted_peak_bytes == brute_peak(power_law, cost, *c.shape)
    model = budget_mod._GridModel(power_law, cost)
    # the estimate is close to the truth on an unclustered graph
    for p, q in [(1, 1), (2, 3), (4, 2)]:
        assert abs(model.estimate(p, q) / model.peak(p, q) - 1) < 0.35


def test_too_small_error_names_the_minimal_budget(graph_case):
    g = graph_case
    cost = TileBytes(bytes_per_src_row=16, bytes_per_dst_row=8, bytes_per_edge=4, fixed=3)
    with pytest.raises(ValueError) as err:
        choose_grid(g, cost, 2, max_parts=6)
    msg = str(err.value)
    assert "too small" in msg and "Raise the budget" in msg
    need = int(re.search(r"smallest budget that works is .*? \((\d+) bytes\)", msg).group(1))
    assert choose_grid(g, cost, need, max_parts=6).predicted_peak_bytes == need
    with pytest.raises(ValueError):
        choose_grid(g, cost, need - 1, max_parts=6)


def test_too_small_error_reasons():
    g = CASES["hub"]
    with pytest.raises(ValueError, match="fixed cost alone"):
        choose_grid(g, TileBytes(1, 1, 1, fixed=10_000), "5KB")
    with pytest.raises(ValueError, match=r"vertex 0, has in-degree 40"):
        choose_grid(g, TileBytes(0, 0, bytes_per_edge=100), 1000, max_parts=40, max_src_parts=1)


def test_parse_bytes():
    assert parse_bytes(4096) == 4096
    assert parse_bytes(0) == 0
    assert parse_bytes("2GB") == 2_000_000_000
    assert parse_bytes("512MB") == 512_000_000
    assert parse_bytes("512MiB") == 512 * 2**20
    assert parse_bytes("1.5GiB") == 1_610_612_736
    assert parse_bytes("1.5 gib") == 1_610_612_736
    assert parse_bytes("2G") == 2 * 2**30
    assert parse_bytes("10k") == 10240
    assert parse_bytes("1.1GB") == 1_100_000_000  # exact, no float error
    assert parse_bytes("100") == 100 and parse_bytes("100B") == 100
    assert parse_bytes(" 3 kB ") == 3000
    assert parse_bytes(1e9) == 1_000_000_000
    assert parse_bytes("1e3") == 1000
    for bad in ("", "GB", "2XB", "-1GB", "1.2.3MB", "two GB"):
        with pytest.raises(ValueError, match="memory size|unit"):
            parse_bytes(bad)
    for bad in (-1, float("nan"), float("inf"), -0.5):
        with pytest.raises(ValueError):
            parse_bytes(bad)
    for bad in (None, True, [1]):
        with pytest.raises(TypeError):
            parse_bytes(bad)


def test_format_bytes():
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**30) == "3.00 GiB"
    assert parse_bytes(format_bytes(5 * 2**20).replace(" ", "")) == 5 * 2**20


def test_tile_cost_validation():
    with pytest.raises(ValueError, match="bytes_per_edge"):
        TileBytes(1, 1, -1)
    with pytest.raises(ValueError, match="prefetch_factor"):
        TileBytes(1, 1, 1, prefetch_factor=0.5)
    with pytest.raises(TypeError):
        TileBytes("1", 1, 1)
    with pytest.raises(ValueError, match="max_parts"):
        choose_grid(CASES["hub"], TileBytes(1, 1, 1), "1MB", max_parts=0)
    with pytest.raises(TypeError, match="TileBytes"):
        choose_grid(CASES["hub"], (1, 1, 1), "1MB")


@pytest.mark.parametrize("cost", [TileBytes(16, 8, 4, fixed=3), TileBytes(0, 4, 4, prefetch_factor=1),
                                  TileBytes(0, 0, 0)])
def test_the_one_tile_grid_is_priced_without_the_search(graph_case, cost, monkeypatch):
    """``max_parts=1`` without ``verify`` prices the one candidate directly (no per-vertex
    prefix arrays): the same choice and peak as the search and as built tiles, and at one
    byte under that peak the same too-small error."""
    g = graph_case
    need = brute_peak(g, cost, 1, 1)
    fast = choose_grid(g, cost, need, max_parts=1, verify=False)
    monkeypatch.setattr(budget_mod, "_one_tile", lambda *a: None)
    searched = choose_grid(g, cost, need, max_parts=1, verify=False)
    monkeypatch.undo()
    assert fast.shape == searched.shape == (1, 1)
    assert fast.predicted_peak_bytes == searched.predicted_peak_bytes == need
    assert fast.worst_tile == searched.worst_tile
    assert torch.equal(fast.stats.src_rows_per_tile, searched.stats.src_rows_per_tile)
    assert torch.equal(fast.dst_bounds, searched.dst_bounds)
    if need > 0:
        with pytest.raises(ValueError, match="too small"):
            choose_grid(g, cost, need - 1, max_parts=1, verify=False)
