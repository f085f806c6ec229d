"""A SAGA layer's ``attention_dropout``: compiled == generic == plain torch, on the whole
graph and on streamed tiles, forward and backward; eval mode; the edge-counter hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _compiler_cases import GRAPH_CASES, assert_close_all, grads, make_graph
from torch import nn

from ngra import Graph, SagaLayer, explain
from ngra.compiler import compile_layer, disabled
from ngra.kernels import EdgeDropout
from ngra.models import GATConv, build_model
from ngra.runtime.budget import grid_shape
from ngra.runtime.executor import run_plan
from ngra.runtime.staging import staging_mode

P = 0.5
TOL = {"rtol": 1e-9, "atol": 1e-10}


class TwoScores(SagaLayer):
    """Scores that are not rowdots of the value: softmax_aggregate on every grid; with
    ``sign = -1`` the score matches no kernel and the edge stage is interpreted."""

    gather = "softmax"
    attention_dropout = P

    def __init__(self, f_in: int, sign: float, heads: int = 2, dim: int = 3) -> None:
        super().__init__()
        self.heads, self.dim, self.sign = heads, dim, sign
        self.value = nn.Linear(f_in, heads * dim)
        self.score = nn.Linear(f_in, heads)

    def apply_edge(self, edge):
        s = self.score(edge.src) - self.score(edge.dst) if self.sign < 0 else \
            self.score(edge.src) + self.score(edge.dst)
        return F.leaky_relu(s, 0.2), self.value(edge.src).view(-1, self.heads, self.dim)


LAYERS = {"gat": ("softmax_aggregate",), "two_scores": ("softmax_aggregate",),
          "interpreted": ("interp",)}


def _layer(name: str, f_in: int) -> nn.Module:
    if name == "gat":
        return GATConv(f_in, 3, heads=2, attention_dropout=P).double()
    return TwoScores(f_in, -1.0 if name == "interpreted" else 1.0).double()


def _reference(name: str, layer: nn.Module, g: Graph, x: torch.Tensor,
               drop: EdgeDropout) -> torch.Tensor:
    """Plain torch over the original edge list: softmax, then the mask of each edge's
    original id (row ``id`` of ``drop.factors``, which is indexed by CSC position)."""
    src, dst = g.edge_index()
    n = g.num_nodes
    if name == "gat":
        h = (x @ layer.lin.weight.T).view(n, layer.heads, layer.f_out)
        e = F.leaky_relu((h * layer.a_src).sum(-1)[src] + (h * layer.a_dst).sum(-1)[dst], 0.2)
    else:
        h = layer.value(x).view(n, layer.heads, layer.dim)
        s = layer.score(x)
        e = F.leaky_relu(s[src] + layer.sign * s[dst], 0.2)
    heads = e.shape[1]
    emax = torch.full((n, heads), -torch.inf, dtype=e.dtype).scatter_reduce(
        0, dst.view(-1, 1).expand(-1, heads), e, "amax")
    p = torch.exp(e - emax[dst])
    alpha = p / torch.zeros(n, heads, dtype=e.dtype).index_add(0, dst, p)[dst]
    by_id = torch.empty(g.num_edges, heads, dtype=e.dtype)
    by_id[g.perm] = drop.factors(heads, e.dtype)  # CSC position -> original id
    out = torch.zeros(n, heads, h.shape[2], dtype=h.dtype).index_add(
        0, dst, (alpha * by_id)[..., None] * h[src])
    return out.flatten(1) + layer.bias if name == "gat" else out


def _seeds_after(seed: int) -> tuple[int, int]:
    """The two seeds a layer call with no input dropout draws first after ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return tuple(int(s) for s in torch.randint(0, 2**32, (2,), dtype=torch.int64))


def _run(layer, g, x, probe, seed=7):
    torch.manual_seed(seed)
    out = layer(g, x)
    return [out] + grads(out, probe, [x] + list(layer.parameters()))


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("case", GRAPH_CASES)
def test_compiled_generic_reference_whole_and_tiles(case, name):
    g = make_graph(case, n=17).remove_self_loops().add_self_loops()
    layer = _layer(name, 6)
    x = torch.randn(g.num_nodes, 6, dtype=torch.float64, requires_grad=True)
    assert compile_layer(layer, g, x, None).edge_kinds == LAYERS[name]
    out0 = layer(g, x)
    probe = torch.randn_like(out0)
    drop = EdgeDropout(P, g.perm, *_seeds_after(7))
    ref = [_reference(name, layer, g, x, drop)]
    ref += grads(ref[0], probe, [x] + list(layer.parameters()))
    results = {"compiled": _run(layer, g, x, probe)}
    with disabled():
        results["generic"] = _run(layer, g, x, probe)
    for shape, staging in (((3, 2), "gather"), ((2, 3), "span"), ((4, 1), "gather")):
        with grid_shape(*shape), staging_mode(staging):
            results[f"compiled {shape}"] = _run(layer, g, x, probe)
            with disabled():
                results[f"generic {shape}"] = _run(layer, g, x, probe)
    for what, got in results.items():
        assert_close_all(got, ref, f"{name}/{case}: {what} vs plain torch", **TOL)


def test_dropout_is_active_seeded_and_off_in_eval():
    g = make_graph("random", n=30).add_self_loops()
    layer = GATConv(5, 4, heads=3, attention_dropout=0.6)
    x = torch.randn(g.num_nodes, 5)
    torch.manual_seed(1)
    a = layer(g, x)
    torch.manual_seed(1)
    b = layer(g, x)
    torch.manual_seed(2)
    c = layer(g, x)
    assert torch.equal(a, b) and not torch.equal(a, c)
    layer.attention_dropout = 0.0
    torch.manual_seed(1)
    plain = layer(g, x)
    assert not torch.equal(a, plain)
    layer.attention_dropout = 0.6
    layer.eval()
    state = torch.get_rng_state()
    e1, e2 = layer(g, x), layer(g, x)
    assert torch.equal(e1, e2) and torch.equal(e1, plain)
    assert torch.equal(torch.get_rng_state(), state)  # eval draws nothing


def test_no_attention_dropout_draws_nothing():
    """At p = 0 a training call draws no seeds: other random ops see today's stream."""
    g = make_graph("random", n=20).add_self_loops()
    layer = GATConv(4, 2, heads=2)
    state = torch.get_rng_state()
    layer(g, torch.randn(g.num_nodes, 4))
    after = torch.get_rng_state()
    torch.set_rng_state(state)
    torch.randn(g.num_nodes, 4)
    assert torch.equal(after, torch.get_rng_state())


def test_edge_counter_hook_reproduces_another_layout():
    """The same edges listed in another order give another CSC layout; passing the
    first graph's edge ids as the counter (what a distributed runtime does with global
    ids) reproduces the first graph's masks and outputs exactly."""
    g = make_graph("skewed", n=25).add_self_loops()
    order = torch.randperm(g.num_edges)
    h = Graph.from_edge_index(g.edge_index()[:, order], num_nodes=g.num_nodes)
    layer = GATConv(4, 3, heads=2, attention_dropout=0.5).double()
    x = torch.randn(g.num_nodes, 4, dtype=torch.float64)
    plan_g = compile_layer(layer, g, x, None)
    plan_h = compile_layer(layer, h, x, None)
    torch.manual_seed(3)
    want = run_plan(plan_g, g, None, x, None, attention_dropout=0.5)
    torch.manual_seed(3)
    got = run_plan(plan_h, h, None, x, None, attention_dropout=0.5, edge_counter=order[h.perm])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.manual_seed(3)
    other = run_plan(plan_h, h, None, x, None, attention_dropout=0.5)
    assert not torch.allclose(other, want)
    with pytest.raises(ValueError, match="one counter per edge"):
        run_plan(plan_h, h, None, x, None, attention_dropout=0.5, edge_counter=order[:3])


def test_graph_in_caller_order_makes_no_counter_array():
    """Edges given in CSC order (no ``perm`` stored): the masks hash each edge's position
    (the identity), as an explicit 0 .. E-1 counter would, forward and backward, and
    neither the call nor the graph keeps an ``[E]`` counter array."""
    g = make_graph("skewed", n=30).add_self_loops()
    in_csc_order = torch.stack([g.indices.long(), g.dst_index().long()])
    lean = Graph.from_edge_index(in_csc_order, num_nodes=g.num_nodes)  # sorted: no perm
    assert not lean.has_perm
    layer = GATConv(4, 3, heads=2, attention_dropout=0.5).double()
    x = torch.randn(lean.num_nodes, 4, dtype=torch.float64, requires_grad=True)
    plan = compile_layer(layer, lean, x, None)
    outs = []
    for counter in (None, torch.arange(lean.num_edges)):
        torch.manual_seed(5)
        out = run_plan(plan, lean, None, x, None, attention_dropout=0.5, edge_counter=counter)
        outs.append((out, *torch.autograd.grad(out.square().sum(), [x, layer.lin.weight])))
        if counter is None:
            assert not any("counter" in str(k) for k in lean._cache), list(lean._cache)
    assert_close_all(outs[0], outs[1], "identity vs explicit counter", rtol=1e-12, atol=1e-12)


def test_explain_says_where_it_runs():
    g = make_graph("random", n=12).add_self_loops()
    text = explain(GATConv(4, 2, heads=2, attention_dropout=0.6), g, torch.randn(12, 4))
    assert "attention dropout (attention_dropout=0.6" in text and "no [E, H] mask" in text


def test_zoo_gat_uses_the_papers_attention_dropout():
    gat = build_model("gat", 10, 3)
    assert [layer.attention_dropout for layer in gat.layers] == [0.6, 0.6]
    assert all(layer.attention_dropout == 0 for layer in
               build_model("gat", 10, 3, attention_dropout=0.0).layers)
    with pytest.raises(ValueError, match="gcn has no attention_dropout setting"):
        build_model("gcn", 10, 3, attention_dropout=0.5)


def test_bad_attention_dropout_is_a_clear_error():
    g = make_graph("random", n=10).add_self_loops()
    x = torch.randn(10, 4)
    for p in (1.0, -0.2, 2):
        with pytest.raises(ValueError, match=r"in \[0, 1\)"):
            GATConv(4, 2, attention_dropout=p)
    layer = GATConv(4, 2)
    layer.attention_dropout = 1.0
    with pytest.raises(ValueError, match=r"GATConv.attention_dropout probability must be"):
        layer(g, x)
    layer.eval()
    with pytest.raises(ValueError, match="attention_dropout"):  # checked in eval mode too
        layer(g, x)

    with pytest.raises(TypeError, match="softmax gather; its gather is 'sum'"):
        class SumAtt(SagaLayer):  # noqa: F841
            gather = "sum"
            attention_dropout = 0.3

    with pytest.raises(TypeError, match=r"probability in \[0, 1\)"):
        class Bad(SagaLayer):  # noqa: F841
            gather = "softmax"
            attention_dropout = 1.0

    class Mean(SagaLayer):
        gather = "mean"

    mean = Mean()
    mean.attention_dropout = 0.5
    with pytest.raises(ValueError, match="gather is 'mean'"):
        mean(g, x)


def _memory_child(mode: str) -> dict:
    child = Path(__file__).with_name("attention_memory_child.py")
    env = dict(os.environ, OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, str(child), mode, "20000", "1000000", "8"],
                         capture_output=True, text=True, timeout=300, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a measuring child process, ~35 s on a busy 2-core machine
def test_attention_dropout_stores_no_edge_mask():
    """Peak RSS of a GAT step (10^6 edges, 8 heads: an [E, H] float32 mask is 32 MB) with
    attention dropout stays within a quarter of that mask of the step without it; the
    control, a step holding such a tensor, is most of a mask above (the bound can fail)."""
    off, on = _memory_child("off"), _memory_child("on")
    size = on["mask_bytes"]
    assert on["used"] - off["used"] < 0.25 * size, (
        f"attention dropout added {(on['used'] - off['used']) / 2**20:.1f} MiB to a "
        f"{off['used'] / 2**20:.0f} MiB step (an [E, H] mask: {size / 2**20:.0f} MiB)")
    assert on["control_used"] - on["used"] > 0.6 * size, on
