"""Child process for the chunked edge stage's memory test: one training step, peak RSS.

Usage: python chunk_memory_child.py NUM_NODES NUM_EDGES WIDTH CHUNK
The layer is the conformance suite's ``EdgeMLPNorm`` (an edge MLP with a LayerNorm: the
generic plan) of width ``WIDTH``, trained a step at a time in this one process with
``NGRA_EDGE_CHUNK=0`` (``whole``: the edge stage over every edge at once) and then with
``NGRA_EDGE_CHUNK=CHUNK`` (``chunked``). Prints, per mode, the working memory of a
steady-state step (the least over a few steps of its peak above the RSS before it,
:mod:`ngra.memstat`) and whether the step ran chunked, and the size of one
``[E, WIDTH]`` float32 tensor.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

import ngra
from ngra.compiler import chunked
from ngra.memstat import peak_rss_bytes, reset_peak_rss, rss_bytes

sys.path.append(str(Path(__file__).resolve().parents[1]))  # after ngra: tests/ngra shadows it
from conformance_layers import EdgeMLPNorm  # noqa: E402

REPEATS = 2


def main() -> None:
    n, e, f, chunk = map(int, sys.argv[1:5])
    torch.set_num_threads(2)
    torch.manual_seed(0)
    g = ngra.Graph.from_edge_index(torch.randint(0, n, (2, e)), num_nodes=n)
    x = torch.randn(n, f, requires_grad=True)
    layer = EdgeMLPNorm(f, f)
    calls = []
    run = chunked.run_chunked

    def counted(*a, **k):
        calls.append(1)
        return run(*a, **k)

    chunked.run_chunked = counted

    def step():
        layer(g, x).square().sum().backward()
        layer.zero_grad()
        x.grad = None

    out = {"ef_bytes": g.num_edges * f * 4}
    for mode, setting in (("whole", "0"), ("chunked", str(chunk))):
        os.environ["NGRA_EDGE_CHUNK"] = setting
        step()  # warm-up: plans, numba, the graph's cached index arrays
        calls.clear()
        runs = []
        for _ in range(REPEATS):  # the least of a few steps: the allocator's noise is one-sided
            reset = reset_peak_rss()
            before = rss_bytes()
            step()
            runs.append(peak_rss_bytes() - before)
        out[mode] = {"used": min(runs), "peak_reset": reset, "chunked": bool(calls)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
