"""ngra.probes: free when inactive, nesting and aggregation, backward markers."""

from __future__ import annotations

import time
import tracemalloc

import pytest
import torch

import ngra
from ngra import probes
from ngra.probes import Recorder, stage


def test_inactive_probes_cost_nothing_and_keep_no_state():
    assert probes.active() is None
    s1, s2 = stage("edge"), stage("post")
    assert s1 is s2  # one shared no-op object: nothing allocated per call
    assert type(s1).__slots__ == ()  # it cannot even hold state
    x = torch.randn(3, requires_grad=True)
    with s1 as s:
        assert s.outputs(x) is x and s.inputs(x) is x
    probes.annotate("plan", "ignored")
    assert probes.active() is None and probes._ACTIVE is None


class _CountingClock:
    """Stands in for the ``time`` module inside ``ngra.probes``: counts clock reads."""

    def __init__(self) -> None:
        self.reads = 0

    def perf_counter(self) -> float:
        self.reads += 1
        return float(self.reads)


def test_inactive_probes_read_no_clock_and_retain_nothing(monkeypatch):
    # What "free when inactive" rests on, checked without timing it (the per-call
    # cost is measured by experiments/probe_overhead.py): no clock read, one shared
    # object, no memory held by ngra.probes however many stages run.
    clock = _CountingClock()
    monkeypatch.setattr(probes, "time", clock)
    x = torch.randn(3, requires_grad=True)
    n = 2000
    tracemalloc.start()
    try:
        for _ in range(n):
            with stage("edge") as s:
                assert s is probes._NULL and s.outputs(x) is x and s.inputs(x) is x
        here = [tracemalloc.Filter(True, probes.__file__)]
        held = tracemalloc.take_snapshot().filter_traces(here).statistics("filename")
    finally:
        tracemalloc.stop()
    assert clock.reads == 0
    assert sum(st.size for st in held) == 0, held
    assert probes.active() is None
    with Recorder() as rec:  # the stand-in clock is the one stages read when active
        for _ in range(n):
            with stage("edge"):
                pass
    assert clock.reads == 2 * n and rec.counts() == {("edge",): n}


def test_stages_nest_and_aggregate():
    with Recorder() as rec:
        assert probes.active() is rec
        for _ in range(3):
            with stage("edge"):
                with stage("scatter"):
                    time.sleep(0.002)
                with stage("gather"):
                    time.sleep(0.001)
        with stage("gather"):  # same name at top level: a different path
            time.sleep(0.001)
    assert probes.active() is None
    inc, exc, counts = rec.inclusive(), rec.exclusive(), rec.counts()
    assert counts == {("edge",): 3, ("edge", "scatter"): 3, ("edge", "gather"): 3, ("gather",): 1}
    assert inc[("edge",)] >= inc[("edge", "scatter")] + inc[("edge", "gather")]
    assert inc[("edge", "scatter")] >= 0.006
    assert exc[("edge",)] == pytest.approx(
        inc[("edge",)] - inc[("edge", "scatter")] - inc[("edge", "gather")])
    by_name = rec.exclusive_by_name()
    assert by_name["gather"] == pytest.approx(inc[("edge", "gather")] + inc[("gather",)])
    # exclusive times partition the time spent inside top-level stages
    top = inc[("edge",)] + inc[("gather",)]
    assert sum(by_name.values()) == pytest.approx(top)
    rec.reset()
    assert rec.inclusive() == {} and rec.notes == {}


def test_recorders_stack():
    with Recorder() as outer:
        with stage("a"):
            pass
        with Recorder() as inner:
            assert probes.active() is inner
            with stage("b"):
                pass
        assert probes.active() is outer
    assert set(outer.inclusive()) == {("a",)} and set(inner.inclusive()) == {("b",)}


def test_backward_markers_split_the_backward_window():
    x = torch.randn(2000, 64, requires_grad=True)
    w = torch.randn(64, 64, requires_grad=True)
    with Recorder(backward=True) as rec:
        with stage("pre") as s:
            h = s.outputs(s.inputs(x) @ w)
        with stage("post") as s:
            y = s.outputs(torch.tanh(h).exp())
        t0 = time.perf_counter()
        y.sum().backward()
        t1 = time.perf_counter()
    labels = [lab for _, lab in rec.events]
    assert labels == [("post",), ("pre",), None]  # gradient reaches the stages in reverse order
    split = rec.backward_by_name(t0, t1)
    assert sum(split.values()) == pytest.approx(t1 - t0)
    assert split["post"] > 0 and split["pre"] > 0
    assert rec.backward(t0, t1)[("pre",)] == split["pre"]
    assert x.grad is not None and w.grad is not None


def test_markers_need_grad_and_backward_flag():
    x = torch.randn(4, requires_grad=True)
    with Recorder(backward=False):
        with stage("pre") as s:
            assert s.outputs(x) is x
    with Recorder(backward=True), torch.no_grad():
        with stage("pre") as s:
            assert s.outputs(x) is x


def test_runtime_probes_cover_generic_and_compiled_plans():
    from ngra.compiler import disabled
    from ngra.models import GCNConv

    torch.manual_seed(0)
    ei = torch.randint(0, 50, (2, 300))
    g = ngra.Graph.from_edge_index(ei, num_nodes=50).gcn_norm()
    layer = GCNConv(16, 8)
    x = torch.randn(50, 16)
    with disabled(), Recorder() as rec:
        layer(g, x)
    names = rec.exclusive_by_name()
    assert {"pre", "edge", "scatter", "apply_edge", "gather", "combine", "finalize",
            "post"} <= set(names)
    assert ("edge", "apply_edge", "scatter") in rec.inclusive()  # lazy gathers nest
    assert [p.kind for p in rec.notes["plan"]] == ["generic"]
    with Recorder() as rec2:
        layer(g, x)
    assert "scatter" not in rec2.exclusive_by_name()  # a fused plan has no separate Scatter
    assert rec2.notes["plan"][0].kind != "generic"
