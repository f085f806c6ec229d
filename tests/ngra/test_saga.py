"""The SAGA API on the generic executor, against plain-torch references."""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ngra
from ngra import Graph, SagaLayer

N = 12


def _graph(seed=None, n=N, e=40):
    g = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())) if seed is None else seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei = torch.cat([ei, torch.tensor([[3, 3], [3, 3]])], 1)  # self-loop + multi-edge
    ei = ei[:, ei[1] != n - 1]  # vertex n-1 has no in-edges
    return Graph.from_edge_index(ei, num_nodes=n), ei


def _ref_reduce(msg, dst, n, how):
    out = torch.zeros((n,) + msg.shape[1:], dtype=msg.dtype)
    if how in ("sum", "mean"):
        out = out.index_add(0, dst, msg)
        if how == "mean":
            deg = torch.bincount(dst, minlength=n).clamp(min=1).to(msg.dtype)
            out = out / deg.view(-1, *([1] * (msg.dim() - 1)))
        return out
    red = "amax" if how == "max" else "amin"
    idx = dst.view(-1, *([1] * (msg.dim() - 1))).expand_as(msg)
    out = out.scatter_reduce(0, idx, msg, red, include_self=False)
    return out


class Gated(SagaLayer):
    def __init__(self, f, how):
        super().__init__()
        self.a = nn.Linear(f, f)

    def apply_edge(self, edge):
        return torch.tanh(self.a(edge.dst) * edge.src) * edge.data.unsqueeze(-1)

    def apply_vertex(self, vertex, acc):
        return acc + vertex


@pytest.mark.parametrize("how", ["sum", "mean", "max", "min"])
def test_generic_matches_reference(how):
    g, ei = _graph()
    cls = type(f"Gated_{how}", (Gated,), {"gather": how})
    layer = cls(5, how).double()
    x = torch.randn(N, 5, dtype=torch.float64, requires_grad=True)
    w = torch.rand(ei.shape[1], dtype=torch.float64, requires_grad=True)
    out = layer(g, x, w)
    msg = torch.tanh(layer.a(x[ei[1]]) * x[ei[0]]) * w.unsqueeze(-1)
    ref = _ref_reduce(msg, ei[1], N, how) + x
    torch.testing.assert_close(out, ref)
    assert torch.all(out[N - 1] == x[N - 1])  # isolated destination: acc = 0
    go = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, w, layer.a.weight), go)
    grads_ref = torch.autograd.grad(ref, (x, w, layer.a.weight), go)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b)


class Attn(SagaLayer):
    gather = "softmax"

    def __init__(self, f, heads):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(f, heads)
        self.v = nn.Linear(f, heads * 3)

    def apply_edge(self, edge):
        score = F.leaky_relu(self.q(edge.src) + self.q(edge.dst), 0.2)
        return score, self.v(edge.src).view(-1, self.heads, 3)

    def apply_vertex(self, vertex, acc):
        return acc.flatten(1)


def test_softmax_gather_matches_reference():
    g, ei = _graph()
    layer = Attn(4, 2).double()
    x = torch.randn(N, 4, dtype=torch.float64, requires_grad=True)
    out = layer(g, x)
    s = F.leaky_relu(layer.q(x[ei[0]]) + layer.q(x[ei[1]]), 0.2)
    smax = _ref_reduce(s, ei[1], N, "max")
    p = torch.exp(s - smax[ei[1]])
    p = p / _ref_reduce(p, ei[1], N, "sum")[ei[1]]
    ref = _ref_reduce(p.unsqueeze(-1) * layer.v(x[ei[0]]).view(-1, 2, 3), ei[1], N, "sum").flatten(1)
    torch.testing.assert_close(out, ref)
    assert torch.all(out[N - 1] == 0)
    go = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, x, go)[0], torch.autograd.grad(ref, x, go)[0])


class DictLayer(SagaLayer):
    gather = "sum"

    def apply_edge(self, edge):
        return edge.src["h"] * edge.data["w"].unsqueeze(-1) + edge.dst["c"]

    def apply_vertex(self, vertex, acc):
        return acc * vertex["c"]


def test_dict_vertex_and_edge_data():
    g, ei = _graph()
    x = {"h": torch.randn(N, 3), "c": torch.randn(N, 3)}
    w = torch.rand(ei.shape[1])
    out = DictLayer()(g, x, {"w": w})
    msg = x["h"][ei[0]] * w.unsqueeze(-1) + x["c"][ei[1]]
    torch.testing.assert_close(out, _ref_reduce(msg, ei[1], N, "sum") * x["c"])


def test_default_edge_data_is_graph_weight():
    g, ei = _graph()
    w = torch.rand(ei.shape[1])
    gw = Graph.from_edge_index(ei, num_nodes=N, edge_weight=w)

    class Weighted(SagaLayer):
        def apply_edge(self, edge):
            return edge.src * edge.data.unsqueeze(-1)

    x = torch.randn(N, 2)
    torch.testing.assert_close(Weighted()(gw, x), Weighted()(g, x, w))


def test_defaults_copy_and_identity():
    g, ei = _graph()
    x = torch.randn(N, 3)
    torch.testing.assert_close(SagaLayer()(g, x), _ref_reduce(x[ei[0]], ei[1], N, "sum"))


def test_empty_graph():
    g = Graph.from_edge_index(torch.zeros(2, 0, dtype=torch.long), num_nodes=4)
    out = SagaLayer()(g, torch.randn(4, 3))
    assert out.shape == (4, 3) and torch.all(out == 0)


class _Scale:
    """A callable object assigned on a class: Python calls it without the instance."""

    def __call__(self, edge):
        return edge.src * 2


def _src_times_two(this, edge):
    return edge.src * 2


class _ApplyVertexMixin:  # not a SagaLayer: its UDF is checked where it is mixed in
    def apply_vertex(me, vertex, acc):
        return acc - vertex


# Every way Python lets a class provide apply_edge(edge): each doubles the source row.
_UDF_FORMS = {
    "any instance name": {"apply_edge": _src_times_two},
    "staticmethod": {"apply_edge": staticmethod(lambda edge: edge.src * 2)},
    "classmethod": {"apply_edge": classmethod(lambda cls, edge: edge.src * 2)},
    "callable object": {"apply_edge": _Scale()},
    "functools.partial": {"apply_edge": functools.partial(lambda k, edge: edge.src * k, 2)},
    "lambda": {"apply_edge": lambda self, edge: edge.src * 2},
    "*args": {"apply_edge": lambda self, *args: args[0].src * 2},
    "defaults": {"apply_edge": lambda self, edge, k=2, *, twice=False: edge.src * k},
}


@pytest.mark.parametrize("form", sorted(_UDF_FORMS))
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "generic"])
def test_every_udf_form_python_accepts_runs(form, compiled):
    g, ei = _graph()
    cls = type(f"Form_{form.replace(' ', '_')}", (_ApplyVertexMixin, SagaLayer), _UDF_FORMS[form])
    x = torch.randn(N, 3)
    with contextlib.nullcontext() if compiled else ngra.compiler.disabled():
        out = cls()(g, x)
    torch.testing.assert_close(out, _ref_reduce(2 * x[ei[0]], ei[1], N, "sum") - x)


def _defining(body, gather="sum", bases=(SagaLayer,)):
    return type("Bad", bases, {"gather": gather, **body})


@pytest.mark.parametrize("body, match", [
    ({"apply_edge": lambda self, edge, extra: edge.src},
     r"apply_edge must take \(edge\).*\(edge, extra\): 2 required positional.*extra unfilled"),
    ({"apply_edge": staticmethod(lambda: 0)},
     r"apply_edge must take \(edge\).*\(no parameters\): it accepts 0 positional"),
    ({"apply_edge": lambda this: 0}, r"it accepts 0 positional arguments, 1 are passed"),
    ({"apply_vertex": lambda self, vertex: vertex},
     r"apply_vertex must take \(vertex, acc\).*it accepts 1 positional"),
    ({"apply_vertex": staticmethod(lambda vertex, acc, extra: acc)}, r"extra unfilled"),
    ({"apply_edge": lambda self, edge, *, scale: edge.src},
     r"keyword-only parameter\(s\) scale have no default"),
    ({"apply_edge": 3}, r"apply_edge must be a method; got int"),
    ({"apply_edge": None}, r"apply_edge must be a method; got NoneType"),
])
def test_signature_mismatch_names_the_problem(body, match):
    with pytest.raises(TypeError, match=match) as err:
        _defining(body)
    if "method" not in match:
        assert "Define it as `def" in str(err.value)


def test_signature_of_a_mixin_is_checked_where_it_is_mixed_in():
    class Mixin:
        def apply_vertex(self, vertex):
            return vertex

    with pytest.raises(TypeError, match=r"apply_vertex must take \(vertex, acc\)"):
        _defining({}, bases=(Mixin, SagaLayer))


def test_unknown_gather_is_refused():
    with pytest.raises(TypeError, match=r"gather must be one of .*got 'prod'"):
        _defining({}, gather="prod")


def test_bad_inputs_have_clear_errors():
    g, ei = _graph()
    layer = SagaLayer()
    with pytest.raises(ValueError, match=rf"one row per vertex \(\[{N}, ...\]\); got shape \[5, 3\]"):
        layer(g, torch.randn(5, 3))
    with pytest.raises(ValueError, match="one row per edge"):
        layer(g, torch.randn(N, 3), torch.randn(3))
    with pytest.raises(TypeError, match="must be an ngra.Graph"):
        layer(ei, torch.randn(N, 3))

    class WrongRows(SagaLayer):
        def apply_edge(self, edge):
            return edge.src[:1]

    with pytest.raises(ValueError, match="apply_edge must return one row per edge"):
        WrongRows()(g, torch.randn(N, 3))

    class NotTuple(SagaLayer):
        gather = "softmax"

    with pytest.raises(TypeError, match=r"must return \(score, value\)"):
        NotTuple()(g, torch.randn(N, 3))


def test_public_names():
    assert {"Graph", "SagaLayer", "Edge"} <= set(ngra.__all__)
