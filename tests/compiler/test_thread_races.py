"""Layers called from several threads at once (issue 37, item 1).

A layer (and a model of layers) called from threads on different graphs and inputs, its
first calls racing, gives each thread its sequential result; a thread running modules
while another traces is not drawn into the trace; a failed trace leaves no torch state
modified.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from _compiler_cases import make_graph
from thread_race import run_threads as _run_threads
from torch import nn

import ngra
from ngra.compiler import driver
from ngra.models.gat import GATConv
from ngra.models.gcn import GCNConv
from ngra.models.sage import SAGEConv

F_IN, THREADS, ROUNDS = 6, 4, 6
TOL = {"rtol": 1e-5, "atol": 1e-6}


class _Model(nn.Module):
    """Two SAGA layers and a plain Linear: a model serving requests."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GATConv(F_IN, 4, heads=2)
        self.conv2 = SAGEConv(8, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, g, x):
        return self.head(torch.relu(self.conv2(g, torch.relu(self.conv1(g, x)))))


def _call(model, g, x):
    x = x.clone().requires_grad_(True)
    out = model(g, x)
    (gx,) = torch.autograd.grad(out, [x], torch.ones_like(out))
    return out.detach(), gx


@pytest.mark.parametrize("make", [lambda: GCNConv(F_IN, 4), lambda: GATConv(F_IN, 3, heads=2),
                                  _Model], ids=["gcn", "gat", "model"])
def test_first_and_later_calls_from_threads_equal_sequential_calls(make):
    torch.manual_seed(0)
    # two graphs of one vertex count (a plan's state crossing calls would not show as a
    # shape error there) and two of others
    sizes = [40, 40, 25, 57][:THREADS]
    graphs = [make_graph("random", n).gcn_norm() for n in sizes]
    xs = [torch.randn(n, F_IN) for n in sizes]
    for _ in range(ROUNDS):
        model = make()  # fresh: the threads' first calls race to compile
        driver.clear_cache()
        got: list = [None] * THREADS

        def work(i: int) -> None:
            got[i] = [_call(model, graphs[i], xs[i]) for _ in range(3)]

        _run_threads(work, THREADS)
        for i in range(THREADS):
            want = _call(model, graphs[i], xs[i])
            for out, gx in got[i]:
                torch.testing.assert_close(out, want[0], **TOL)
                torch.testing.assert_close(gx, want[1], **TOL)


class _SlowTrace(ngra.SagaLayer):
    gather = "sum"

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(F_IN, 3)

    def apply_edge(self, edge):
        time.sleep(0.03)  # the other thread calls modules meanwhile
        return edge.src

    def apply_vertex(self, vertex, acc):
        return self.lin(acc)


def test_modules_called_while_another_thread_traces_run_as_written():
    """torch.fx patches nn.Module for the process while it traces: a plain Linear and a
    compiled layer called by another thread meanwhile must not become trace nodes."""
    torch.manual_seed(0)
    g = make_graph("random", 30)
    x = torch.randn(30, F_IN)
    plain = nn.Linear(F_IN, 2)
    warm = _SlowTrace()
    want_plain, want_warm = plain(x).detach(), warm(g, x).detach()
    stop = threading.Event()

    def work(i: int) -> None:
        if i == 0:
            try:
                for _ in range(4):
                    _SlowTrace()(g, x)  # each a first call: a trace
            finally:
                stop.set()
            return
        k = 0
        while not stop.is_set():
            k += 1
            y, z = plain(x), warm(g, x)
            assert isinstance(y, torch.Tensor) and isinstance(z, torch.Tensor)
            torch.testing.assert_close(y.detach(), want_plain)
            torch.testing.assert_close(z.detach(), want_warm)

    _run_threads(work, 2)


class _Branchy(ngra.SagaLayer):
    """Data-dependent control flow: its trace fails (it runs on the generic executor)."""

    gather = "sum"

    def apply_edge(self, edge):
        return edge.src if edge.src.sum() > 0 else -edge.src

    def apply_vertex(self, vertex, acc):
        return acc


def test_a_failed_trace_leaves_torch_as_it_was():
    g = make_graph("random", 20)
    x = torch.randn(20, F_IN)
    before = (nn.Module.__call__, nn.Module.__getattr__, torch.get_rng_state())
    layer = _Branchy()

    def work(i: int) -> None:
        layer(g, x)

    _run_threads(work, 3)
    plan = driver.compile_layer(layer, g, x, None)
    assert plan.kind != "compiled"
    assert nn.Module.__call__ is before[0] and nn.Module.__getattr__ is before[1]
    assert torch.equal(torch.get_rng_state(), before[2])
    lin = nn.Linear(F_IN, 2)
    assert isinstance(lin(x), torch.Tensor)
