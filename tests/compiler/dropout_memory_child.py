"""Child process for the input-dropout memory test: one GCN training step, peak RSS as JSON.

Usage: python dropout_memory_child.py MODE NUM_NODES NUM_EDGES WIDTH
(MODE ``fused``: the compiled plan applies the input dropout inside its Linear;
``unfused``: the same step with ``ngra.kernels.dropout(x)`` passed in, whose output the
Linear saves). Prints the RSS before the step, the step's own peak (:mod:`ngra.memstat`
resets the high-water mark after start-up) and the input's size.
"""

from __future__ import annotations

import json
import sys

import torch

import ngra
from ngra.kernels import dropout
from ngra.memstat import peak_rss_bytes, reset_peak_rss, rss_bytes
from ngra.models import GCNConv


def main() -> None:
    mode, n, e, f = sys.argv[1], *map(int, sys.argv[2:5])
    torch.set_num_threads(2)
    torch.manual_seed(0)
    ei = torch.randint(0, n, (2, e))
    g = ngra.Graph.from_edge_index(ei, num_nodes=n).gcn_norm()
    g.csr(), g.dst_index()
    x = torch.randn(n, f)  # the data: needs no gradient, as a first layer's input
    layer = GCNConv(f, 16)

    def step(graph, inp):
        if mode == "fused":
            out = layer(graph, inp, dropout=0.5)
        else:
            out = layer(graph, dropout(inp, 0.5))
        out.square().sum().backward()
        layer.zero_grad()

    small = ngra.Graph.from_edge_index(torch.randint(0, 64, (2, 512)), num_nodes=64).gcn_norm()
    step(small, torch.randn(64, f))  # JIT warm-up, plan compile and workspace allocation
    reset = reset_peak_rss()
    before = rss_bytes()
    step(g, x)
    print(json.dumps({"before": before, "peak": peak_rss_bytes(), "peak_reset": reset,
                      "x_bytes": x.numel() * x.element_size()}))


if __name__ == "__main__":
    main()
