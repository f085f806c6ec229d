"""Labeled graph cases for the partition tests (small, deterministic).

A uniquely named module (not ``conftest``) so tests can import it directly.
"""

from __future__ import annotations

import torch

import ngra


def _power_law(n: int, e: int, seed: int, weighted: bool = False) -> ngra.Graph:
    g = torch.Generator().manual_seed(seed)
    relabel = torch.randperm(n, generator=g)
    src = relabel[(n * torch.rand(e, generator=g).pow(3)).long().clamp(max=n - 1)]
    dst = relabel[(n * torch.rand(e, generator=g).pow(2)).long().clamp(max=n - 1)]
    w = torch.rand(e, generator=g) if weighted else None
    return ngra.Graph.from_edge_index(torch.stack([src, dst]), num_nodes=n, edge_weight=w)


def make_cases() -> dict[str, ngra.Graph]:
    ei = torch.tensor
    star_in = torch.stack([torch.arange(1, 40), torch.zeros(39, dtype=torch.long)])
    star_out = torch.stack([torch.full((20,), 5), torch.arange(20, 40)])
    return {
        "empty": ngra.Graph.from_edge_index(torch.zeros(2, 0, dtype=torch.long), num_nodes=0),
        "no_edges": ngra.Graph.from_edge_index(torch.zeros(2, 0, dtype=torch.long), num_nodes=7),
        "isolated": ngra.Graph.from_edge_index(
            ei([[0, 1, 2, 7, 4], [1, 2, 0, 4, 7]]), num_nodes=12
        ),
        "self_loops": ngra.Graph.from_edge_index(
            ei([[0, 1, 2, 3, 0, 1, 2, 3], [0, 1, 2, 3, 1, 2, 3, 0]]), num_nodes=4
        ),
        "multi_edges": ngra.Graph.from_edge_index(
            ei([[0, 0, 0, 1, 2, 2, 3, 1], [1, 1, 1, 2, 3, 3, 0, 2]]),
            num_nodes=5,
            edge_weight=torch.arange(8, dtype=torch.float32),
        ),
        "hub": ngra.Graph.from_edge_index(
            torch.cat([star_in, star_out, ei([[0], [0]])], 1), num_nodes=40
        ),
        "power_law": _power_law(600, 5000, seed=1, weighted=True),
    }


CASES = make_cases()
