"""Per-field gathers (``gather = {"m": "mean", "hi": "max", ...}``): the fields of one
edge stage reduced by different accumulators.

Compiled (the element-wise fields as one ``fused_edge_aggregate_multi`` walk) == the
generic UDF path == a plain-torch reference, and == a tile grid (memory budget) and the
chunked interpreted stage, forward and backward on the labeled graph cases; the GPU's
fallback (one kernel per field) gives the same; ``ngra.explain`` names the kernel; bad
gathers fail with clear errors.
"""

from __future__ import annotations

import pytest
import torch
from _compiler_cases import GRAPH_CASES, _mean_to, _sum_to, assert_close_all, grads, make_graph
from torch import nn

import ngra
import ngra.compiler.edge_stage as edge_stage
from ngra import SagaLayer, explain
from ngra.compiler import compile_layer, disabled
from ngra.runtime.budget import grid_shape
from ngra.runtime.executor import choose_runtime_grid

TOL = {"rtol": 1e-8, "atol": 1e-9}
F_IN = 6


class Aggregators(SagaLayer):
    """PNA-like: mean, second moment, max, min and a gated sum of one message."""

    gather = {"mean": "mean", "sq": "mean", "hi": "max", "lo": "min", "gated": "sum"}

    def __init__(self, f: int) -> None:
        super().__init__()
        self.pre = nn.Linear(2 * f, f)

    def apply_edge(self, edge):
        h = self.pre(torch.cat([edge.dst, edge.src], dim=-1))
        return {"mean": h, "sq": h * h, "hi": h, "lo": h,
                "gated": torch.sigmoid(h) * edge.src}

    def apply_vertex(self, vertex, acc):
        return torch.cat([acc["mean"], acc["sq"], acc["hi"], acc["lo"], acc["gated"]], -1)


class NormedAggregators(Aggregators):
    """The same fields of a LayerNorm'd message: no kernel fuses it (the interpreted edge
    stage, run in chunks of edges)."""

    def apply_edge(self, edge):
        h = self.pre(torch.cat([edge.dst, edge.src], dim=-1))
        h = nn.functional.layer_norm(h, h.shape[-1:])
        return {"mean": h, "sq": h * h, "hi": h, "lo": h, "gated": torch.sigmoid(h) * edge.src}


def _extreme_to(msg, dst, n, how):
    out = msg.new_zeros(n, msg.shape[1])
    idx = dst.unsqueeze(-1).expand_as(msg)
    return out.scatter_reduce(0, idx, msg, how, include_self=False)


def _reference(layer, g, x, normed=False):
    src, dst = g.edge_index()
    n = g.num_nodes
    xs, xd = x.index_select(0, src), x.index_select(0, dst)
    h = layer.pre(torch.cat([xd, xs], -1))
    if normed:
        h = nn.functional.layer_norm(h, h.shape[-1:])
    return torch.cat([_mean_to(h, dst, n), _mean_to(h * h, dst, n),
                      _extreme_to(h, dst, n, "amax"), _extreme_to(h, dst, n, "amin"),
                      _sum_to(torch.sigmoid(h) * xs, dst, n)], -1)


def _tiling_budget(layer, g, x) -> str:
    """A memory budget under which ``layer`` runs on ``g`` on several tiles (the plan's
    per-tile bytes decide which: a fused walk needs little per edge, an interpreted one more)."""
    for budget in ("3KB", "4KB", "6KB", "8KB", "12KB", "16KB", "24KB", "32KB", "48KB"):
        with ngra.memory_budget(budget):
            plan = compile_layer(layer, g, x, None)
            try:
                grid, _ = choose_runtime_grid(plan, g, plan.pre(x).terms, None)
            except ValueError:  # too small for any grid
                continue
        if grid.num_tiles > 1:
            return budget
    raise AssertionError("no budget tried tiles the graph")


def _run(layer, g, x, probe):
    out = layer(g, x)
    return [out] + grads(out, probe, [x] + list(layer.parameters()))


def _reference_run(layer, g, x, probe, normed=False):
    out = _reference(layer, g, x, normed)
    return [out] + grads(out, probe, [x] + list(layer.parameters()))


@pytest.mark.parametrize("case", GRAPH_CASES)
def test_compiled_equals_generic_equals_reference(case):
    g = make_graph(case)
    layer = Aggregators(F_IN).double()
    x = torch.randn(g.num_nodes, F_IN, dtype=torch.float64, requires_grad=True)
    plan = compile_layer(layer, g, x, None)
    assert plan.edge_kinds == ("fused_edge_multi",) * 5, "\n".join(plan.describe())
    probe = torch.randn(g.num_nodes, 5 * F_IN, dtype=torch.float64)
    got = _run(layer, g, x, probe)
    assert_close_all(got, _reference_run(layer, g, x, probe), f"{case}: compiled vs ref", **TOL)
    with disabled():
        generic = _run(layer, g, x, probe)
    assert_close_all(generic, got, f"{case}: generic vs compiled", **TOL)


@pytest.mark.parametrize("normed", [False, True])
def test_tile_grid_and_memory_budget_equal_the_whole_graph(normed):
    g = make_graph("skewed", n=23)
    layer = (NormedAggregators if normed else Aggregators)(F_IN).double()
    x = torch.randn(g.num_nodes, F_IN, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(g.num_nodes, 5 * F_IN, dtype=torch.float64)
    whole = _run(layer, g, x, probe)
    assert_close_all(whole, _reference_run(layer, g, x, probe, normed), "whole vs ref", **TOL)
    with grid_shape(3, 2):
        tiled = _run(layer, g, x, probe)
    assert_close_all(tiled, whole, "3x2 grid vs whole graph", **TOL)
    with ngra.memory_budget(_tiling_budget(layer, g, x)):
        budget = _run(layer, g, x, probe)
    assert_close_all(budget, whole, "memory budget vs whole graph", **TOL)
    with disabled(), grid_shape(3, 2):
        generic = _run(layer, g, x, probe)
    assert_close_all(generic, whole, "generic 3x2 grid vs whole graph", **TOL)


def test_chunked_interpreted_fields_equal_whole_edges(monkeypatch):
    """No kernel fuses the LayerNorm'd message: the edge stage runs in chunks, each field
    merged by its own reducer (a max/min field keeps the chunk of each extreme)."""
    g = make_graph("skewed", n=60)
    layer = NormedAggregators(F_IN).double()
    x = torch.randn(g.num_nodes, F_IN, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(g.num_nodes, 5 * F_IN, dtype=torch.float64)
    monkeypatch.setenv("NGRA_EDGE_CHUNK", "16")
    assert "chunked generic path" in explain(layer, g, x)
    chunked = _run(layer, g, x, probe)
    monkeypatch.setenv("NGRA_EDGE_CHUNK", "0")
    whole = _run(layer, g, x, probe)
    assert_close_all(chunked, whole, "chunked vs whole edges", **TOL)
    assert_close_all(whole, _reference_run(layer, g, x, probe, True), "whole vs ref", **TOL)


def test_backend_without_multi_kernel_runs_one_kernel_per_field(monkeypatch):
    """Where the device's backend lacks the multi-output kernel (the GPU's), each field
    runs its own fused_edge_aggregate: the same results."""
    g = make_graph("random")
    layer = Aggregators(F_IN).double()
    x = torch.randn(g.num_nodes, F_IN, dtype=torch.float64, requires_grad=True)
    probe = torch.randn(g.num_nodes, 5 * F_IN, dtype=torch.float64)
    one_walk = _run(layer, g, x, probe)
    calls = []
    real = edge_stage.EdgeStage._fused
    monkeypatch.setattr(edge_stage.EdgeStage, "_fused",
                        lambda self, *a: calls.append(a[1].expr) or real(self, *a))
    monkeypatch.setattr(edge_stage, "backend_for",
                        lambda op, device: "ref" if "multi" in op else "cpu")
    per_field = _run(layer, g, x, probe)
    assert len(calls) == 5
    assert_close_all(per_field, one_walk, "per-field kernels vs one walk", **TOL)


def test_explain_names_the_multi_kernel():
    g = make_graph("random")
    layer = Aggregators(F_IN).double()
    text = explain(layer, g, torch.randn(g.num_nodes, F_IN, dtype=torch.float64))
    assert "plan: compiled (" + ", ".join(["fused_edge_multi"] * 5) + ")" in text, text
    assert "fused_edge_aggregate_multi(" in text and "from one walk" in text, text
    assert "gather  per field: 'mean' mean, 'sq' mean, 'hi' max, 'lo' min, 'gated' sum" \
        in text, text
    assert "not fused" not in text, text


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("gather,match", [
    ({"m": "median"}, r"gather\['m'\] must be one of \('sum', 'mean', 'max', 'min'\)"),
    ({"m": "mean", "s": "softmax"}, r"gather\['s'\] = 'softmax'.*does not mix"),
    ({}, "empty dict"),
    ({1: "sum"}, "field names must be strings"),
    (("sum", "max"), "must be one of .* or a dict"),
])
def test_bad_gathers_fail_at_class_definition(gather, match):
    with pytest.raises(TypeError, match=match):
        type("Bad", (SagaLayer,), {"gather": gather})


@pytest.mark.parametrize("fields,match", [
    ({"m": "mean", "hi": "max", "extra": "sum"}, r"no field \['extra'\] in the result"),
    ({"m": "mean"}, r"no reducer for \['hi'\]"),
])
def test_fields_that_do_not_match_apply_edge_fail_clearly(fields, match):
    class Layer(SagaLayer):
        gather = fields

        def apply_edge(self, edge):
            return {"m": edge.src, "hi": edge.src * 2}

    g = make_graph("random")
    x = torch.randn(g.num_nodes, F_IN)
    for ctx in (disabled(), grid_shape(1, 1)):
        with ctx, pytest.raises(ValueError, match=match):
            Layer()(g, x)


def test_a_per_field_gather_needs_a_dict_message():
    class Layer(SagaLayer):
        gather = {"m": "mean"}

    g = make_graph("random")
    for ctx, got in ((disabled(), "Tensor"), (grid_shape(1, 1), "one tensor")):
        with ctx, pytest.raises(ValueError, match=f"dict message; apply_edge returned {got}"):
            Layer()(g, torch.randn(g.num_nodes, F_IN))
