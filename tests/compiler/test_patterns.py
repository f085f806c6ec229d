"""User-written layers: the same math written differently lowers the same way; programs
that must not fuse run correctly on the fallback and say why."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _compiler_cases import assert_close_all, grads, make_graph
from torch import nn

from ngra import SagaLayer, explain
from ngra.compiler import compile_layer, disabled
from ngra.runtime.executor import edge_data_csc

TOL = {"rtol": 1e-9, "atol": 1e-10}
F_IN = 5


def _check(layer, g, x, ed=None, kinds=None, seed=None):
    """compiled == generic (fwd + bwd); returns the plan."""
    layer = layer.double()
    plan = compile_layer(layer, g, x, edge_data_csc(g, ed))
    if kinds is not None:
        assert plan.edge_kinds == kinds, "\n".join(plan.describe())
    inputs = [x] + [p for p in layer.parameters() if p.requires_grad]

    def run():
        if seed is not None:
            torch.manual_seed(seed)
        out = layer(g, x, ed)
        return [out] + grads(out, probe, inputs)

    probe = torch.randn_like(layer(g, x, ed))
    a = run()
    with disabled():
        b = run()
    assert_close_all(a, b, type(layer).__name__, **TOL)
    return plan


def _x(g, f=F_IN):
    return torch.randn(g.num_nodes, f, dtype=torch.float64, requires_grad=True)


# ---------------------------------------------------------------------------- variants
class GCNVariant(SagaLayer):
    """GCN written differently: view instead of unsqueeze, F.linear with Parameters."""

    gather = "sum"

    def __init__(self, f_in, f_out):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(f_out, f_in))
        self.bias = nn.Parameter(torch.randn(f_out))

    def apply_edge(self, edge):
        return edge.data.view(-1, 1) * edge.src

    def apply_vertex(self, vertex, acc):
        return F.linear(acc, self.weight, self.bias)


def test_gcn_variant_lowers_to_gspmm_with_reorder():
    g = make_graph("random").gcn_norm()
    w = g.edge_weight_original().double()
    plan = _check(GCNVariant(F_IN, 3), g, _x(g), w, kinds=("gspmm",))
    text = "\n".join(plan.describe())
    assert "transform-then-propagate" in text and "5 -> 3" in text


def test_reorder_keeps_the_wide_order_when_output_is_wider():
    g = make_graph("random").gcn_norm()
    plan = _check(GCNVariant(F_IN, 9), g, _x(g), g.edge_weight_original().double(),
                  kinds=("gspmm",))
    assert "propagate-then-transform" in "\n".join(plan.describe())


class SelfTermSum(SagaLayer):
    """GIN-like: ``lin(c * x + acc)`` (``c`` a scalar parameter, or 1, or a row-dependent
    value that must keep the wide order), ``mean`` or ``sum`` gather."""

    def __init__(self, f_in, f_out, scale="param", gather="sum", bias=True):
        super().__init__()
        self.gather = gather
        self.lin = nn.Linear(f_in, f_out, bias=bias)
        self.eps = nn.Parameter(torch.tensor([0.3]))
        self.scale = scale

    def apply_edge(self, edge):
        return edge.src

    def apply_vertex(self, vertex, acc):
        if self.scale == "param":
            h = (1 + self.eps) * vertex + acc
        elif self.scale == "one":
            h = acc + vertex
        else:  # a per-row value: not a scalar, the reorder must not fire
            h = vertex.sum(-1, keepdim=True) * vertex + acc
        return torch.relu(self.lin(h))


@pytest.mark.parametrize("case", ["random", "isolated", "multi_edges"])
@pytest.mark.parametrize("scale,gather,bias", [("param", "sum", True), ("one", "mean", False),
                                               ("param", "mean", False)])
def test_self_term_reorders_with_the_linear(scale, gather, bias, case):
    g = make_graph(case)
    layer = SelfTermSum(F_IN, 3, scale, gather, bias)
    plan = _check(layer, g, _x(g), kinds=("gspmm",))
    text = "\n".join(plan.describe())
    assert "the self term x takes the same transform" in text, text
    assert "lin (5 -> 3)" in text
    # dropout(x) fuses into both Linears of x (one GEMM: the same weight)
    assert plan.fuses_input_dropout(_x(g)), plan.dropout_note


def test_self_term_with_a_row_dependent_scale_keeps_the_wide_order():
    g = make_graph("random")
    plan = _check(SelfTermSum(F_IN, 3, "row"), g, _x(g))
    assert "the self term" not in "\n".join(plan.describe())


@pytest.mark.parametrize("scale", ["param", "one"])
def test_self_term_dropout_matches_the_generic_path(scale):
    g = make_graph("random")
    layer = SelfTermSum(F_IN, 3, scale).double().train()
    x = _x(g)
    inputs = [x] + list(layer.parameters())

    def run():
        torch.manual_seed(9)
        out = layer(g, x, dropout=0.4)
        return [out] + grads(out, torch.ones_like(out), inputs)

    a = run()
    with disabled():
        b = run()
    assert_close_all(a, b, "self term with dropout", **TOL)


class GATVariant(SagaLayer):
    """GAT written differently: F.linear, torch.sum, dst score first, no bias module."""

    gather = "softmax"

    def __init__(self, f_in, f, heads):
        super().__init__()
        self.w = nn.Parameter(torch.randn(heads * f, f_in) * 0.3)
        self.att_src = nn.Parameter(torch.randn(1, heads, f))
        self.att_dst = nn.Parameter(torch.randn(1, heads, f))
        self.h, self.f = heads, f

    def apply_edge(self, edge):
        xs = F.linear(edge.src, self.w).reshape(-1, self.h, self.f)
        xd = F.linear(edge.dst, self.w).reshape(-1, self.h, self.f)
        alpha = torch.sum(xd * self.att_dst, dim=-1) + torch.sum(xs * self.att_src, dim=-1)
        return F.leaky_relu(alpha, negative_slope=0.1), xs

    def apply_vertex(self, vertex, acc):
        return acc.reshape(acc.shape[0], -1)


def test_gat_variant_lowers_to_softmax_aggregate():
    g = make_graph("self_loops")
    plan = _check(GATVariant(F_IN, 3, 2), g, _x(g), kinds=("softmax_aggregate",))
    text = "\n".join(plan.describe())
    assert "negative_slope=0.1" in text
    # [1, H, D] attention weights (a leading 1) contract too
    assert "contract fired: 2 product-sum(s)" in text
    assert "rowdot(" in text
    assert "attention_aggregate" in text  # the scores are rowdots of the value itself


class OpaqueValueGAT(GATVariant):
    """The value passes an opaque call (F.normalize) before the Linear: attention_aggregate
    cannot make it again in backward, so it saves it (and may overwrite it there)."""

    def apply_edge(self, edge):
        xs = F.linear(F.normalize(edge.src, dim=-1), self.w).reshape(-1, self.h, self.f)
        xd = F.linear(F.normalize(edge.dst, dim=-1), self.w).reshape(-1, self.h, self.f)
        alpha = torch.sum(xd * self.att_dst, dim=-1) + torch.sum(xs * self.att_src, dim=-1)
        return F.leaky_relu(alpha, negative_slope=0.1), xs


@pytest.mark.parametrize("case", ["random", "isolated", "self_loops"])
def test_gat_value_that_cannot_be_remade_is_saved(case):
    g = make_graph(case)
    plan = _check(OpaqueValueGAT(F_IN, 3, 2), g, _x(g), kinds=("softmax_aggregate",))
    assert plan._value_recipe is None
    assert "attention_aggregate" in "\n".join(plan.describe())


class ScaledWeightGAT(GATVariant):
    """The Linear's weight is an expression of a parameter, not the parameter itself."""

    def apply_edge(self, edge):
        xs = F.linear(edge.src, self.w * 0.5).reshape(-1, self.h, self.f)
        xd = F.linear(edge.dst, self.w * 0.5).reshape(-1, self.h, self.f)
        alpha = torch.sum(xd * self.att_dst, dim=-1) + torch.sum(xs * self.att_src, dim=-1)
        return F.leaky_relu(alpha, negative_slope=0.1), xs


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_gat_value_remade_from_a_weight_expression(dropout):
    g = make_graph("self_loops")
    layer = ScaledWeightGAT(F_IN, 3, 2).double()
    x = _x(g)
    inputs = [x, *layer.parameters()]

    def run():
        torch.manual_seed(3)
        out = layer(g, x, dropout=dropout)
        return [out, *torch.autograd.grad(out, inputs, torch.ones_like(out))]

    got = run()
    assert compile_layer(layer, g, x, None)._value_recipe is not None
    with disabled():
        want = run()
    assert_close_all(got, want, "ScaledWeightGAT", **TOL)


def test_gat_with_input_dropout_matches_generic_and_differentiates_twice():
    """The compiled layer makes dropout(x) W again in backward with the forward's mask:
    the same output and gradients as the generic executor's dropout on x, and a second
    backward through the same graph (retain_graph) gives the same gradients again."""
    from ngra.models import GATConv

    g = make_graph("self_loops")
    layer = GATConv(F_IN, 3, heads=2).double()
    x = _x(g)
    inputs = [x, *layer.parameters()]

    def run():
        torch.manual_seed(7)
        out = layer(g, x, dropout=0.5)
        probe = torch.randn_like(out, generator=torch.Generator().manual_seed(1))
        first = torch.autograd.grad(out, inputs, probe, retain_graph=True)
        return [out, *first], list(torch.autograd.grad(out, inputs, probe))

    (got, again) = run()
    with disabled():
        want, _ = run()
    assert_close_all(got, want, "GATConv", **TOL)
    assert_close_all(again, got[1:], "GATConv (second backward)", **TOL)


class ScoreShapes(SagaLayer):
    """Scores whose weights broadcast in every way rowdot takes: [D], [H, 1], [H, D]."""

    gather = "softmax"

    def __init__(self, f_in, f, heads, w_shape):
        super().__init__()
        self.lin = nn.Linear(f_in, heads * f, bias=False)
        self.a_src = nn.Parameter(torch.randn(w_shape))
        self.a_dst = nn.Parameter(torch.randn(w_shape))
        self.h, self.f = heads, f

    def apply_edge(self, edge):
        hs = self.lin(edge.src).view(-1, self.h, self.f)
        hd = self.lin(edge.dst).view(-1, self.h, self.f)
        score = (self.a_src * hs).sum(dim=2) + (hd * self.a_dst).sum(-1)  # either operand order
        return F.leaky_relu(score, 0.2), hs


@pytest.mark.parametrize("w_shape", [(3,), (2, 1), (2, 3)])
@pytest.mark.parametrize("case", ["random", "isolated", "skewed"])
def test_score_products_contract_to_rowdot(case, w_shape):
    g = make_graph(case)
    plan = _check(ScoreShapes(F_IN, 3, 2, w_shape), g, _x(g), kinds=("softmax_aggregate",))
    assert "contract fired: 2 product-sum(s)" in "\n".join(plan.describe())


class SharedProduct(SagaLayer):
    """The product is also a message: contracting it would not remove the [N, H, D] tensor."""

    gather = "sum"

    def __init__(self, f_in):
        super().__init__()
        self.a = nn.Parameter(torch.randn(f_in))

    def apply_edge(self, edge):
        p = edge.src * self.a
        return p * p.sum(-1, keepdim=True) + p.sum(-1).unsqueeze(-1)


class MixedDtypeScore(SagaLayer):
    """A float64 attention weight on float32 features: torch promotes the product."""

    gather = "softmax"

    def __init__(self, f_in):
        super().__init__()
        self.lin = nn.Linear(f_in, 4)
        self.a = nn.Parameter(torch.randn(4, dtype=torch.float64))

    def apply_edge(self, edge):
        h = self.lin(edge.src)
        return (h * self.a).sum(-1).float(), h


def test_contract_skips_a_weight_of_another_dtype():
    g = make_graph("random")
    layer = MixedDtypeScore(F_IN)
    x = torch.randn(g.num_nodes, F_IN)
    plan = compile_layer(layer, g, x, None)
    assert "contract skipped" in "\n".join(plan.describe())
    out = layer(g, x)
    with disabled():
        torch.testing.assert_close(out, layer(g, x))


def test_contract_skips_a_product_read_elsewhere_and_keepdim():
    g = make_graph("random")
    plan = _check(SharedProduct(F_IN), g, _x(g))
    assert "contract skipped" in "\n".join(plan.describe())


class SingleHeadAttention(SagaLayer):
    """Score [E] (no head dim), value [E, F], tanh-free plain sum score."""

    gather = "softmax"

    def __init__(self, f_in, f):
        super().__init__()
        self.lin = nn.Linear(f_in, f)
        self.a = nn.Linear(f, 1, bias=False)

    def apply_edge(self, edge):
        v = self.lin(edge.src)
        return self.a(v).squeeze(-1) + self.a(self.lin(edge.dst)).squeeze(-1), v


def test_single_head_attention_without_activation():
    g = make_graph("skewed")
    _check(SingleHeadAttention(F_IN, 4), g, _x(g), kinds=("softmax_aggregate",))


class GatedVariant(SagaLayer):
    """G-GCN written differently: method call sigmoid, product order swapped."""

    gather = "sum"

    def __init__(self, f):
        super().__init__()
        self.w_c, self.w_h = nn.Linear(f, f), nn.Linear(f, f)

    def apply_edge(self, edge):
        gate = (self.w_c(edge.src) + self.w_h(edge.dst)).sigmoid()
        return edge.src * gate


def test_gated_variant_lowers_to_fused_edge():
    g = make_graph("multi_edges")
    plan = _check(GatedVariant(F_IN), g, _x(g), kinds=("fused_edge",))
    text = "\n".join(plan.describe())
    assert "w_c(edge.src)" in text and "w_h(edge.dst)" in text


@pytest.mark.parametrize("how", ["sum", "mean", "max", "min"])
def test_elementwise_with_edge_term_every_gather(how):
    """tanh(a(dst) * src) * w: hoisted a(dst), an edge term, fused for every reducer."""

    class Gated(SagaLayer):
        gather = how

        def __init__(self, f):
            super().__init__()
            self.a = nn.Linear(f, f)

        def apply_edge(self, edge):
            return torch.tanh(self.a(edge.dst) * edge.src) * edge.data.unsqueeze(-1)

        def apply_vertex(self, vertex, acc):
            return acc + vertex

    g = make_graph("isolated")
    w = torch.rand(g.num_edges, dtype=torch.float64)
    _check(Gated(F_IN), g, _x(g), w, kinds=("fused_edge",))


@pytest.mark.parametrize("how", ["sum", "mean", "max", "min"])
def test_copy_and_scaled_copy_every_gather(how):
    class Scaled(SagaLayer):
        gather = how

        def apply_edge(self, edge):
            return edge.src * 0.5 / edge.data.unsqueeze(-1)

    g = make_graph("self_loops")
    w = torch.rand(g.num_edges, dtype=torch.float64) + 0.5
    _check(Scaled(), g, _x(g), w, kinds=("gspmm",))

    class Copy(SagaLayer):
        gather = how

    _check(Copy(), g, _x(g), kinds=("gspmm",))


class ParamLeaf(SagaLayer):
    """A parameter inside the element-wise expression (not hoistable with either side)."""

    gather = "sum"

    def __init__(self, f):
        super().__init__()
        self.a, self.b = nn.Linear(f, f), nn.Linear(f, f, bias=False)
        self.shift = nn.Parameter(torch.randn(f))

    def apply_edge(self, edge):
        return torch.relu(self.a(edge.src) + self.b(edge.dst) - self.shift) * edge.src


def test_parameter_leaf_in_fused_edge():
    g = make_graph("random")
    _check(ParamLeaf(F_IN), g, _x(g), kinds=("fused_edge",))


class DictData(SagaLayer):
    """Dict vertex data, dict messages: each message lowers on its own."""

    gather = "mean"

    def __init__(self, f):
        super().__init__()
        self.lin = nn.Linear(f, 2)

    def apply_edge(self, edge):
        return {"h": edge.src["h"], "s": edge.src["s"] * edge.data["w"].unsqueeze(-1)}

    def apply_vertex(self, vertex, acc):
        return self.lin(acc["h"]) + acc["s"] + vertex["s"]


def test_dict_vertex_data_and_messages():
    g = make_graph("random")
    x = {"h": _x(g), "s": torch.randn(g.num_nodes, 2, dtype=torch.float64)}
    ed = {"w": torch.rand(g.num_edges, dtype=torch.float64)}
    layer = DictData(F_IN).double()
    plan = compile_layer(layer, g, x, edge_data_csc(g, ed))
    assert plan.edge_kinds == ("gspmm", "gspmm")
    out = layer(g, x, ed)
    with disabled():
        ref = layer(g, x, ed)
    torch.testing.assert_close(out, ref, **TOL)


class TypedVariant(SagaLayer):
    """Per-type selection written with torch.gather and a view."""

    gather = "sum"

    def __init__(self, f, t):
        super().__init__()
        self.lin = nn.Linear(f, t * f, bias=False)
        self.t, self.f = t, f

    def apply_edge(self, edge):
        per_type = self.lin(edge.src).reshape(-1, self.t, self.f)
        idx = edge.data.unsqueeze(-1).unsqueeze(-1).expand(-1, 1, self.f)
        return torch.gather(per_type, 1, idx).view(-1, self.f)


def test_typed_variant_lowers_to_typed_gspmm():
    g = make_graph("multi_edges")
    et = torch.randint(0, 4, (g.num_edges,))
    _check(TypedVariant(F_IN, 4), g, _x(g), et, kinds=("gspmm_typed",))


def test_typed_out_of_range_type_raises():
    g = make_graph("random")
    layer = TypedVariant(F_IN, 2).double()
    with pytest.raises((IndexError, RuntimeError)):
        layer(g, _x(g), torch.full((g.num_edges,), 5))


class HoistedCat(SagaLayer):
    """Hoistable linears, but a cat in the edge stage: hoisted + interpreted edge stage."""

    gather = "max"

    def __init__(self, f):
        super().__init__()
        self.a, self.b = nn.Linear(f, 2), nn.Linear(f, 3)

    def apply_edge(self, edge):
        return torch.cat([self.a(edge.src), self.b(edge.dst)], -1)


def test_hoisted_but_unfusable_runs_interpreted():
    g = make_graph("isolated")
    plan = _check(HoistedCat(F_IN), g, _x(g), kinds=("interp",))
    text = "\n".join(plan.describe())
    assert "hoist    fired" in text and "non-element-wise op (cat)" in text


class CatMLP(SagaLayer):
    """A linear over cat(src, dst): split by input block, both blocks hoisted, then fused."""

    gather = "sum"

    def __init__(self, f):
        super().__init__()
        self.lin = nn.Linear(2 * f, f)

    def apply_edge(self, edge):
        return torch.relu(self.lin(torch.cat([edge.src, edge.dst], -1)))


def test_linear_over_cat_splits_hoists_and_fuses():
    g = make_graph("random")
    plan = _check(CatMLP(F_IN), g, _x(g), kinds=("fused_edge",))
    text = "\n".join(plan.describe())
    assert "split    fired" in text
    assert "t0 = linear(edge.src, lin.weight[:, 0:5])" in text
    assert "t1 = linear(edge.dst, lin.weight[:, 5:10])" in text


class EdgeNetwork(SagaLayer):
    """MPNN's edge network: a Sequential MLP over cat(src, dst, edge.data)."""

    gather = "sum"

    def __init__(self, f, d):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2 * f + d, 4), nn.ReLU(), nn.Linear(4, 3))

    def apply_edge(self, edge):
        return self.mlp(torch.cat([edge.src, edge.dst, edge.data], dim=-1))


@pytest.mark.parametrize("gather", ["sum", "mean"])
@pytest.mark.parametrize("case", ["random", "isolated", "multi_edges", "empty"])
def test_edge_network_lowers_to_one_fused_kernel(case, gather):
    """split + hoist take the first layer's src/dst blocks per vertex, sink moves the
    second layer after the gather (bias deg(v) times for sum, once for mean), and what
    is left per edge is element-wise: one fused kernel."""
    layer = type(f"EdgeNetwork_{gather}", (EdgeNetwork,), {"gather": gather})(F_IN, 2)
    g = make_graph(case)
    ed = torch.randn(g.num_edges, 2, dtype=torch.float64)
    plan = _check(layer, g, _x(g), ed, kinds=("fused_edge",))
    text = "\n".join(plan.describe())
    assert "t0 = linear(edge.src, mlp.0.weight[:, 0:5])" in text
    assert "t1 = linear(edge.dst, mlp.0.weight[:, 5:10])" in text
    assert "sink     fired: propagate-then-transform: mlp.2 (4 -> 3)" in text
    assert "cat(" not in text.split("stages:")[1]


def test_sink_needs_a_linear_gather():
    layer = type("EdgeNetwork_max", (EdgeNetwork,), {"gather": "max"})(F_IN, 2)
    g = make_graph("random")
    ed = torch.randn(g.num_edges, 2, dtype=torch.float64)
    plan = _check(layer, g, _x(g), ed, kinds=("interp",))
    text = "\n".join(plan.describe())
    assert "sink     skipped: gather 'max' is not linear (needs sum or mean)" in text
    assert "hoist    fired" in text  # the first layer's blocks are still per vertex


def test_scalar_edge_feature_block_is_an_outer_product_in_the_kernel():
    """A width-1 edge block is ``edge.data * W[:, j]`` inside the kernel: the only
    per-edge input is the [E, 1] edge data itself."""
    g = make_graph("random")
    ed = torch.randn(g.num_edges, 1, dtype=torch.float64)
    plan = _check(EdgeNetwork(F_IN, 1), g, _x(g), ed, kinds=("fused_edge",))
    text = "\n".join(plan.describe())
    assert "(edge.data * mlp.0.weight[:, 10:11].view(-1,))" in text
    assert "relu(src0 + dst0 + edge0 * dst1 + dst2)" in text


def test_sequential_with_an_unknown_module_stays_opaque():
    layer = EdgeNetwork(F_IN, 2)
    layer.mlp.append(nn.LayerNorm(3))
    g = make_graph("random")
    ed = torch.randn(g.num_edges, 2, dtype=torch.float64)
    plan = _check(layer, g, _x(g), ed)
    assert plan.kind == "generic" and "opaque call (mlp)" in plan.reason


# ---------------------------------------------------------------------------- must not fuse
class ProductMLP(SagaLayer):
    gather = "sum"

    def __init__(self, f):
        super().__init__()
        self.lin = nn.Linear(f, f)

    def apply_edge(self, edge):
        return torch.relu(self.lin(edge.src * edge.dst))


class ControlFlow(SagaLayer):
    gather = "sum"

    def apply_edge(self, edge):
        if edge.src.sum() > 0:
            return edge.src
        return -edge.src


class EdgeDropout(SagaLayer):
    gather = "sum"

    def __init__(self, f):
        super().__init__()
        self.lin = nn.Linear(f, f)

    def apply_edge(self, edge):
        return F.dropout(self.lin(edge.src), 0.5, self.training) * edge.dst


class InPlace(SagaLayer):
    gather = "sum"

    def apply_edge(self, edge):
        h = edge.src.clone()
        h.mul_(2.0)
        return h


class EagerRandom(SagaLayer):
    gather = "sum"

    def apply_edge(self, edge):
        return edge.src * torch.rand(1, dtype=torch.float64)


@pytest.mark.parametrize("layer, why", [
    (ProductMLP(F_IN), "non-element-wise op (linear)"),
    (ControlFlow(), "data-dependent control flow"),
    (EdgeDropout(F_IN), "random op (dropout)"),
    (InPlace(), "in place"),
    (EagerRandom(), "drew random numbers"),
])
def test_unfusable_programs_fall_back_correctly(layer, why):
    g = make_graph("random")
    plan = _check(layer, g, _x(g), seed=7)
    assert plan.kind == "generic" and why in plan.reason, plan.reason
    assert why in explain(layer, g, _x(g).detach())


def test_dropout_in_training_matches_generic_and_differs_between_calls():
    g = make_graph("random")
    layer = EdgeDropout(F_IN).double().train()
    x = _x(g)
    torch.manual_seed(3)
    a = layer(g, x)
    with disabled():
        torch.manual_seed(3)
        b = layer(g, x)
    torch.testing.assert_close(a, b)
    assert not torch.equal(layer(g, x), layer(g, x))


def test_product_mlp_reason_names_the_expression():
    g = make_graph("random")
    text = explain(ProductMLP(F_IN), g, torch.randn(g.num_nodes, F_IN))
    assert "apply_edge reads edge.src and edge.dst inside a non-element-wise op (linear)" in text
    assert "relu(lin((edge.src * edge.dst)))" in text


class OpaqueVertex(SagaLayer):
    """apply_vertex with a GRUCell and batch-norm: opaque, run as written."""

    gather = "sum"

    def __init__(self, f):
        super().__init__()
        self.gru = nn.GRUCell(f, f)
        self.bn = nn.BatchNorm1d(f)

    def apply_vertex(self, vertex, acc):
        return self.bn(self.gru(acc, vertex))


def test_opaque_vertex_stage_runs_as_written():
    g = make_graph("random")
    layer = OpaqueVertex(F_IN).double().eval()
    _check(layer, g, _x(g), kinds=("gspmm",))
    before = layer.bn.running_mean.clone()
    layer.train()
    compile_layer(layer, g, _x(g), None)  # compiling must not touch batch-norm statistics
    torch.testing.assert_close(layer.bn.running_mean, before)


class DstScaled(SagaLayer):
    """A destination-side scalar per edge: hoisted, then a gspmm edge weight."""

    gather = "sum"

    def apply_edge(self, edge):
        return edge.src * torch.sigmoid(edge.dst.sum(-1, keepdim=True))


def test_dst_scalar_factor_is_a_gspmm_edge_weight():
    g = make_graph("skewed")
    plan = _check(DstScaled(), g, _x(g), kinds=("gspmm",))
    assert "sigmoid(edge.dst.sum(-1))" in "\n".join(plan.describe())


class DotAttention(SagaLayer):
    """Dot-product attention without heads: the score mixes both ends, summed over features
    (edge_score, no one-pass kernel); with ``squash`` a tanh of the sum, which no kernel
    takes."""

    gather = "softmax"

    def __init__(self, f, squash=False):
        super().__init__()
        self.q, self.k = nn.Linear(f, 4), nn.Linear(f, 4)
        self.squash = squash

    def apply_edge(self, edge):
        k = self.k(edge.src)
        s = (self.q(edge.dst) * k).sum(-1)
        return (torch.tanh(s) if self.squash else s), k


@pytest.mark.parametrize("case", ["self_loops", "isolated"])
def test_dot_product_softmax_runs_edge_score(case):
    g = make_graph(case)
    plan = _check(DotAttention(F_IN), g, _x(g), kinds=("softmax_score",))
    text = "\n".join(plan.describe())
    assert "contract skipped" in text  # q(dst) * k(src): neither side is row-independent
    assert "edge_score(dst0 * src0" in text or "edge_score(src0 * dst0" in text, text
    assert "no [E, H, D] tensor" in text


def test_unmatched_softmax_runs_hoisted_and_interpreted():
    g = make_graph("self_loops")
    plan = _check(DotAttention(F_IN, squash=True), g, _x(g), kinds=("interp",))
    text = "\n".join(plan.describe())
    assert "hoist    fired" in text
    assert "contract skipped" in text  # q(dst) * k(src): neither side is row-independent
    assert "c * expr.sum(-1)" in text  # what the score would have to be


class LinearOfDifference(SagaLayer):
    """``lin(edge.src - edge.dst)`` (and, with ``plus``, ``lin(edge.dst + edge.src)``) under
    max: distributed into per-side Linears, hoisted, fused (compiled == generic: the bias
    is added once)."""

    gather = "max"

    def __init__(self, f, plus=False):
        super().__init__()
        self.lin = nn.Linear(f, 3)
        self.plus = plus

    def apply_edge(self, edge):
        d = edge.dst + edge.src if self.plus else edge.src - edge.dst
        return torch.tanh(self.lin(d))


@pytest.mark.parametrize("plus", [False, True])
@pytest.mark.parametrize("case", ["random", "isolated", "multi_edges"])
def test_linear_over_a_difference_distributes_and_fuses(case, plus):
    g = make_graph(case)
    plan = _check(LinearOfDifference(F_IN, plus), g, _x(g), kinds=("fused_edge",))
    text = "\n".join(plan.describe())
    assert "distributed" in text and "one linear per part" in text, text


class LinearOfBroadcastSum(SagaLayer):
    """``lin(edge.src + edge.data)`` with a width-1 edge term: a broadcast part, so the
    Linear is not distributed (its parts would have other shapes)."""

    gather = "sum"

    def __init__(self, f):
        super().__init__()
        self.lin = nn.Linear(f, 3)

    def apply_edge(self, edge):
        return self.lin(edge.src + edge.data.unsqueeze(-1))


def test_linear_over_a_broadcast_sum_is_not_distributed():
    g = make_graph("random")
    w = torch.randn(g.num_edges, dtype=torch.float64)
    plan = _check(LinearOfBroadcastSum(F_IN), g, _x(g), w)
    assert "distributed" not in "\n".join(plan.describe())
