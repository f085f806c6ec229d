"""Shared planner test inputs: synthetic link models and random chains."""

from __future__ import annotations

import random

from ngra.distributed.link import OPS, AlphaBeta, GemmTable, LinkModel, gemm_shapes
from ngra.planner import Chain, Layer


def make_link(p: int = 4, alpha: float = 2e-5, beta: float = 1e-9, *,
              rnd: random.Random | None = None) -> LinkModel:
    """A link model with the same ``alpha + beta x`` for every op (or random ones)."""
    if rnd is not None:
        ops = {op: AlphaBeta(rnd.uniform(1e-6, 1e-3), rnd.uniform(1e-11, 1e-8)) for op in OPS}
        gemm = GemmTable(tuple((m, k, n, 2 * m * k * n / rnd.uniform(1e9, 1e11))
                               for m, k, n in gemm_shapes()))
        return LinkModel("gloo", "cpu", p, "host", ops, gemm_flops=1e10, gather_bytes=1e10,
                         gemm=gemm, stream_bytes=rnd.uniform(1e9, 2e10),
                         shared=rnd.choice([1.0, rnd.uniform(1.0, 3.0)]),
                         tp_layer=AlphaBeta(rnd.uniform(0, 1e-3), rnd.uniform(0, 1e-9)))
    return LinkModel("gloo", "cpu", p, "host", {op: AlphaBeta(alpha, beta) for op in OPS},
                     gemm_flops=1e10, gather_bytes=1e10, stream_bytes=1e10)


def random_chain(rnd: random.Random, n: int) -> Chain:
    """``n`` layers: Linears of random widths and splits, element-wise layers between."""
    width = rnd.choice([16, 64, 256, 1024])
    first, layers = width, []
    for i in range(n):
        if layers and rnd.random() < 0.35:
            layers.append(Layer(f"act{i}", "elementwise", width, width, saved_width=width))
            continue
        out = rnd.choice([16, 64, 256, 1024, 4096])
        splits = tuple(s for s in ("col", "row") if rnd.random() < 0.8)
        layers.append(Layer(f"lin{i}", "linear", width, out, param_bytes=4 * (width * out + out),
                            saved_width=width, splits=splits, module=str(i)))
        width = out
    return Chain("random", tuple(layers), rnd.choice([64, 512, 4096]), first)


def lstm_net():
    """A module factory for ``ngra plan --module``: a Linear, then what the planner refuses."""
    from torch import nn

    return nn.Sequential(nn.Linear(8, 8), nn.LSTM(8, 8))
