"""Child process for the edge-score attention memory test: one training step of a GATv2
or TransformerConv conformance layer (4 heads x 16), its working memory.

Usage: python score_memory_child.py LAYER MODE NUM_NODES NUM_EDGES
(LAYER ``gatv2`` or ``transformer``; MODE ``fused`` or ``generic``: the compiled plan or
the generic UDF executor). Prints the working memory of a steady-state step (the least
over a few steps of its peak RSS above the RSS before it, :mod:`ngra.memstat`) and the
size of one ``[E, H, D]`` float32 tensor.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import ngra
from ngra.compiler import compile_layer, set_enabled
from ngra.memstat import peak_rss_bytes, reset_peak_rss, rss_bytes

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after ngra: tests/ngra exists
from conformance_layers import GATv2, Transformer  # noqa: E402

HEADS, DIM, F_IN = 4, 16, 16
REPEATS = 3


def main() -> None:
    name, mode, n, e = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(2)
    torch.manual_seed(0)
    g = ngra.Graph.from_edge_index(torch.randint(0, n, (2, e)), num_nodes=n).add_self_loops()
    g.csr(), g.dst_index()
    x = torch.randn(n, F_IN)
    layer = (GATv2 if name == "gatv2" else Transformer)(F_IN, DIM, HEADS)
    set_enabled(mode == "fused")
    kinds = getattr(compile_layer(layer, g, x, None), "edge_kinds", ())

    def step() -> None:
        layer(g, x).square().sum().backward()
        layer.zero_grad()

    step()  # JIT warm-up, plan compile, the graph's cached structures
    runs = []
    for _ in range(REPEATS):
        reset = reset_peak_rss()
        before = rss_bytes()
        step()
        runs.append(peak_rss_bytes() - before)
    print(json.dumps({"used": min(runs), "peak_reset": reset, "kinds": list(kinds),
                      "ehd_bytes": g.num_edges * HEADS * DIM * 4}))


if __name__ == "__main__":
    main()
