"""2-D tiling: every edge in exactly one tile, local CSC/CSR reconstruct the tile's edges."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ngra
from ngra.partition import TileGrid, default_bounds, tile_graph

from partition_cases import CASES


GRIDS = [(1, 1), (2, 3), (3, 2), (4, 4), (1, 5), (7, 9)]


def check_tile(g: ngra.Graph, t) -> None:
    """A tile's arrays are consistent with each other and with the parent graph."""
    dt = t.indices.dtype
    for name in (
        "indptr",
        "indices",
        "src_rows",
        "edge_ids",
        "csr_indptr",
        "csr_indices",
        "csr_perm",
    ):
        assert getattr(t, name).dtype == dt, name
    e, s, d = t.num_edges, t.num_src_rows, t.num_dst
    assert e > 0 and d > 0 and s > 0
    eids = t.edge_ids.long()
    assert bool((eids[1:] > eids[:-1]).all())  # a subsequence of the parent CSC
    rows = t.src_rows.long()
    assert bool((rows[1:] > rows[:-1]).all())  # sorted unique
    assert t.src_lo <= int(rows[0]) and int(rows[-1]) < t.src_hi
    # local CSC reconstructs the (src, dst) pairs of the parent edges
    assert t.indptr.shape == (d + 1,) and int(t.indptr[0]) == 0 and int(t.indptr[-1]) == e
    src = rows[t.indices.long()]
    dst = t.dst_local() + t.dst_lo
    assert torch.equal(src, g.indices[eids])
    assert torch.equal(dst, g.dst_index()[eids])
    assert torch.equal(t.edge_index(), torch.stack([src, dst]))
    # local CSR: a stable re-sort of the same edges by local source
    assert (
        t.csr_indptr.shape == (s + 1,) and int(t.csr_indptr[0]) == 0 and int(t.csr_indptr[-1]) == e
    )
    per_row = t.csr_indptr[1:] - t.csr_indptr[:-1]
    assert bool((per_row > 0).all())  # every listed row is touched
    perm = t.csr_perm.long()
    assert torch.equal(torch.sort(perm).values, torch.arange(e))
    csr_src = torch.from_numpy(np.repeat(np.arange(s), per_row.numpy()))
    assert torch.equal(t.indices.long()[perm], csr_src)
    assert torch.equal(t.dst_local()[perm], t.csr_indices.long())
    same = csr_src[1:] == csr_src[:-1]
    assert bool((perm[1:][same] > perm[:-1][same]).all())  # within a source: tile-CSC order


@pytest.mark.parametrize("shape", GRIDS, ids=[f"{p}x{q}" for p, q in GRIDS])
def test_tiles_partition_the_edges(graph_case, shape):
    g = graph_case
    grid = tile_graph(g, *shape)
    assert grid.shape == shape and grid.num_nodes == g.num_nodes and grid.num_edges == g.num_edges
    all_ids = torch.cat([t.edge_ids for t in grid] + [torch.zeros(0, dtype=torch.int64)])
    assert torch.equal(torch.sort(all_ids).values, torch.arange(g.num_edges))  # each edge once
    ei = g.edge_index("csc")
    for t in grid:
        check_tile(g, t)
        assert (t.dst_lo, t.dst_hi) == grid.dst_interval(t.col)
        assert (t.src_lo, t.src_hi) == grid.src_interval(t.row)
        assert grid.tile(t.col, t.row) is t
    # brute force: the cells holding edges are exactly the stored tiles
    p_of = torch.searchsorted(grid.dst_bounds, ei[1], right=True) - 1
    q_of = torch.searchsorted(grid.src_bounds, ei[0], right=True) - 1
    cells = set(zip(p_of.tolist(), q_of.tolist()))
    assert cells == {(t.col, t.row) for t in grid}
    edges, rows = grid.counts()
    num_cells = shape[0] * shape[1]
    cell = p_of * shape[1] + q_of
    expect_edges = torch.bincount(cell, minlength=num_cells).view(shape)
    pairs = torch.unique(cell * max(g.num_nodes, 1) + ei[0])
    expect_rows = torch.bincount(pairs // max(g.num_nodes, 1), minlength=num_cells).view(shape)
    assert torch.equal(edges, expect_edges) and torch.equal(rows, expect_rows)
    for p in range(shape[0]):
        col = grid.column(p)
        assert [t.row for t in col] == sorted(t.row for t in col) and all(t.col == p for t in col)
        for q in range(shape[1]):
            assert (grid.tile(p, q) is None) == (int(expect_edges[p, q]) == 0)
    for q in range(shape[1]):
        row = grid.row(q)
        assert [t.col for t in row] == sorted(t.col for t in row) and all(t.row == q for t in row)
    assert [(t.col, t.row) for t in grid.tiles] == sorted((t.col, t.row) for t in grid.tiles)


def test_int32_tiles_match_int64(power_law):
    a = tile_graph(power_law, 3, 4)
    b = tile_graph(power_law, 3, 4, index_dtype=torch.int32)
    assert len(a) == len(b)
    for ta, tb in zip(a, b):
        check_tile(power_law, tb)
        for name in (
            "indptr",
            "indices",
            "src_rows",
            "edge_ids",
            "csr_indptr",
            "csr_indices",
            "csr_perm",
        ):
            assert torch.equal(getattr(ta, name), getattr(tb, name).long()), name


def test_one_by_one_is_the_whole_graph(graph_case):
    g = graph_case
    grid = tile_graph(g)
    if g.num_edges == 0:
        assert len(grid) == 0 and grid.shape == (1, 1)
        return
    (t,) = grid.tiles
    assert (t.dst_lo, t.dst_hi, t.src_lo, t.src_hi) == (0, g.num_nodes, 0, g.num_nodes)
    assert torch.equal(t.indptr, g.indptr)
    assert torch.equal(t.edge_ids, torch.arange(g.num_edges))
    assert torch.equal(t.src_rows, torch.unique(g.indices))
    assert torch.equal(t.src_rows[t.indices], g.indices)
    csr = g.csr()
    assert torch.equal(t.edge_ids[t.csr_perm], csr.perm)  # same stable CSR as the graph's
    assert torch.equal(t.csr_indices, csr.indices)
    out = g.out_degrees()
    assert torch.equal(t.csr_indptr[1:] - t.csr_indptr[:-1], out[out > 0])


def test_hand_made_tiles_and_stats():
    # e0: 0->1, e1: 0->2, e2: 1->2, e3: 3->2, e4: 2->3, e5: 2->3 (multi-edge)
    g = ngra.Graph.from_edge_index(
        torch.tensor([[0, 0, 1, 3, 2, 2], [1, 2, 2, 2, 3, 3]]), num_nodes=4
    )
    grid = tile_graph(g, dst_bounds=[0, 2, 4], src_bounds=[0, 2, 4])
    assert [(t.col, t.row) for t in grid] == [(0, 0), (1, 0), (1, 1)]
    t00, t10, t11 = grid.tiles
    assert (
        t00.edge_ids.tolist() == [0]
        and t00.src_rows.tolist() == [0]
        and t00.indptr.tolist() == [0, 0, 1]
    )
    assert t10.edge_ids.tolist() == [1, 2] and t10.src_rows.tolist() == [0, 1]
    assert t11.edge_ids.tolist() == [3, 4, 5]
    assert t11.indptr.tolist() == [0, 1, 3]
    assert t11.src_rows.tolist() == [2, 3]
    assert t11.indices.tolist() == [1, 0, 0]
    assert t11.csr_indptr.tolist() == [0, 2, 3]
    assert t11.csr_indices.tolist() == [1, 1, 0]
    assert t11.csr_perm.tolist() == [1, 2, 0]
    assert grid.tile(0, 1) is None and grid.column(0) == (t00,) and grid.row(1) == (t11,)
    s = grid.stats()
    assert (s.num_tiles, s.num_nonempty) == (4, 3)
    assert s.edges_per_tile.tolist() == [1, 2, 3] and tuple(s.edges) == (1, 2, 3)
    assert s.src_rows_per_tile.tolist() == [1, 2, 2] and tuple(s.src_rows) == (1, 2, 2)
    assert s.dst_rows_per_tile.tolist() == [2, 2, 2]
    assert s.touched_fraction.tolist() == [0.5, 1.0, 1.0] and tuple(s.touched) == (0.5, 1.0, 1.0)
    assert s.num_selective(0.75) == 1 and s.num_selective(0.5) == 0
    assert t00.touched_fraction == 0.5
    text = grid.describe()
    assert "TileGrid 2 x 2" in text and "3 non-empty of 4" in text
    assert "edges per tile: min 1 / median 2 / max 3" in text
    assert "touched fraction of src interval: min 0.5 / median 1 / max 1" in text
    assert s.as_dict()["edges"] == (1, 2, 3)


def test_stats_median_of_even_count():
    g = ngra.Graph.from_edge_index(
        torch.tensor([[0, 1, 1, 2, 2, 2, 3, 3, 3, 3], [0, 1, 1, 2, 2, 2, 3, 3, 3, 3]])
    )
    s = tile_graph(g, dst_bounds=[0, 1, 2, 3, 4], src_bounds=[0, 4]).stats()
    assert tuple(s.edges) == (1, 2.5, 4)


def test_default_bounds_are_edge_balanced(power_law):
    d, s = default_bounds(power_law, 4, 3)
    grid = tile_graph(power_law, 4, 3)
    assert torch.equal(grid.dst_bounds, d) and torch.equal(grid.src_bounds, s)
    col_edges = power_law.indptr[d[1:]] - power_law.indptr[d[:-1]]
    bound = (power_law.num_edges + power_law.num_nodes) / 4 + int(power_law.in_degrees().max()) + 1
    assert int((col_edges + d[1:] - d[:-1]).max()) <= bound


def test_subset_of_columns(power_law):
    full = tile_graph(power_law, 4, 2)
    part = tile_graph(power_law, 4, 2, columns=[2, 0])
    assert part.columns == (0, 2)
    assert [(t.col, t.row) for t in part] == [(t.col, t.row) for t in full if t.col in (0, 2)]
    for a, b in zip(part, (t for t in full if t.col in (0, 2))):
        assert torch.equal(a.edge_ids, b.edge_ids) and torch.equal(a.csr_perm, b.csr_perm)
    assert part.column(1) == ()
    assert "built columns" in part.describe()


def test_more_parts_than_vertices():
    g = CASES["self_loops"]
    grid = tile_graph(g, 9, 7)
    assert grid.shape == (9, 7)
    assert sorted(torch.cat([t.edge_ids for t in grid]).tolist()) == list(range(g.num_edges))


def test_errors():
    g = CASES["multi_edges"]
    with pytest.raises(ValueError, match="non-decreasing from 0"):
        tile_graph(g, dst_bounds=[0, 3, 2, 5])
    with pytest.raises(ValueError, match="non-decreasing from 0"):
        tile_graph(g, dst_bounds=[0, 4])
    with pytest.raises(ValueError, match="intervals but 3 parts"):
        tile_graph(g, 3, dst_bounds=[0, 2, 5])
    with pytest.raises(ValueError, match=">= 1"):
        tile_graph(g, 0, 1)
    with pytest.raises(ValueError, match="index_dtype"):
        tile_graph(g, index_dtype=torch.int16)
    with pytest.raises(ValueError, match="columns"):
        tile_graph(g, 2, 1, columns=[2])
    grid = tile_graph(g, 2, 2)
    assert isinstance(grid, TileGrid)
    with pytest.raises(IndexError):
        grid.column(2)
    with pytest.raises(IndexError):
        grid.tile(0, -1)
