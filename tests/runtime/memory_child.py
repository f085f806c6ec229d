"""Child process for the memory-budget test: one training step, peak RSS as JSON.

Usage: python memory_child.py MODEL BUDGET NUM_NODES NUM_EDGES WIDTH
(BUDGET is bytes, or "none"). Prints one JSON line with the RSS before the step,
the process peak RSS, and the sizes the bound is stated in.
"""

from __future__ import annotations

import json
import resource
import sys

import torch

import ngra
from ngra import compiler
from ngra.models import GATConv, MPNNConv


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def main() -> None:
    model, budget, n, e, f = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    torch.set_num_threads(2)
    torch.manual_seed(0)
    src = torch.randint(0, n, (e,))
    dst = (torch.rand(e).pow(2) * n).long()  # skewed in-degrees
    g = ngra.Graph.from_edge_index(torch.stack([src, dst]), num_nodes=n)
    g.csr(), g.dst_index()  # graph structure is built before the measurement
    x = torch.randn(n, f, requires_grad=True)
    if model == "mpnn":
        layer, edata = MPNNConv(f, f, edge_dim=1, hidden=64), torch.rand(e, 1)
    else:
        layer, edata = GATConv(f, f // 4, heads=4), None
    with compiler.disabled(), ngra.memory_budget(64 * 1024):
        # JIT warm-up on a small graph (numba compiles kernels for tiling and the edge
        # stage on first use): compiler memory is not the layer's working set.
        small = ngra.Graph.from_edge_index(torch.randint(0, 64, (2, 512)), num_nodes=64)
        sx = torch.randn(64, f, requires_grad=True)
        layer(small, sx, edata[:512] if edata is not None else None).sum().backward()
        layer.zero_grad()
    before = rss_bytes()
    with compiler.disabled():  # GAT with fusion switched off; MPNN cannot fuse anyway
        ctx = ngra.memory_budget(int(budget)) if budget != "none" else _null()
        with ctx:
            out = layer(g, x, edata)
            out.square().sum().backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"before": before, "peak": peak, "num_nodes": n, "num_edges": e, "width": f,
                      "grad_ok": bool(torch.isfinite(x.grad).all())}))


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return None


if __name__ == "__main__":
    main()
