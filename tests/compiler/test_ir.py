"""The stage IR: tracing, the verifier, and the interpreter as the living definition."""

from __future__ import annotations

import copy

import pytest
import torch
from _compiler_cases import ZOO, make_graph, zoo_case

from ngra.compiler.analysis import Samples, annotate
from ngra.compiler.interp import Resolver, run_stage
from ngra.compiler.ir import IRError, Node, Op, Program, Ref, Stage, verify
from ngra.compiler.trace import trace_program, trace_vertex
from ngra.runtime.executor import edge_data_csc
from ngra.saga import Edge


def _traced(name):
    layer, g, ed, _, _ = zoo_case(name, make_graph("random"))
    layer = layer.double()
    x = torch.randn(g.num_nodes, 6, dtype=torch.float64)
    edata = edge_data_csc(g, ed)
    if isinstance(edata, torch.Tensor) and edata.is_floating_point():
        edata = edata.double()
    program = trace_program(layer, x, edata)
    trace_vertex(program, layer, x)
    annotate(program, Samples(x, edata), Resolver(layer))
    return layer, g, x, edata, program


@pytest.mark.parametrize("name", ZOO)
def test_interpreter_equals_udf(name):
    """Running the traced IR (before any pass) gives what calling the UDFs gives."""
    layer, g, x, edata, program = _traced(name)
    verify(program, annotated=True)
    src, dst = g.indices, g.dst_index()
    res = Resolver(layer)
    terms = run_stage(program.pre, lambda n: x, res)

    def edge_in(n):
        if n.op == Op.EDATA:
            return edata if n.attrs["key"] is None else edata[n.attrs["key"]]
        idx = src if n.op == Op.SRC else dst
        return terms[n.attrs["key"]].index_select(0, idx)

    got = run_stage(program.edge, edge_in, res)
    want = layer.apply_edge(Edge(x, x, src, dst, edata))
    for a, b in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(a, b)
    acc = torch.randn_like(want[1] if isinstance(want, tuple) else want)[: g.num_nodes]
    if acc.shape[0] < g.num_nodes:
        acc = torch.randn((g.num_nodes,) + tuple(acc.shape[1:]), dtype=acc.dtype)
    got_v = run_stage(program.vertex, lambda n: acc if n.op == Op.ACC else x, res)
    torch.testing.assert_close(got_v, layer.apply_vertex(x, acc))


def test_domains_and_rowwise():
    _, _, _, _, p = _traced("ggcn")
    by_name = {n.name: n for n in p.edge.nodes.values()}
    assert by_name["w_h"].deps == {"dst"} and by_name["w_h"].rowwise
    assert by_name["w_c"].deps == {"src"}
    assert by_name["add"].deps == {"src", "dst"}
    assert by_name["w_h.weight"].deps == frozenset()


def _tiny() -> Program:
    p = Program("T", "sum", Stage("pre"), Stage("edge"), None)
    v = p.new_id()
    p.pre.add(Node(v, Op.VERTEX, (), {"key": None}))
    p.pre.outputs = {("x", None): Ref(v)}
    s = p.new_id()
    p.edge.add(Node(s, Op.SRC, (), {"key": ("x", None)}))
    r = p.new_id()
    p.edge.add(Node(r, Op.RELU, (s,), {}))
    p.edge.outputs = Ref(r)
    return p


def test_verifier_accepts_well_formed():
    verify(_tiny())


@pytest.mark.parametrize("breakage, msg", [
    (lambda p: setattr(p.edge.nodes[2], "op", "softplus"), "unknown op"),
    (lambda p: setattr(p.edge.nodes[2], "args", (1, 1)), "takes 1 argument"),
    (lambda p: setattr(p.edge.nodes[2], "args", (7,)), "not an earlier node"),
    (lambda p: p.edge.nodes.update({1: Node(1, Op.RELU, (2,), {})}), "not an earlier node"),
    (lambda p: p.edge.nodes[1].attrs.pop("key"), "needs attribute"),
    (lambda p: setattr(p.edge.nodes[1], "op", Op.ACC), "cannot read acc"),
    (lambda p: setattr(p.edge, "outputs", Ref(42)), "missing node"),
    (lambda p: p.edge.nodes[1].attrs.update(key=("t", 9)), "does not produce"),
    (lambda p: setattr(p, "gather", "softmax"), "(score, value)"),
    (lambda p: p.edge.nodes[2].__setattr__("op", Op.LEAKY_RELU) or
     p.edge.nodes[2].attrs.update(slope="x"), "slope"),
])
def test_verifier_rejects_malformed(breakage, msg):
    p = _tiny()
    breakage(p)
    with pytest.raises(IRError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        verify(p)


def test_verifier_checks_domains():
    _, _, _, _, p = _traced("gcn")
    p = copy.deepcopy(p)
    node = next(n for n in p.edge.nodes.values() if n.op == Op.MUL)
    node.deps = frozenset({"dst"})
    with pytest.raises(IRError, match="inconsistent"):
        verify(p, annotated=True)


def test_opaque_nodes_execute():
    """Calls outside the closed op set become OPAQUE nodes and still run."""
    from ngra import SagaLayer

    class Odd(SagaLayer):
        gather = "sum"

        def apply_edge(self, edge):
            return torch.nn.functional.elu(edge.src) + edge.src[:, :1].abs()

    layer = Odd()
    g = make_graph("random")
    x = torch.randn(g.num_nodes, 3)
    p = trace_program(layer, x, None)
    ops = [n.attrs.get("target") for n in p.edge.nodes.values() if n.op == Op.OPAQUE]
    assert torch.nn.functional.elu in ops
    from ngra.compiler import disabled

    out = layer(g, x)
    with disabled():
        torch.testing.assert_close(out, layer(g, x))
