"""Plan caching per layer and signature; parameters read at run time; disabling compilation."""

from __future__ import annotations

import gc
import weakref

import torch
from _compiler_cases import make_graph
from torch import nn

from ngra import SagaLayer, compiler
from ngra.compiler import compile_layer, disabled
from ngra.models import GCNConv


class Copy(SagaLayer):
    gather = "sum"


class Train(SagaLayer):
    """Branches on self.training at trace time: the training flag is in the signature."""

    gather = "sum"

    def apply_edge(self, edge):
        return edge.src * 2.0 if self.training else edge.src


def test_plan_is_cached_and_recompiled_on_signature_change():
    g = make_graph("random")
    layer = Copy()
    x4, x8 = torch.randn(g.num_nodes, 4), torch.randn(g.num_nodes, 8)
    p1 = compile_layer(layer, g, x4, None)
    assert compile_layer(layer, g, torch.randn(g.num_nodes, 4), None) is p1
    p2 = compile_layer(layer, g, x8, None)
    assert p2 is not p1 and compile_layer(layer, g, x8, None) is p2
    assert compile_layer(layer, g, x4.double(), None) is not p1  # dtype
    assert compile_layer(layer, g, {"x": x4}, None) is not p1  # dict keys
    torch.testing.assert_close(layer(g, x8), layer(g, x8))


def test_training_flag_recompiles():
    g = make_graph("random")
    layer = Train()
    x = torch.randn(g.num_nodes, 3)
    layer.train()
    a = layer(g, x)
    layer.eval()
    b = layer(g, x)
    torch.testing.assert_close(a, 2 * b)


def test_parameters_are_read_at_run_time():
    g = make_graph("random").gcn_norm()
    layer = GCNConv(6, 3)
    x = torch.randn(g.num_nodes, 6)
    plan = compile_layer(layer, g, x, g.edge_weight)
    assert plan.kind == "compiled"
    a = layer(g, x)
    with torch.no_grad():
        layer.lin.weight.mul_(2.0)
        layer.lin.bias.zero_()
    b = layer(g, x)
    assert compile_layer(layer, g, x, g.edge_weight) is plan
    with disabled():
        ref = layer(g, x)
    torch.testing.assert_close(b, ref)
    assert not torch.allclose(a, b)
    # a replaced submodule is picked up too
    layer.lin = nn.Linear(6, 3)
    with disabled():
        ref = layer(g, x)
    torch.testing.assert_close(layer(g, x), ref)


def test_disabled_runs_generic_and_restores():
    g = make_graph("random")
    layer = Copy()
    x = torch.randn(g.num_nodes, 3)
    with disabled():
        assert not compiler.is_enabled()
        plan = compile_layer(layer, g, x, None)
        assert plan.kind == "generic" and "disabled" in plan.reason
    assert compiler.is_enabled()
    assert compile_layer(layer, g, x, None).kind == "compiled"
    compiler.set_enabled(False)
    try:
        assert compile_layer(layer, g, x, None).kind == "generic"
    finally:
        compiler.set_enabled(True)


def test_cache_does_not_keep_layers_alive():
    g = make_graph("random")
    layer = GCNConv(4, 2)
    layer(g.gcn_norm(), torch.randn(g.num_nodes, 4))
    ref = weakref.ref(layer)
    del layer
    gc.collect()
    assert ref() is None
