"""Device memory of a resident GCN training step, counted on the CPU.

The gpu backend's kernels run here on CPU tensors (Triton's interpreter), so the tensors a
training step on a GPU would allocate are allocated here, and
:func:`ngra.livetensors.step_peak` counts them storage by storage. The step is the
benchmark's (``experiments/gpu_bench.py``: zoo GCN, 2 layers, hidden 64, dropout 0.5,
Adam, on R-MAT with 64 features, 8 classes and 2^20's edges per vertex), its warm-up
included (the reverse CSR is
built in the first backward). The two size-dependent workspaces are set to their share
of R-MAT 2^20's sizes: ``dropout_linear``'s row block (16 MiB of a 256 MiB input) and
the gpu transpose's block of edges (2^21 of 17.1M).

The bound is this plan's analytic minimum. Layer 1 (64 -> 64) propagates, then
transforms; at the step's peak (layer 2's backward) four ``[N, 64]`` float32 tensors are
live: the input ``x``, layer 1's propagated input (saved for its weight gradient), the
ReLU output (saved for the ReLU and as layer 2's input) and the input gradient layer 2
writes; then ``[N, 8]`` outputs, labels, offsets, the dropout row block. Edges cost the
CSC's and the reverse CSR's int32 ids, nothing else: no perm, no ``[E]`` weight, no
``int64`` copy. Before the Triton dropout kernel the gpu backend ran the reference's
dropout, seven ``int64`` tensors of ``x``'s size, and this step peaked at about 15
``[N, 64]`` tensors (3.9 GiB at 2^20).
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.nn.functional as F

from ngra.datasets import load
from ngra.kernels import use_backend
from ngra.livetensors import step_peak
from ngra.models import build_model, prepare

pytest.importorskip("triton")

#: R-MAT 2^20 with edge factor 16, self-loops added: gpu_bench.py's ``rmat20``
NODES_20, EDGES_20 = 2**20, 17.1e6
#: [N, 64] float32 tensors at the peak (4 and the [N, 8] ones, labels, offsets, block)
VERTEX_UNITS = 4.6
#: bytes per edge at the peak: int32 ids of the CSC and of the reverse CSR
EDGE_BYTES = 8.5


def test_bound_at_rmat20_is_within_the_target():
    unit = NODES_20 * 64 * 4
    assert VERTEX_UNITS * unit + EDGE_BYTES * EDGES_20 <= 1.5 * 2**30


def test_gcn_training_step_peak_is_the_lean_minimum(monkeypatch):
    import ngra.kernels.gpu.transpose as gpu_transpose

    # 16.7 edges a vertex after R-MAT's duplicates and the self-loops, as 2^20 has 16.3:
    # what is live at once depends on the ratio (the transpose's scratch against [N, 64])
    ds = load("rmat:scale=7,edge_factor=36,feat=64,classes=8,seed=0", progress=False)
    graph, edata = prepare("gcn", ds.graph)
    n, e = graph.num_nodes, graph.num_edges
    x, y, mask = ds.x.clone(), ds.y.clone(), ds.train_mask.clone()
    monkeypatch.setattr(sys.modules["ngra.kernels.dropout_linear"], "BLOCK_BYTES",
                        x.nbytes // 16)
    monkeypatch.setattr(gpu_transpose, "CHUNK_EDGES", math.ceil(e / 8))
    torch.manual_seed(0)
    net = build_model("gcn", 64, 8, hidden=64, dropout=0.5)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        F.cross_entropy(net(graph, x, edata)[mask], y[mask]).backward()
        opt.step()

    with use_backend("gpu"):
        live = step_peak(step)
    split = live.peak_split(n, e)
    unit = n * 64 * 4
    report = f"{split}; at the peak:\n{live.table(16)}"
    assert graph.indices.dtype == torch.int32 and not graph.has_perm
    assert split["vertex"] <= VERTEX_UNITS * unit, report
    assert split["edge"] <= EDGE_BYTES * e, report
    # the count sees the step: x and the three [N, 64] tensors are there
    assert split["vertex"] >= 4 * unit, report
