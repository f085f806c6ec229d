"""Compiled plans on many tiles per column: partial states merge to the whole-graph result."""

from __future__ import annotations

import pytest
import torch
from _compiler_cases import ZOO, assert_close_all, grads, make_graph, zoo_case

from ngra.compiler import compile_layer, disabled
from ngra.runtime.budget import grid_shape
from ngra.runtime.executor import edge_data_csc
from ngra.runtime.staging import staging_mode

TOL = {"rtol": 1e-9, "atol": 1e-10}


def _inputs(layer, x, ed):
    inputs = [x] + [p for p in layer.parameters() if p.requires_grad]
    if isinstance(ed, torch.Tensor) and ed.is_floating_point():
        inputs.append(ed)
    return inputs


@pytest.mark.parametrize("staging", ["gather", "span"])
@pytest.mark.parametrize("name", ZOO)
def test_zoo_on_a_grid_equals_whole_graph(name, staging):
    layer, g, ed, _, kinds = zoo_case(name, make_graph("skewed", n=23))
    layer = layer.double()
    if isinstance(ed, torch.Tensor) and ed.is_floating_point():
        ed = ed.clone().requires_grad_(True)
    x = torch.randn(g.num_nodes, 6, dtype=torch.float64, requires_grad=True)
    assert compile_layer(layer, g, x, edge_data_csc(g, ed)).edge_kinds == kinds
    whole = layer(g, x, ed)
    probe = torch.randn_like(whole)
    expect = [whole] + grads(whole, probe, _inputs(layer, x, ed))
    with grid_shape(3, 2), staging_mode(staging):
        out = layer(g, x, ed)
        got = [out] + grads(out, probe, _inputs(layer, x, ed))
        with disabled():
            out_g = layer(g, x, ed)
            generic = [out_g] + grads(out_g, probe, _inputs(layer, x, ed))
    assert_close_all(got, expect, f"{name} 3x2 grid ({staging}) vs whole graph", **TOL)
    assert_close_all(generic, expect, f"{name} generic 3x2 grid ({staging}) vs whole graph", **TOL)


@pytest.mark.parametrize("how", ["max", "softmax"])
def test_partial_states_with_empty_tiles(how):
    """Tiles in which some destinations have no edges (and whole empty tiles)."""
    from torch import nn

    from ngra import SagaLayer

    class Att(SagaLayer):
        gather = "softmax"

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def apply_edge(self, edge):
            h = self.lin(edge.src)
            return h.sum(-1) + (-edge.dst).sum(-1), h

    class Mx(SagaLayer):
        gather = "max"

    layer = (Att() if how == "softmax" else Mx()).double()
    g = make_graph("isolated", n=20)
    x = torch.randn(g.num_nodes, 4, dtype=torch.float64, requires_grad=True)
    kind = "softmax_aggregate" if how == "softmax" else "gspmm"
    assert compile_layer(layer, g, x, None).edge_kinds == (kind,)
    whole = layer(g, x)
    probe = torch.randn_like(whole)
    expect = [whole] + grads(whole, probe, _inputs(layer, x, None))
    with grid_shape(4, 3):
        out = layer(g, x)
        got = [out] + grads(out, probe, _inputs(layer, x, None))
    assert_close_all(got, expect, f"{how} on a 4x3 grid", **TOL)


@pytest.mark.parametrize("name", ZOO)
def test_plans_say_whether_their_whole_graph_tile_attends(name):
    """The exchange cost model counts attention_aggregate's extra backward walk: only
    GAT's plans (softmax scores that are rowdots of the value itself) run it."""
    layer, g, ed, _, _ = zoo_case(name, make_graph("skewed", n=23))
    x = torch.randn(g.num_nodes, 6, dtype=torch.float64)
    plan = compile_layer(layer.double(), g, x, edge_data_csc(g, ed))
    assert plan.runs_attention_aggregate() is name.startswith("gat")
