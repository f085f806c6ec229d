"""Streaming through a real CUDA device == the same model resident on it.

Host data, parameters on the GPU, every stage on the GPU (:mod:`ngra.runtime.device_stream`):
outputs, input and parameter gradients equal the device-resident run's (float64) for the
zoo's GCN, GAT (attention dropout), MPNN, G-GCN and a user layer, on 1 x 1 to 8 x 8
schedules with all and with one source chunk on the device; a model moved to the GPU with
its data left on the host streams without a block; training losses match; the device
peak stays within the budget the schedule was priced for.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ngra import Graph, SagaLayer
from ngra.models import build_model, prepare
from ngra.runtime.device_schedule import device_streaming
from ngra.runtime.device_stream import last_schedule

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

N, F_IN = 300, 8


class UserGated(SagaLayer):
    gather = "max"

    def __init__(self, f_in, f_out):
        super().__init__()
        self.gate = nn.Linear(f_in, f_in)
        self.out = nn.Linear(2 * f_in, f_out)

    def apply_edge(self, edge):
        return torch.tanh(self.gate(edge.src) - edge.dst)

    def apply_vertex(self, vertex, acc):
        return self.out(torch.cat([acc, vertex], -1))


class UserNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = UserGated(F_IN, 6), UserGated(6, 3)

    def forward(self, graph, x, edge_data=None):
        return self.b(graph, self.a(graph, x, activation=torch.relu))


def _setup(name):
    g = Graph.from_edge_index(torch.randint(0, N, (2, 3000)), num_nodes=N)
    torch.manual_seed(0)
    if name == "user":
        return UserNet().double(), g, None
    kw = {"hidden": 8, "dropout": 0.0}
    if name == "gat":
        kw.update(heads=2, attention_dropout=0.5)
    graph, edata = prepare(name, g)
    if isinstance(edata, torch.Tensor) and edata.is_floating_point():
        edata = edata.double()
    return build_model(name, F_IN, 3, **kw).double(), graph, edata


def _run(model, graph, edata, x, go, ctx):
    for p in model.parameters():
        p.grad = None
    x = x.detach().requires_grad_()
    torch.manual_seed(3)
    with ctx:
        out = model(graph, x, edata)
        out.backward(go.to(out.device))
    torch.cuda.synchronize()
    return out.detach().cpu(), x.grad.cpu(), [p.grad.cpu() for p in model.parameters()]


@pytest.mark.parametrize("name", ["gcn", "gat", "mpnn", "ggcn", "user"])
def test_streamed_on_the_gpu_equals_resident(name):
    model, graph, edata = _setup(name)
    model = model.cuda().train()
    x = torch.randn(N, F_IN, dtype=torch.float64)
    go = torch.randn(N, 3, dtype=torch.float64)
    dev = torch.device("cuda")
    g_dev = graph.to(dev)
    e_dev = edata.to(dev) if isinstance(edata, torch.Tensor) else edata
    ref = _run(model, g_dev, e_dev, x.cuda(), go, contextlib.nullcontext())
    for parts, cache in ((1, None), (2, 1), (4, None), (8, 1)):
        got = _run(model, graph, edata, x, go, device_streaming("cuda", parts=parts,
                                                               cache=cache))
        what = f"{name} {parts}x{parts} cache={cache}"
        torch.testing.assert_close(got[0], ref[0], rtol=1e-7, atol=1e-9, msg=what)
        torch.testing.assert_close(got[1], ref[1], rtol=1e-7, atol=1e-9, msg=what)
        for a, b in zip(got[2], ref[2]):
            torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9, msg=what)


def test_a_model_on_the_gpu_with_host_data_streams():
    """No block needed: the layers' parameters on one CUDA device and x on the host."""
    model, graph, edata = _setup("gcn")
    model = model.cuda().eval()
    x = torch.randn(N, F_IN, dtype=torch.float64)
    with torch.no_grad():
        out = model(graph, x, edata)
        ref = model(graph.to("cuda"), x.cuda(), edata).cpu()
    assert out.device.type == "cpu" and out.is_pinned()
    torch.testing.assert_close(out, ref)
    assert last_schedule(model.layers[0]) is not None


def test_training_losses_and_the_device_peak():
    """Five Adam steps of GAT streamed 4 x 4 within a budget: the losses of the resident
    run, and a device peak (parameters and optimizer state included) within it."""
    g = Graph.from_edge_index(torch.randint(0, 4000, (2, 60000)), num_nodes=4000)
    graph, _ = prepare("gat", g)
    x, y = torch.randn(4000, 32), torch.randint(0, 4, (4000,))
    dev = torch.device("cuda")
    losses = []
    for streamed in (False, True):
        torch.manual_seed(0)
        model = build_model("gat", 32, 4, hidden=16, heads=4, dropout=0.0).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        gg, xx, yy = (graph, x, y) if streamed else (graph.to(dev), x.to(dev), y.to(dev))
        budget = 48 << 20
        ctx = (lambda: device_streaming(dev, budget=budget, parts=4)) if streamed \
            else contextlib.nullcontext
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run = []
        for _ in range(5):
            opt.zero_grad()
            with ctx():
                loss = F.cross_entropy(model(gg, xx), yy)
                loss.backward()
            opt.step()
            run.append(float(loss.detach()))
        losses.append(run)
        if streamed:
            peak = torch.cuda.max_memory_allocated() - base
            assert peak <= budget, (peak, budget)
            assert all(last_schedule(m).k == 4 for m in model.layers)
    torch.testing.assert_close(torch.tensor(losses[1]), torch.tensor(losses[0]),
                               rtol=1e-4, atol=1e-5)
