"""The chunked edge stage (:mod:`ngra.compiler.chunked`, issue 39 item 2): an edge stage no
kernel fuses runs a chunk of edges at a time and recomputes each chunk in backward.

Checked: the chunking itself (edge ranges, the destination rows each covers, a split
destination); the chunked path (forced tiny chunks, ``NGRA_EDGE_CHUNK=3``) against the
whole-edge path (``NGRA_EDGE_CHUNK=0``) and the plain-torch reference, forward and backward
(inputs, parameters, edge data), for the conformance layers that do not fuse (on the
compiled plan: EdgeConvMLP's interpreted stage; on the generic plan: EdgeMLPNorm, PNA's
mean/max/min, GatedGCN's dict-valued sum, GATv2's softmax) on the labeled graph cases and
a hub whose in-edges span many chunks; exact max ties across chunks; a dropout inside the
UDF drawn alike in the forward and the recomputation; the last chunk kept from the forward
(not recomputed) and a second backward; eval mode; the explain line; the
setting's validation; and the memory of a training step (``chunk_memory_child.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _compiler_cases import GRAPH_CASES, assert_close_all, make_graph
from conformance_layers import EdgeConvMLP, conformance_case
from torch import nn

import ngra
from ngra import SagaLayer, explain
from ngra.compiler import chunked, disabled
from ngra.compiler.chunked import chunk_bounds

TOL = {"rtol": 1e-8, "atol": 1e-9}


# ---------------------------------------------------------------- the chunking
@pytest.mark.parametrize("degrees,size", [
    ([3, 0, 7, 1, 0, 9, 1, 1], 5),     # empty rows, rows longer than a chunk
    ([0, 0, 30, 0], 7),                # one hub split over five chunks, empty rows around it
    ([1] * 20, 4),                     # every cut at a row start
    ([2, 2, 2], 100),                  # one chunk
])
def test_chunk_bounds_cover_every_edge_and_row(degrees, size):
    indptr = torch.zeros(len(degrees) + 1, dtype=torch.int64)
    torch.cumsum(torch.tensor(degrees), 0, out=indptr[1:])
    bounds = chunk_bounds(indptr, size)
    e, n = int(indptr[-1]), len(degrees)
    assert bounds[0][0] == 0 and bounds[-1][1] == e and bounds[0][2] == 0 and bounds[-1][3] == n
    for (b0, b1, lo, hi), nxt in zip(bounds, bounds[1:] + [None]):
        assert 0 < b1 - b0 <= size
        # the rows hold exactly the chunk's edges (a split row only partly)
        assert int(indptr[lo]) <= b0 and int(indptr[hi]) >= b1
        if nxt is not None:
            assert nxt[0] == b1
            split = int(indptr[nxt[2]]) < b1
            assert nxt[2] == (hi - 1 if split else hi)
            assert not split or degrees[nxt[2]] > size  # only a row longer than a chunk


def test_auto_chunk_size_follows_the_device(monkeypatch):
    monkeypatch.delenv("NGRA_EDGE_CHUNK", raising=False)
    big = 2**30  # a multiple of every budget here: equal chunks of exactly the budget
    assert chunked.chunk_edges(256, big) == chunked.CHUNK_BYTES // 256
    # a GPU pays per chunk in launches and syncs: far larger chunks there
    assert chunked.chunk_edges(256, big, torch.device("cuda")) == chunked.CHUNK_BYTES_CUDA // 256
    assert chunked.chunk_edges(10**6, big) == chunked.MIN_AUTO_CHUNK  # wide rows: a floor
    assert chunked.chunk_edges(256, chunked.CHUNK_BYTES // 256) is None  # fits one chunk
    # as few chunks as the budget allows, of equal size: one edge over the budget makes
    # two halves, not a full chunk and a chunk of one edge
    want = chunked.CHUNK_BYTES // 256
    assert chunked.chunk_edges(256, want + 1) == (want + 2) // 2
    assert chunked.chunk_edges(256, 2 * want + 3) == (2 * want + 3 + 2) // 3
    monkeypatch.setenv("NGRA_EDGE_CHUNK", "0")
    assert chunked.chunk_edges(256, big) is None
    monkeypatch.setenv("NGRA_EDGE_CHUNK", "100")
    assert chunked.chunk_edges(256, big) == 100 and chunked.chunk_edges(256, 100) is None


# ---------------------------------------------------------------- exactness
def _hub_graph() -> ngra.Graph:
    """A hub (vertex 2) with 40 in-edges, self loops, a duplicate edge and isolated 6..9."""
    gen = torch.Generator().manual_seed(3)
    src = torch.cat([torch.randint(0, 6, (40,), generator=gen), torch.arange(6),
                     torch.tensor([0, 0, 4, 5])])
    dst = torch.cat([torch.full((40,), 2), torch.arange(6), torch.tensor([1, 1, 3, 0])])
    return ngra.Graph.from_edge_index(torch.stack([src, dst]), num_nodes=10)


def _graph(case: str) -> ngra.Graph:
    return _hub_graph() if case == "hub" else make_graph(case)


def _run(case, probe=None):
    """``[outputs..., grads of x, the parameters and float edge data]``, and the probes."""
    out = case.layer(case.graph, case.x, case.edata)
    out = list(out) if isinstance(out, tuple) else [out]
    if probe is None:
        probe = [torch.randn_like(o) for o in out]
    inputs = [case.x] + list(case.layer.parameters())
    if isinstance(case.edata, torch.Tensor) and case.edata.requires_grad:
        inputs.append(case.edata)
    gs = torch.autograd.grad(sum((o * p).sum() for o, p in zip(out, probe)), inputs,
                             allow_unused=True)
    return out + [torch.zeros_like(i) if g is None else g for g, i in zip(gs, inputs)], probe


def _ref(case, probe):
    out = case.ref(case.layer, case.graph, case.x, case.edata)
    out = list(out) if isinstance(out, tuple) else [out]
    inputs = [case.x] + list(case.layer.parameters())
    if isinstance(case.edata, torch.Tensor) and case.edata.requires_grad:
        inputs.append(case.edata)
    gs = torch.autograd.grad(sum((o * p).sum() for o, p in zip(out, probe)), inputs,
                             allow_unused=True)
    return out + [torch.zeros_like(i) if g is None else g for g, i in zip(gs, inputs)]


@pytest.fixture
def chunk_calls(monkeypatch):
    """The number of chunked edge-stage runs (the path the test means to check ran)."""
    calls = []
    run = chunked.run_chunked

    def counted(*a, **k):
        calls.append(a[0])
        return run(*a, **k)

    monkeypatch.setattr(chunked, "run_chunked", counted)
    return calls


# (layer, plan): edgeconv_mlp's interpreted stage on the compiled plan; the rest on the
# generic plan (edge_mlp_norm's own; the others' with the compiler disabled)
UNFUSED = [("edgeconv_mlp", "compiled"), ("edge_mlp_norm", "compiled"), ("pna", "generic"),
           ("gatedgcn", "generic"), ("gatv2", "generic")]


@pytest.mark.parametrize("case_name", GRAPH_CASES + ("hub",))
@pytest.mark.parametrize("name,plan", UNFUSED)
def test_chunked_matches_whole_edge_path_and_reference(name, plan, case_name, monkeypatch,
                                                       chunk_calls):
    case = conformance_case(name, _graph(case_name))
    with disabled() if plan == "generic" else contextlib.nullcontext():
        monkeypatch.setenv("NGRA_EDGE_CHUNK", "0")
        whole, probe = _run(case)
        assert not chunk_calls
        monkeypatch.setenv("NGRA_EDGE_CHUNK", "3")
        got, _ = _run(case, probe)
    if case.graph.num_edges > 3:
        assert chunk_calls and all(len(c) > 1 for c in chunk_calls)
    else:
        assert not chunk_calls
    assert_close_all(got, whole, f"{name} ({plan}) on {case_name}: chunked vs whole edges", **TOL)
    assert_close_all(got, _ref(case, probe), f"{name} ({plan}) on {case_name}: vs reference",
                     **TOL)


def test_max_ties_across_chunks_route_the_gradient_once(monkeypatch, chunk_calls):
    """Every message equal (the last Linear's bias alone): each destination's extreme is
    held by every chunk of its edges; the gradient goes to its first edge only, as the
    whole-edge kernel's ("the first extreme row wins"), not once per chunk."""
    g = _hub_graph()
    layer = EdgeConvMLP(4, 3).double()
    with torch.no_grad():
        layer.mlp[2].weight.zero_()
    x = torch.randn(g.num_nodes, 4, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(g.num_nodes, 3, dtype=torch.float64)
    grads = []
    for setting in ("0", "3"):
        monkeypatch.setenv("NGRA_EDGE_CHUNK", setting)
        out = layer(g, x)
        grads.append(torch.autograd.grad((out * probe).sum(), list(layer.parameters())))
    assert len(chunk_calls) == 1
    assert_close_all(grads[1], grads[0], "ties: chunked vs whole", **TOL)
    # the bias gets each destination with in-edges' probe once
    has = (g.in_degrees() > 0).to(probe.dtype)
    torch.testing.assert_close(grads[1][-1], (probe * has[:, None]).sum(0), **TOL)


class _DroppedMessage(SagaLayer):
    """``sum_u dropout(x_u) * w``: the loss is linear in ``w``, so ``d loss / d w`` is
    ``loss / w`` only when backward draws the forward's masks."""

    gather = "sum"

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(1.5, dtype=torch.float64))

    def apply_edge(self, edge):
        return F.dropout(edge.src, 0.5, self.training) * self.w


def test_dropout_in_the_udf_is_drawn_alike_in_recomputation(monkeypatch, chunk_calls):
    monkeypatch.setenv("NGRA_EDGE_CHUNK", "4")
    g = make_graph("skewed")
    layer = _DroppedMessage().train()
    x = torch.randn(g.num_nodes, 5, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(g.num_nodes, 5, dtype=torch.float64)
    with disabled():
        loss = (layer(g, x) * probe).sum()
        (gw,) = torch.autograd.grad(loss, [layer.w])
    assert chunk_calls
    torch.testing.assert_close(gw, loss.detach() / layer.w.detach(), **TOL)


def test_eval_mode_runs_chunked_without_autograd(monkeypatch, chunk_calls):
    case = conformance_case("edge_mlp_norm", make_graph("skewed"))
    with torch.no_grad():
        monkeypatch.setenv("NGRA_EDGE_CHUNK", "0")
        whole = case.layer(case.graph, case.x)
        monkeypatch.setenv("NGRA_EDGE_CHUNK", "5")
        got = case.layer(case.graph, case.x)
    assert chunk_calls and not got.requires_grad
    torch.testing.assert_close(got, whole, **TOL)


class _CountedEdgeMLP(SagaLayer):
    """A sum of ``tanh(W [x_dst, x_src])`` that counts its ``apply_edge`` calls."""

    gather = "sum"

    def __init__(self, f: int) -> None:
        super().__init__()
        self.lin = nn.Linear(2 * f, f).double()
        self.calls = 0

    def apply_edge(self, edge):
        self.calls += 1
        return torch.tanh(self.lin(torch.cat([edge.dst, edge.src], -1)))


def test_backward_recomputes_every_chunk_but_the_kept_last_one(monkeypatch, chunk_calls):
    """The forward runs the last chunk under autograd and keeps its graph: backward
    recomputes the other chunks only. A second backward (``retain_graph``) has no kept
    graph left and recomputes every chunk, with the same gradients."""
    monkeypatch.setenv("NGRA_EDGE_CHUNK", "6")
    g = make_graph("skewed")
    layer = _CountedEdgeMLP(3)
    x = torch.randn(g.num_nodes, 3, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(g.num_nodes, 3, dtype=torch.float64)
    with disabled():
        loss = (layer(g, x) * probe).sum()
    (chunks,) = chunk_calls
    n = len(chunks)
    assert n > 2 and layer.calls == n
    inputs = [x, *layer.parameters()]
    first = torch.autograd.grad(loss, inputs, retain_graph=True)
    assert layer.calls == 2 * n - 1
    second = torch.autograd.grad(loss, inputs)
    assert layer.calls == 3 * n - 1
    assert_close_all(second, first, "second backward vs first", **TOL)
    monkeypatch.setenv("NGRA_EDGE_CHUNK", "0")
    with disabled():
        whole = torch.autograd.grad((layer(g, x) * probe).sum(), inputs)
    assert_close_all(first, whole, "kept last chunk vs whole edges", **TOL)


# ---------------------------------------------------------------- explain, setting
def test_explain_says_chunked_or_why_not(monkeypatch):
    case = conformance_case("edge_mlp_norm", make_graph("skewed"))
    e = case.graph.num_edges
    monkeypatch.setenv("NGRA_EDGE_CHUNK", "16")
    text = explain(case.layer, case.graph, case.x)
    n = len(chunk_bounds(case.graph.indptr, 16))
    assert f"chunked generic path: {n} chunks of about 16 edges (NGRA_EDGE_CHUNK=16)" in text
    assert "not fused:" in text  # and, as before, why it did not fuse
    monkeypatch.setenv("NGRA_EDGE_CHUNK", "0")
    assert f"all {e} edges at once (NGRA_EDGE_CHUNK=0)" in explain(case.layer, case.graph,
                                                                   case.x)
    fused = conformance_case("edgeconv", make_graph("skewed"))
    assert "chunks" not in explain(fused.layer, fused.graph, fused.x)


@pytest.mark.parametrize("raw", ["-1", "many", "1.5"])
def test_bad_chunk_setting_says_what_it_takes(monkeypatch, raw):
    monkeypatch.setenv("NGRA_EDGE_CHUNK", raw)
    case = conformance_case("edge_mlp_norm", make_graph("random"))
    with pytest.raises(ValueError, match=r"NGRA_EDGE_CHUNK must be auto or an integer >= 0"):
        case.layer(case.graph, case.x)


# ---------------------------------------------------------------- memory
def test_training_step_keeps_no_edge_tensors():
    """EdgeMLPNorm, 150k edges, width 32 (one [E, 32] float32 tensor: 19.2 MB): a training
    step on 8192-edge chunks works in at least three such tensors less than the same
    step over every edge at once, which keeps them for backward."""
    child = Path(__file__).with_name("chunk_memory_child.py")
    env = dict(os.environ, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE")
    out = subprocess.run([sys.executable, str(child), "10000", "150000", "32", "8192"],
                         capture_output=True, text=True, timeout=300, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    whole, chunk, ef = got["whole"], got["chunked"], got["ef_bytes"]
    assert chunk["chunked"] and not whole["chunked"], got
    assert chunk["used"] < whole["used"] - 3 * ef, (
        f"chunked step {chunk['used'] / 2**20:.1f} MiB vs whole {whole['used'] / 2**20:.1f} "
        f"MiB; one [E, F] tensor is {ef / 2**20:.1f} MiB")


class _CapturedWeight(SagaLayer):
    """Reads a tensor that requires grad and is no parameter: the chunked stage cannot
    hand it a gradient, and says so instead of dropping it."""

    gather = "sum"

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = w

    def apply_edge(self, edge):
        return edge.src * self.w


def test_a_captured_tensor_that_requires_grad_is_refused(monkeypatch):
    monkeypatch.setenv("NGRA_EDGE_CHUNK", "4")
    g = make_graph("skewed")
    layer = _CapturedWeight(torch.ones(3, requires_grad=True))
    x = torch.randn(g.num_nodes, 3, requires_grad=True)
    with disabled():
        out = layer(g, x).sum()
    with pytest.raises(RuntimeError, match="would get no gradient"):
        out.backward()
