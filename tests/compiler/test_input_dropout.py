"""A layer's input dropout, ``layer(graph, x, edata, dropout=p)``: fused into the Linears of
x where those are x's only reads (GCN and GAT in pre; SAGE, GIN, CommNet and R-GCN in pre and
in the vertex stage), applied to x first elsewhere; either way
== the generic executor and == the layer run on ``ngra.kernels.dropout(x)``, fwd and bwd."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _compiler_cases import ZOO, assert_close_all, grads, make_graph, zoo_case

from ngra.compiler import compile_layer, disabled
from ngra.kernels import dropout
from ngra.runtime.executor import edge_data_csc

TOL = {"rtol": 1e-9, "atol": 1e-10}
# every read of x is a Linear of the pre or the vertex stage
FUSES = {"gcn", "gat", "gat_mean", "sage", "gin", "commnet", "rgcn"}
P = 0.4


def _case(name, case="random"):
    layer, g, ed, _, _ = zoo_case(name, make_graph(case))
    layer = layer.double().train()
    if isinstance(ed, dict):
        ed = {"type": ed["type"], "norm": ed["norm"]}
    x = torch.randn(g.num_nodes, 6, dtype=torch.float64, requires_grad=True)
    return layer, g, ed, x


def _run(layer, g, x, ed, probe, **kw):
    torch.manual_seed(11)
    out = layer(g, x, ed, **kw)
    inputs = [x] + [p for p in layer.parameters() if p.requires_grad]
    return [out] + grads(out, probe, inputs)


@pytest.mark.parametrize("case", ["random", "empty", "isolated", "multi_edges"])
@pytest.mark.parametrize("name", ZOO)
def test_input_dropout_compiled_equals_generic_and_dropped_input(name, case):
    layer, g, ed, x = _case(name, case)
    plan = compile_layer(layer, g, x, edge_data_csc(g, ed))
    assert plan.kind == "compiled"
    assert plan.fuses_input_dropout(x) == (name in FUSES), plan.dropout_note
    probe = torch.randn(layer(g, x, ed).shape, dtype=torch.float64)

    compiled = _run(layer, g, x, ed, probe, dropout=P)
    with disabled():
        generic = _run(layer, g, x, ed, probe, dropout=P)
    torch.manual_seed(11)
    xd = dropout(x, P)
    out = layer(g, xd, ed)
    inputs = [x] + [p for p in layer.parameters() if p.requires_grad]
    by_hand = [out] + grads(out, probe, inputs)
    assert_close_all(compiled, generic, f"{name}/{case} compiled vs generic", **TOL)
    assert_close_all(compiled, by_hand, f"{name}/{case} compiled vs layer(dropout(x))", **TOL)
    assert not torch.equal(compiled[0], layer(g, x, ed)) or g.num_edges == 0


def test_input_dropout_on_3d_input_is_applied_first():
    """A Linear over [N, H, F] rows: the plan could fuse, but dropout_linear takes [N, F];
    the dropout then runs on x first, with the same result as layer(dropout(x))."""
    from torch import nn

    import ngra

    class Heads(ngra.SagaLayer):
        gather = "sum"

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 5).double()

        def apply_edge(self, edge):
            return self.lin(edge.src)

    layer, g = Heads().train(), make_graph("random")
    x = torch.randn(g.num_nodes, 3, 6, dtype=torch.float64)
    plan = compile_layer(layer, g, x, edge_data_csc(g, None))
    assert plan.dropout_linears and not plan.fuses_input_dropout(x)
    torch.manual_seed(2)
    got = layer(g, x, dropout=P)
    torch.manual_seed(2)
    torch.testing.assert_close(got, layer(g, dropout(x, P)))


@pytest.mark.parametrize("name", ["gcn", "gat"])
def test_input_dropout_off_in_eval_mode(name):
    layer, g, ed, x = _case(name)
    want = layer(g, x, ed)
    layer.eval()
    torch.testing.assert_close(layer(g, x, ed, dropout=0.9), want)


def test_explain_says_where_the_dropout_runs():
    layer, g, ed, x = _case("gat")
    lines = compile_layer(layer, g, x, edge_data_csc(g, ed)).describe()
    assert any("input dropout" in ln and "dropout_linear" in ln for ln in lines), lines
    layer, g, ed, x = _case("ggcn")
    lines = compile_layer(layer, g, x, edge_data_csc(g, ed)).describe()
    assert any("input dropout" in ln and "the edge stage reads x itself" in ln for ln in lines)


@pytest.mark.parametrize("p", [-0.1, 1.5, "0.5", True])
def test_bad_dropout_probability(p):
    layer, g, ed, x = _case("gcn")
    with pytest.raises(ValueError, match=r"dropout probability must be a number in \[0, 1\]"):
        layer(g, x, ed, dropout=p)


def _child(mode: str) -> dict:
    child = Path(__file__).with_name("dropout_memory_child.py")
    env = dict(os.environ, OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, str(child), mode, "60000", "240000", "512"],
                         capture_output=True, text=True, timeout=300, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_fused_input_dropout_keeps_no_dropped_copy_of_x():
    """Peak RSS of a GCN step on a 123 MB input: under half a copy of x when fused (the
    16 MiB block workspace, the 1-bit masks and the N x 16 activations; measured ~49 MB);
    a whole copy more when the dropped input is passed in (the control: the bound can fail)."""
    fused, unfused = _child("fused"), _child("unfused")
    size = fused["x_bytes"]
    used = fused["peak"] - fused["before"]
    control = unfused["peak"] - unfused["before"]
    assert used < 0.5 * size, (f"fused step used {used / 2**20:.0f} MiB for a "
                               f"{size / 2**20:.0f} MiB input (peak reset: {fused['peak_reset']})")
    assert control - used > 0.6 * size, f"unfused step used only {control / 2**20:.0f} MiB"
