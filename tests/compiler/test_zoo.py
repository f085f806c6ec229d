"""Every zoo model: compiled plan == generic executor == plain-torch reference, fwd and bwd."""

from __future__ import annotations

import pytest
import torch
from _compiler_cases import GRAPH_CASES, ZOO, assert_close_all, grads, make_graph, zoo_case

import ngra
from ngra.compiler import compile_layer, disabled
from ngra.runtime.executor import edge_data_csc

TOL = {"rtol": 1e-9, "atol": 1e-10}


def _run(layer, g, x, ed, probe):
    out = layer(g, x, ed)
    params = [p for p in layer.parameters() if p.requires_grad]
    inputs = [x] + params
    if isinstance(ed, torch.Tensor) and ed.is_floating_point():
        inputs.append(ed)
    elif isinstance(ed, dict) and ed["norm"].requires_grad:
        inputs.append(ed["norm"])
    return [out] + grads(out, probe, inputs)


@pytest.mark.parametrize("case", GRAPH_CASES)
@pytest.mark.parametrize("name", ZOO)
def test_zoo_compiled_equals_generic_equals_reference(name, case):
    layer, g, ed, ref_fn, kinds = zoo_case(name, make_graph(case))
    layer = layer.double()
    if isinstance(ed, torch.Tensor) and ed.is_floating_point():
        ed = ed.clone().requires_grad_(True)
    elif isinstance(ed, dict):
        ed = {"type": ed["type"], "norm": ed["norm"].clone().requires_grad_(True)}
    x = torch.randn(g.num_nodes, 6, dtype=torch.float64, requires_grad=True)

    plan = compile_layer(layer, g, x, edge_data_csc(g, ed))
    assert plan.kind == "compiled", "\n".join(plan.describe())
    assert plan.edge_kinds == kinds

    out = layer(g, x, ed)
    probe = torch.randn_like(out)
    compiled = _run(layer, g, x, ed, probe)
    with disabled():
        generic = _run(layer, g, x, ed, probe)

    reference = [ref_fn(layer, g, x, ed)]
    reference += grads(reference[0], probe, compiled_inputs(layer, x, ed))
    assert_close_all(compiled, generic, f"{name}/{case} compiled vs generic", **TOL)
    assert_close_all(compiled, reference, f"{name}/{case} compiled vs reference", **TOL)


def compiled_inputs(layer, x, ed):
    params = [p for p in layer.parameters() if p.requires_grad]
    inputs = [x] + params
    if isinstance(ed, torch.Tensor) and ed.is_floating_point():
        inputs.append(ed)
    elif isinstance(ed, dict):
        inputs.append(ed["norm"])
    return inputs


@pytest.mark.parametrize("name", ZOO)
def test_zoo_float32_and_ref_backend(name):
    """float32 on the default backend, and the reference kernels agree."""
    layer, g, ed, ref_fn, kinds = zoo_case(name, make_graph("random"), dtype=torch.float32)
    x = torch.randn(g.num_nodes, 6)
    out = layer(g, x, ed)
    torch.testing.assert_close(out, ref_fn(layer, g, x, ed), rtol=1e-4, atol=1e-5)
    with ngra.kernels.use_backend("ref"):
        torch.testing.assert_close(layer(g, x, ed), out, rtol=1e-4, atol=1e-5)
    assert compile_layer(layer, g, x, edge_data_csc(g, ed)).edge_kinds == kinds


@pytest.mark.parametrize("name", ZOO)
def test_zoo_fuses_with_parameters_on_another_device(name):
    """Device streaming keeps the data in host memory and the parameters on the GPU: the
    compiler's shape samples go where the parameters are, so the layer fuses as it does
    with both in one place (before, every op mixing the two devices failed on its samples
    and GAT and MPNN ran interpreted). ``meta`` stands in for the GPU."""
    layer, g, ed, _, kinds = zoo_case(name, make_graph("random"))
    x = torch.randn(g.num_nodes, 6, dtype=torch.float64)
    plan = compile_layer(layer.double().to("meta"), g, x, edge_data_csc(g, ed))
    assert plan.kind == "compiled", "\n".join(plan.describe())
    assert plan.edge_kinds == kinds
