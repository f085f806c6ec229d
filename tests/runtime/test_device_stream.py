"""Streaming through a device (the CPU standing in for it) == the resident layer.

The schedule of :mod:`ngra.runtime.device_stream` runs on CPU tensors with real copies
between them (streams and events as no-ops): outputs, input gradients and parameter
gradients equal the resident run's for GCN, GAT (with attention dropout), MPNN and
user-defined layers, compiled and generic, on labeled graph cases and every grid from
1 x 1 to 8 x 8, with every source chunk kept on the device and with one; the bytes the
copies count equal the schedule's analytic count; training losses match.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ngra
from ngra import Graph, SagaLayer, compiler
from ngra.models import build_model, prepare
from ngra.runtime.device_schedule import device_streaming, moved_bytes
from ngra.runtime.device_stream import last_schedule
from ngra.runtime.transfer import transfer_counts

N = 40


def _case(name: str, seed: int) -> Graph:
    """Labeled square graph cases (the kernels' cases, as vertex-to-vertex graphs)."""
    g = torch.Generator().manual_seed(seed)
    if name == "empty":
        ei = torch.zeros(2, 0, dtype=torch.int64)
    elif name == "random":
        ei = torch.randint(0, N, (2, 260), generator=g)
    elif name == "isolated":  # vertices 0..9 neither send nor receive
        ei = torch.randint(10, N, (2, 200), generator=g)
    elif name == "self_loops":
        ei = torch.randint(0, N, (2, 120), generator=g)
        ei = torch.cat([ei, torch.arange(N).repeat(2, 1)], 1)
    elif name == "multi_edges":
        ei = torch.randint(0, N, (2, 60), generator=g).repeat(1, 3)
    elif name == "hub":  # one destination takes most edges, one source sends most
        a = torch.randint(0, N, (150,), generator=g)
        ei = torch.cat([torch.stack([a, torch.full_like(a, 3)]),
                        torch.stack([torch.full_like(a, 7), a]),
                        torch.randint(0, N, (2, 40), generator=g)], 1)
    else:
        raise AssertionError(name)
    return Graph.from_edge_index(ei, num_nodes=N)


CASES = ["empty", "random", "isolated", "self_loops", "multi_edges", "hub"]


class UserGated(SagaLayer):
    """A user's layer: a gate from both ends, a max gather, a vertex-side residual."""

    gather = "max"

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.gate_s, self.gate_d = nn.Linear(f_in, f_in), nn.Linear(f_in, f_in)
        self.out = nn.Linear(2 * f_in, f_out)

    def apply_edge(self, edge):
        return torch.sigmoid(self.gate_s(edge.src) + self.gate_d(edge.dst)) * edge.src

    def apply_vertex(self, vertex, acc):
        return self.out(torch.cat([acc, vertex], -1))


class UserAttention(SagaLayer):
    """A user's attention: destination scores that need gradients (a third pass)."""

    gather = "softmax"

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.lin = nn.Linear(f_in, f_out, bias=False)
        self.a_s, self.a_d = nn.Parameter(torch.randn(f_out)), nn.Parameter(torch.randn(f_out))

    def apply_edge(self, edge):
        hs, hd = self.lin(edge.src), self.lin(edge.dst)
        score = F.leaky_relu((hs * self.a_s).sum(-1) + (hd * self.a_d).sum(-1), 0.2)
        return score, hs

    def apply_vertex(self, vertex, acc):
        return acc


class UserNet(nn.Module):
    def __init__(self, layer: type) -> None:
        super().__init__()
        self.a, self.b = layer(5, 6), layer(6, 3)

    def forward(self, graph, x, edge_data=None):
        return self.b(graph, self.a(graph, x, activation=torch.tanh))


def _model(name: str, seed: int):
    torch.manual_seed(seed)
    if name == "user_gated":
        return UserNet(UserGated).double(), None
    if name == "user_attention":
        return UserNet(UserAttention).double(), None
    kw = {"hidden": 6, "dropout": 0.0}
    if name == "gat":
        kw.update(heads=2, attention_dropout=0.4)
    return build_model(name, 5, 3, **kw).double(), name


def _run(model, graph, edata, x, go, ctx):
    for p in model.parameters():
        p.grad = None
    x = x.detach().requires_grad_()
    torch.manual_seed(11)  # attention dropout's seeds
    with ctx:
        out = model(graph, x, edata)
        out.backward(go)
    return out.detach(), x.grad, [p.grad for p in model.parameters()]


def _close(a, b, what):
    if a is None or b is None:
        assert a is None and b is None or (a if a is not None else b).abs().max() == 0, what
        return
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=what)


def _double(d):
    if isinstance(d, torch.Tensor) and d.is_floating_point():
        return d.double()
    return d


@pytest.mark.parametrize("mode", ["compiled", "generic"])
@pytest.mark.parametrize("name", ["gcn", "gat", "mpnn", "user_gated", "user_attention"])
def test_streamed_equals_resident(name, mode):
    seed = int(torch.randint(1 << 20, ()))
    for case in CASES:
        ctx = compiler.disabled() if mode == "generic" else contextlib.nullcontext()
        model, zoo = _model(name, seed)
        model.train()
        g = _case(case, seed)
        graph, edata = prepare(zoo, g) if zoo else (g, None)
        edata = _double(edata)
        x = torch.randn(N, 5, dtype=torch.float64)
        with ctx:
            go = torch.randn(N, 3, dtype=torch.float64)
            out, gx, gp = _run(model, graph, edata, x, go, contextlib.nullcontext())
            for parts, cache in ((1, None), (2, 1), (3, None), (8, 1)):
                if True:
                    what = f"{name} {mode} {case} {parts}x{parts} cache={cache}"
                    o2, gx2, gp2 = _run(model, graph, edata, x, go,
                                        device_streaming("cpu", parts=parts, cache=cache))
                    _close(o2, out, what + ": output")
                    _close(gx2, gx, what + ": input gradient")
                    for i, (a, b) in enumerate(zip(gp2, gp)):
                        _close(a, b, f"{what}: parameter {i}")


@pytest.mark.parametrize("name", ["gcn", "gat", "user_attention"])
def test_counted_bytes_equal_the_schedule(name):
    """Every copy's bytes, per layer call, forward and backward, equal moved_bytes."""
    model, zoo = _model(name, 3)
    model.train()
    g = _case("random", 3)
    graph, edata = prepare(zoo, g) if zoo else (g, None)
    edata = _double(edata)
    layers = [m for m in model.modules() if isinstance(m, SagaLayer)]
    for parts, cache in ((4, 1), (4, None), (3, 2)):
        x = torch.randn(N, 5, dtype=torch.float64)
        with device_streaming("cpu", parts=parts, cache=cache):
            start = transfer_counts().copy()
            out = model(graph, x, edata)
            fwd = transfer_counts().since(start)
            start = transfer_counts().copy()
            out.sum().backward()
            bwd = transfer_counts().since(start)
        schedules = [last_schedule(layer) for layer in layers]
        want = [moved_bytes(s) for s in schedules]
        assert fwd.h2d_bytes == sum(w["fwd_h2d"] for w in want), (parts, cache)
        assert fwd.d2h_bytes == sum(w["fwd_d2h"] for w in want), (parts, cache)
        assert bwd.h2d_bytes == sum(w["bwd_h2d"] for w in want), (parts, cache)
        assert bwd.d2h_bytes == sum(w["bwd_d2h"] for w in want), (parts, cache)
        if cache is None:
            assert all(s.resident_terms for s in schedules)
        else:
            assert not any(s.resident_terms for s in schedules)


def test_input_dropout_masks_do_not_depend_on_the_schedule():
    """One mask for the whole input, hashed by global row: every grid draws it."""
    torch.manual_seed(0)
    model = build_model("gcn", 5, 3, hidden=6, dropout=0.5).double().train()
    graph, _ = prepare("gcn", _case("random", 1))
    x = torch.randn(N, 5, dtype=torch.float64)
    go = torch.randn(N, 3, dtype=torch.float64)
    runs = [_run(model, graph, None, x, go, device_streaming("cpu", parts=p, cache=c))
            for p, c in ((1, None), (4, 1), (8, None))]
    for o, gx, gp in runs[1:]:
        _close(o, runs[0][0], "output")
        for a, b in zip(gp, runs[0][2]):
            _close(a, b, "parameter gradient")


def test_training_losses_match_resident():
    """Ten Adam steps of GCN and GAT (with its attention dropout): the same losses
    streamed (4 x 4, one cached chunk) as resident."""
    graph0 = _case("random", 5)
    y = torch.randint(0, 3, (N,))
    x = torch.randn(N, 5)
    for name in ("gcn", "gat"):
        losses = []
        for ctx in (contextlib.nullcontext, lambda: device_streaming("cpu", parts=4, cache=1)):
            torch.manual_seed(2)
            model = build_model(name, 5, 3, hidden=8, dropout=0.0,
                                **({"heads": 2} if name == "gat" else {}))
            graph, edata = prepare(name, graph0)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            run = []
            for _ in range(10):
                opt.zero_grad()
                with ctx():
                    loss = F.cross_entropy(model(graph, x, edata), y)
                    loss.backward()
                opt.step()
                run.append(float(loss.detach()))
            losses.append(run)
        torch.testing.assert_close(torch.tensor(losses[1]), torch.tensor(losses[0]),
                                   rtol=1e-5, atol=1e-6)


def test_schedule_follows_the_budget():
    """A smaller budget gives more intervals; each predicted peak fits its budget; the
    largest budget keeps every source chunk on the device."""
    from ngra.datasets import load

    ds = load("rmat:scale=10,edge_factor=8,feat=16,classes=4,seed=0",
                            progress=False)
    graph, _ = prepare("gcn", ds.graph)
    model = build_model("gcn", 16, 4, hidden=16)
    layer = model.layers[0]
    from ngra.runtime.device_stream import schedule_for
    from ngra.runtime.executor import edge_data_csc
    from ngra.compiler.driver import compile_layer

    edata = edge_data_csc(graph, None)
    plan = compile_layer(layer, graph, ds.x, edata)
    ks = []
    for budget in (64 << 20, 1 << 20, 256 << 10, 96 << 10):
        with device_streaming("cpu", budget=budget):
            s = schedule_for(plan, graph, ds.x, edata)
        assert s.peak <= budget
        ks.append((s.k, s.cache))
    assert ks[0][0] == 1 and ks[0][1] == 1
    assert [k for k, _ in ks] == sorted(k for k, _ in ks) and ks[-1][0] >= 4, ks
    with pytest.raises(ValueError, match="no schedule fits"):
        with device_streaming("cpu", budget=1 << 10):
            schedule_for(plan, graph, ds.x, edata)
    assert "device streaming on cpu" in s.describe()


def test_training_summary_reports_bytes_and_the_transfer_bound(tmp_path, monkeypatch):
    """ngra's training loop, streamed (the stand-in): the JSON summary gives each epoch's
    bytes each way (those of the schedule's analytic count), the transfer bound and the
    epoch over it."""
    from ngra.training.loop import Session, fit
    from ngra.training import TrainConfig

    monkeypatch.setenv("NGRA_CALIBRATION", str(tmp_path))
    graph, _ = prepare("gcn", _case("random", 9))
    x, y = torch.randn(N, 5), torch.randint(0, 3, (N,))
    masks = {k: torch.rand(N) < 0.5 for k in ("train", "val", "test")}
    torch.manual_seed(0)
    model = build_model("gcn", 5, 3, hidden=8)

    class Streamed(Session):
        def context(self):
            return device_streaming("cpu", parts=4, cache=1)

    s = Streamed(model, graph, x, None, y, masks, None, N, graph.num_edges)
    cfg = TrainConfig(model="gcn", dataset="test", epochs=3, progress=False)
    out = fit(cfg, s)
    model.train()
    with s.context():  # the training step's schedules (evaluation's are the last used)
        model(graph, x).sum().backward()
    want = [moved_bytes(last_schedule(layer)) for layer in model.layers]
    h2d = sum(w["fwd_h2d"] + w["bwd_h2d"] for w in want)
    d2h = sum(w["fwd_d2h"] + w["bwd_d2h"] for w in want)
    assert out["h2d_mb_per_epoch"] * 2**20 == pytest.approx(h2d)
    assert out["d2h_mb_per_epoch"] * 2**20 == pytest.approx(d2h)
    assert out["transfer_bound_s"] > 0 and out["epoch_over_transfer_bound"] > 0
    assert list(tmp_path.glob("copy-*.json")), "the bandwidth is cached beside the link's"


def test_explain_shows_the_schedule_and_its_bytes():
    from ngra import explain

    model, _ = _model("gat", 1)
    graph, _ = prepare("gat", _case("random", 1))
    x = torch.randn(N, 5, dtype=torch.float64)
    with device_streaming("cpu", parts=4, cache=1):
        text = explain(model, graph, x)
    assert text.count("device streaming on cpu: 4 x 4 tiles") == 2, text
    assert "1 source chunk(s) kept on the device" in text
    assert "forward host->device" in text and "predicted device peak" in text
    assert "device streaming" not in explain(model, graph, x)  # resident: no schedule
