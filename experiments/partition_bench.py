"""Timing of the partition pipeline on a synthetic power-law graph.

    python experiments/partition_bench.py --nodes 1048576 --edges 16000000 --grid 4x4

Generates a skewed random graph (source ids ``~ N * u**3``, destination ids
``~ N * u**2``, then a random relabeling so hubs are spread over the id range), and
reports wall and CPU seconds of tiling, grid choice and reordering. CPU time is
reported because shared machines make wall time noisy. A script, not library code:
it prints its table.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

import ngra
from ngra.partition import TileBytes, choose_grid, permute_graph, reorder, tile_graph


def power_law_graph(num_nodes: int, num_edges: int, seed: int = 0) -> ngra.Graph:
    """A random graph with skewed in- and out-degrees (see module docs)."""
    g = torch.Generator().manual_seed(seed)
    relabel = torch.randperm(num_nodes, generator=g)
    src = relabel[
        (num_nodes * torch.rand(num_edges, generator=g).pow(3)).long().clamp_(max=num_nodes - 1)
    ]
    dst = relabel[
        (num_nodes * torch.rand(num_edges, generator=g).pow(2)).long().clamp_(max=num_nodes - 1)
    ]
    return ngra.Graph.from_edge_index(torch.stack([src, dst]), num_nodes=num_nodes)


def _timed(name: str, fn: Callable[[], Any], rows: list) -> Any:
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    rows.append((name, time.perf_counter() - w0, time.process_time() - c0))
    print(f"{name:<32} wall {rows[-1][1]:7.2f} s   cpu {rows[-1][2]:7.2f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1 << 20)
    ap.add_argument("--edges", type=int, default=16_000_000)
    ap.add_argument(
        "--grid", action="append", default=None, help="PxQ to tile (repeatable; default 1x1, 4x4)"
    )
    ap.add_argument(
        "--budget",
        action="append",
        default=None,
        help="budgets for choose_grid (default 2GB, 512MB)",
    )
    ap.add_argument(
        "--reorder", action="append", default=None, help="reorder methods to time (default degree)"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    grids = args.grid or ["1x1", "4x4"]
    budgets = args.budget or ["2GB", "512MB"]
    methods = args.reorder or ["degree"]
    print(f"torch threads: {torch.get_num_threads()}")
    rows: list = []
    g = _timed(
        f"generate {args.nodes} nodes / {args.edges} edges",
        lambda: power_law_graph(args.nodes, args.edges, args.seed),
        rows,
    )
    _timed("warm-up (numba cache load)", lambda: tile_graph(power_law_graph(64, 256), 2, 2), rows)
    for spec in grids:
        p, q = (int(x) for x in spec.lower().split("x"))
        grid = _timed(f"tile_graph {p}x{q}", lambda p=p, q=q: tile_graph(g, p, q), rows)
        print(grid.describe())
        del grid
    # float32 features of width 128 in and out, GCN-like: src row, accumulator + dst row, edge weight.
    cost = TileBytes(
        bytes_per_src_row=512, bytes_per_dst_row=1024, bytes_per_edge=4, fixed=1 << 20
    ).with_index_arrays()
    for b in budgets:
        choice = _timed(f"choose_grid {b}", lambda b=b: choose_grid(g, cost, b), rows)
        print(choice.describe())
        del choice
    for m in methods:
        r = _timed(f"reorder {m}", lambda m=m: reorder(g, m), rows)
        _timed(f"permute_graph ({m})", lambda r=r: permute_graph(g, r), rows)


if __name__ == "__main__":
    main()
