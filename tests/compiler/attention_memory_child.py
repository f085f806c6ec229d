"""Child process for the attention-dropout memory test: one GAT training step, peak RSS.

Usage: python attention_memory_child.py MODE NUM_NODES NUM_EDGES HEADS
(MODE ``off``: no attention dropout; ``on``: ``attention_dropout = 0.6``, the masks drawn
inside the kernels). Prints the working memory of a steady-state step (the second on the
graph: the least over a few steps of its peak above the RSS before it, :mod:`ngra.memstat`),
the same of steps taken while an ``[E, H]`` float32 tensor is held (the control that shows
the measurement sees such a tensor) and the ``[E, H]`` size.
"""

from __future__ import annotations

import json
import sys

import torch

import ngra
from ngra.memstat import peak_rss_bytes, reset_peak_rss, rss_bytes
from ngra.models import GATConv

REPEATS = 3


def main() -> None:
    mode, n, e, heads = sys.argv[1], *map(int, sys.argv[2:5])
    torch.set_num_threads(2)
    torch.manual_seed(0)
    g = ngra.Graph.from_edge_index(torch.randint(0, n, (2, e)), num_nodes=n).add_self_loops()
    g.csr(), g.dst_index()
    x = torch.randn(n, 16)
    layer = GATConv(16, 4, heads=heads, attention_dropout=0.0 if mode == "off" else 0.6)

    def step(graph, inp):
        layer(graph, inp).square().sum().backward()
        layer.zero_grad()

    small = ngra.Graph.from_edge_index(torch.randint(0, 64, (2, 512)), num_nodes=64)
    step(small.add_self_loops(), torch.randn(64, 16))  # JIT warm-up and plan compile
    # steady state, as from the second epoch: the graph keeps its edge counters in the
    # backward walk's order ([E], made by the first call; not per call)
    step(g, x)
    used = []
    for held in (None, g.num_edges):
        runs = []
        for _ in range(REPEATS):  # the least of a few steps: the allocator's noise is one-sided
            reset = reset_peak_rss()
            before = rss_bytes()
            mask = None if held is None else torch.ones(held, heads)
            step(g, x)
            runs.append(peak_rss_bytes() - before)
            del mask
        used.append(min(runs))
    print(json.dumps({"used": used[0], "control_used": used[1], "peak_reset": reset,
                      "mask_bytes": g.num_edges * heads * 4}))


if __name__ == "__main__":
    main()
