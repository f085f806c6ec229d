"""Child process for the memory-budget test: one training step, peak RSS as JSON.

Usage: python memory_child.py MODEL BUDGET NUM_NODES NUM_EDGES WIDTH
(MODEL: ``mpnn`` or ``gat`` with the compiler off, or ``gcn`` compiled to its fused
g-SpMM; BUDGET is bytes, or "none"). Prints one JSON line with the RSS before the step,
the peak RSS of the step, the peak RSS of start-up (imports, JIT warm-up; for
diagnosis only), and the sizes the bound is stated in.

The step's peak is its own (:mod:`ngra.memstat`): the high-water mark is reset after
start-up, so neither a start-up spike (numba compiling kernels its cache does not hold)
nor the parent's peak (which ``ru_maxrss`` inherits across fork and exec: pytest's,
late in a full run) is charged to the layer.
"""

from __future__ import annotations

import contextlib
import json
import sys

import torch

import ngra
from ngra import compiler
from ngra.memstat import peak_rss_bytes, reset_peak_rss, rss_bytes
from ngra.models import GATConv, GCNConv, MPNNConv
from ngra.probes import Recorder
from ngra.runtime.budget import grid_shape


def main() -> None:
    model, budget, n, e, f = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    torch.set_num_threads(2)
    torch.manual_seed(0)
    src = torch.randint(0, n, (e,))
    dst = (torch.rand(e).pow(2) * n).long()  # skewed in-degrees
    g = ngra.Graph.from_edge_index(torch.stack([src, dst]), num_nodes=n)
    g.csr(), g.dst_index()  # graph structure is built before the measurement
    x = torch.randn(n, f, requires_grad=True)
    fused = model == "gcn"
    if model == "mpnn":
        layer, edata = MPNNConv(f, f, edge_dim=1, hidden=64), torch.rand(e, 1)
    elif fused:
        g = g.gcn_norm()
        g.csr(), g.dst_index()
        layer, edata = GCNConv(f, f), None
    else:
        layer, edata = GATConv(f, f // 4, heads=4), None
    compiled = compiler.disabled if not fused else _null
    with compiled(), ngra.memory_budget(64 * 1024):
        # JIT warm-up on a small graph (numba compiles kernels for tiling and the edge
        # stage on first use): compiler memory is not the layer's working set.
        small = ngra.Graph.from_edge_index(torch.randint(0, 64, (2, 512)), num_nodes=64)
        small = small.gcn_norm() if fused else small
        sx = torch.randn(64, f, requires_grad=True)
        layer(small, sx, edata[:512] if edata is not None else None).sum().backward()
        layer.zero_grad()
    if fused:  # steady state: the grid is chosen and tiled once, then reused per epoch
        with _budget(budget):
            layer(g, x, edata).square().sum().backward()
        layer.zero_grad()
        x.grad = None
    startup_peak = peak_rss_bytes()
    reset = reset_peak_rss()
    before = rss_bytes()
    # GAT with fusion switched off; MPNN cannot fuse anyway; GCN runs its fused plan
    with compiled(), Recorder() as rec:
        with _budget(budget):
            out = layer(g, x, edata)
            out.square().sum().backward()
    peak = peak_rss_bytes()
    grids = [c.shape for c in rec.notes.get("grid", [])]
    if ":" in budget:  # a forced grid (not annotated as a budget's choice)
        grids = [tuple(map(int, budget.split(":")[1].split("x")))]
    print(json.dumps({"before": before, "peak": peak, "startup_peak": startup_peak,
                      "tiles": grids[0][0] * grids[0][1] if grids else 1,
                      "peak_reset": reset, "num_nodes": n, "num_edges": e, "width": f,
                      "grad_ok": bool(torch.isfinite(x.grad).all())}))


def _budget(budget: str):
    """``ngra.memory_budget(budget)``, or no budget for ``"none"``; ``"B:PxQ"`` is budget
    ``B`` with the grid forced to ``P x Q`` tiles (``ngra.grid_shape``)."""
    if budget == "none":
        return _null()
    if ":" not in budget:
        return ngra.memory_budget(int(budget))
    size, shape = budget.split(":")
    p, q = map(int, shape.split("x"))
    stack = contextlib.ExitStack()
    stack.enter_context(ngra.memory_budget(int(size)))
    stack.enter_context(grid_shape(p, q))
    return stack


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return None


if __name__ == "__main__":
    main()
