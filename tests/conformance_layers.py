"""Layers users write, as SagaLayers, with plain-torch references and PyG counterparts.

The conformance suite of issue 39 (``tests/compiler/test_conformance_layers.py``): each
layer here is written the way a user would write it from the paper, not the way the
compiler likes it. For each there is

* a reference forward written directly with ``index_select`` / ``index_add`` /
  ``scatter_reduce`` over the original edge list (``ref_*``), independent of ngra's
  executor, compiler and kernels;
* where PyG has the layer built in, a builder that makes it with the same weights
  (``pyg_*``), for the same graph given as an explicit edge list (no self-loops added on
  PyG's side: the ngra graph carries them where the layer wants them).

:func:`conformance_case` returns everything a test needs for one layer on one graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ngra import Graph, SagaLayer


# ============================================================================ layers
class GATv2(SagaLayer):
    r"""GATv2 (Brody et al. 2022): the attention vector is applied after the nonlinearity,

    .. math::
        e_{uv} = a_h^\top \mathrm{LeakyReLU}(W_s x_u + W_d x_v),\quad
        h_v' = \Vert_h \sum_{u \to v} \mathrm{softmax}_u(e_{uv})\, W_s x_u + b
    """

    gather = "softmax"

    def __init__(self, f_in: int, f_out: int, heads: int = 4, slope: float = 0.2) -> None:
        super().__init__()
        self.heads, self.f_out, self.slope = heads, f_out, slope
        self.lin_l = nn.Linear(f_in, heads * f_out)
        self.lin_r = nn.Linear(f_in, heads * f_out)
        self.att = nn.Parameter(torch.randn(heads, f_out) / math.sqrt(f_out))
        self.bias = nn.Parameter(torch.randn(heads * f_out) * 0.1)

    def apply_edge(self, edge):
        xs = self.lin_l(edge.src).view(-1, self.heads, self.f_out)
        xd = self.lin_r(edge.dst).view(-1, self.heads, self.f_out)
        score = (F.leaky_relu(xs + xd, self.slope) * self.att).sum(-1)
        return score, xs

    def apply_vertex(self, vertex, acc):
        return acc.flatten(1) + self.bias


class Transformer(SagaLayer):
    r"""Graph transformer attention (Shi et al. 2021, PyG's ``TransformerConv``):

    .. math::
        \alpha_{uv} = \mathrm{softmax}_u\Big(\frac{(W_q x_v)^\top (W_k x_u)}{\sqrt d}\Big),\quad
        h_v' = W_r x_v + \Vert_h \sum_{u \to v} \alpha_{uv} W_v x_u
    """

    gather = "softmax"

    def __init__(self, f_in: int, f_out: int, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.f_out = heads, f_out
        self.query = nn.Linear(f_in, heads * f_out)
        self.key = nn.Linear(f_in, heads * f_out)
        self.value = nn.Linear(f_in, heads * f_out)
        self.skip = nn.Linear(f_in, heads * f_out)

    def apply_edge(self, edge):
        q = self.query(edge.dst).view(-1, self.heads, self.f_out)
        k = self.key(edge.src).view(-1, self.heads, self.f_out)
        v = self.value(edge.src).view(-1, self.heads, self.f_out)
        return (q * k).sum(-1) / math.sqrt(self.f_out), v

    def apply_vertex(self, vertex, acc):
        return acc.flatten(1) + self.skip(vertex)


class GINE(SagaLayer):
    r"""GIN with edge features (Hu et al. 2020, PyG's ``GINEConv`` with ``edge_dim``):

    .. math::
        h_v' = \mathrm{MLP}\big((1 + \epsilon) x_v + \sum_{u \to v} \mathrm{ReLU}(x_u + W_e e_{uv})\big)
    """

    gather = "sum"

    def __init__(self, f_in: int, f_out: int, edge_dim: int) -> None:
        super().__init__()
        self.edge_lin = nn.Linear(edge_dim, f_in)
        self.mlp = nn.Sequential(nn.Linear(f_in, f_out), nn.ReLU(), nn.Linear(f_out, f_out))
        self.eps = nn.Parameter(torch.tensor([0.25]))

    def apply_edge(self, edge):
        return torch.relu(edge.src + self.edge_lin(edge.data))

    def apply_vertex(self, vertex, acc):
        return self.mlp((1 + self.eps) * vertex + acc)


class PNAAggregate(SagaLayer):
    """PNA's four aggregators of the pre-transformed message ``h = W [x_v || x_u]`` from
    one edge walk: a gather per field (mean of ``h`` and of ``h * h``, max, min)."""

    gather = {"mean": "mean", "sq": "mean", "max": "max", "min": "min"}

    def __init__(self, pre: nn.Linear) -> None:
        super().__init__()
        self.pre = pre

    def apply_edge(self, edge):
        h = self.pre(torch.cat([edge.dst, edge.src], dim=-1))
        return {"mean": h, "sq": h * h, "max": h, "min": h}


class PNAMoments(SagaLayer):
    """The three-layer form of PNA's aggregation (:class:`PNA` with ``one_walk=False``,
    kept as the layer benchmark's "before"): first and second moments, ``mean`` gather."""

    gather = "mean"

    def __init__(self, pre: nn.Linear) -> None:
        super().__init__()
        self.pre = pre

    def apply_edge(self, edge):
        h = self.pre(torch.cat([edge.dst, edge.src], dim=-1))
        return {"m": h, "m2": h * h}


class PNAExtreme(SagaLayer):
    """The three-layer form's max or min of the pre-transformed message."""

    def __init__(self, pre: nn.Linear, gather: str) -> None:
        super().__init__()
        self.pre = pre
        self.gather = gather

    def apply_edge(self, edge):
        return self.pre(torch.cat([edge.dst, edge.src], dim=-1))


class PNA(nn.Module):
    r"""Principal neighbourhood aggregation (Corso et al. 2020) with mean, min, max and std
    aggregators and identity, amplification and attenuation scalers (one tower, one pre
    and one post layer: PyG's ``PNAConv`` defaults). One SAGA layer with a gather per
    field (:class:`PNAAggregate`) makes the four aggregators from one edge walk; the
    scalers and the post transform are per vertex.

    Args:
        f_in: input width. f_out: output width. avg_log: mean of ``log(deg + 1)`` over
            the training graph's vertices (PyG's ``deg`` histogram, reduced).
        one_walk: ``False`` writes the aggregation as three SAGA layers sharing ``pre``
            (moments, max, min: three walks, the form before per-field gathers), for
            the layer benchmark's comparison (default: ``True``).
    """

    def __init__(self, f_in: int, f_out: int, avg_log: float, one_walk: bool = True) -> None:
        super().__init__()
        self.pre = nn.Linear(2 * f_in, f_in)
        self.one_walk = one_walk
        if one_walk:
            self.aggregate = PNAAggregate(self.pre)
        else:
            self.moments = PNAMoments(self.pre)
            self.max = PNAExtreme(self.pre, "max")
            self.min = PNAExtreme(self.pre, "min")
        self.post = nn.Linear(13 * f_in, f_out)
        self.lin = nn.Linear(f_out, f_out)
        self.avg_log = avg_log

    def forward(self, graph: Graph, x: torch.Tensor, edge_data: Any = None) -> torch.Tensor:
        if self.one_walk:
            ag = self.aggregate(graph, x)
            mean, sq, hi, lo = ag["mean"], ag["sq"], ag["max"], ag["min"]
        else:
            mo = self.moments(graph, x)
            mean, sq = mo["m"], mo["m2"]
            hi, lo = self.max(graph, x), self.min(graph, x)
        std = (sq - mean * mean).clamp(min=1e-5).sqrt()
        std = std.masked_fill(std <= math.sqrt(1e-5), 0.0)
        aggs = torch.cat([mean, lo, hi, std], dim=-1)
        log_deg = torch.log(graph.in_degrees().to(x.dtype).clamp(min=0) + 1).unsqueeze(-1)
        amp = aggs * (log_deg / self.avg_log)
        att = aggs * (self.avg_log / torch.log(graph.in_degrees().to(x.dtype).clamp(min=1)
                                               + 1).unsqueeze(-1))
        return self.lin(self.post(torch.cat([x, aggs, amp, att], dim=-1)))


class EdgeConv(SagaLayer):
    r"""EdgeConv (Wang et al. 2019, DGCNN) with a one-layer MLP:
    :math:`h_v' = \max_{u \to v} \mathrm{ReLU}(W [x_v \Vert x_u - x_v] + b)`."""

    gather = "max"

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2 * f_in, f_out), nn.ReLU())

    def apply_edge(self, edge):
        return self.mlp(torch.cat([edge.dst, edge.src - edge.dst], dim=-1))


class EdgeConvMLP(EdgeConv):
    """EdgeConv with DGCNN's two-layer MLP: the second Linear reads a per-edge hidden
    vector under a max gather, which no kernel fuses. Kept in the suite on purpose: the
    layer that must fall back, and say why."""

    def __init__(self, f_in: int, f_out: int) -> None:
        SagaLayer.__init__(self)
        self.mlp = nn.Sequential(nn.Linear(2 * f_in, f_out), nn.ReLU(), nn.Linear(f_out, f_out))


class EdgeMLPNorm(SagaLayer):
    r"""An edge MLP with a LayerNorm over each edge's hidden features, mean-aggregated:
    :math:`h_v' = \mathrm{mean}_{u \to v} W_2 \mathrm{ReLU}(\mathrm{LN}(W_1 [x_v \Vert
    x_u - x_v] + b_1)) + b_2`. The LayerNorm reduces over an edge's features, which no
    kernel fuses: kept in the suite on purpose, the layer that runs on the chunked generic
    path (:mod:`ngra.compiler.chunked`); its PyG baseline is a ``MessagePassing`` with the
    same message (:func:`pyg_edge_mlp_norm`)."""

    gather = "mean"

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2 * f_in, f_out), nn.LayerNorm(f_out), nn.ReLU(),
                                 nn.Linear(f_out, f_out))

    def apply_edge(self, edge):
        return self.mlp(torch.cat([edge.dst, edge.src - edge.dst], dim=-1))


class GatedGCN(SagaLayer):
    r"""Residual gated graph convnet with edge features (Bresson & Laurent 2017; the
    benchmarking-GNNs version, without batch norm):

    .. math::
        \hat e_{uv} = C e_{uv} + D x_v + E x_u,\quad
        \eta_{uv} = \sigma(\hat e_{uv}),\quad
        h_v' = x_v + \mathrm{ReLU}\Big(A x_v + \frac{\sum_u \eta_{uv} \odot B x_u}
        {\sum_u \eta_{uv} + \epsilon}\Big),\quad e_{uv}' = e_{uv} + \mathrm{ReLU}(\hat e_{uv})

    The vertex update is this SAGA layer (two gathered messages); the edge update,
    an output of the layer of size ``[E, F]`` anyway, is :meth:`edge_update`.
    """

    gather = "sum"

    def __init__(self, f: int) -> None:
        super().__init__()
        self.A, self.B, self.C, self.D, self.E = (nn.Linear(f, f) for _ in range(5))

    def apply_edge(self, edge):
        gate = torch.sigmoid(self.C(edge.data) + self.D(edge.dst) + self.E(edge.src))
        return {"num": gate * self.B(edge.src), "den": gate}

    def apply_vertex(self, vertex, acc):
        return vertex + torch.relu(self.A(vertex) + acc["num"] / (acc["den"] + 1e-6))

    def edge_update(self, graph: Graph, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        src, dst = graph.edge_index()
        hat = self.C(e) + self.D(x).index_select(0, dst) + self.E(x).index_select(0, src)
        return e + torch.relu(hat)


class GatedGCNNet(nn.Module):
    """One GatedGCN step returning the new vertex and edge features (summed, so that a
    test's probe reaches both)."""

    def __init__(self, f: int) -> None:
        super().__init__()
        self.conv = GatedGCN(f)

    def forward(self, graph: Graph, x: torch.Tensor, e: torch.Tensor):
        h = self.conv(graph, x, e)
        return h, self.conv.edge_update(graph, x, e)


class Propagate(SagaLayer):
    """One step of normalized propagation ``sum_u w_uv h_u`` (SGC's and APPNP's step);
    with ``alpha`` the APPNP teleport ``(1 - alpha) * acc + alpha * h0``."""

    gather = "sum"

    def __init__(self, alpha: float | None = None) -> None:
        super().__init__()
        self.alpha = alpha

    def apply_edge(self, edge):
        h = edge.src if self.alpha is None else edge.src["h"]
        return h * edge.data.unsqueeze(-1)

    def apply_vertex(self, vertex, acc):
        if self.alpha is None:
            return acc
        return (1 - self.alpha) * acc + self.alpha * vertex["h0"]


class SGC(nn.Module):
    """SGC (Wu et al. 2019): ``Linear(A^K x)``, the propagation repeated ``k`` times."""

    def __init__(self, f_in: int, f_out: int, k: int = 3) -> None:
        super().__init__()
        self.prop, self.lin, self.k = Propagate(), nn.Linear(f_in, f_out), k

    def forward(self, graph: Graph, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        for _ in range(self.k):
            x = self.prop(graph, x, w)
        return self.lin(x)


class APPNP(nn.Module):
    """APPNP (Klicpera et al. 2019): ``h0 = Linear(x)``, then ``k`` personalized-PageRank
    steps ``h = (1 - alpha) A h + alpha h0``."""

    def __init__(self, f_in: int, f_out: int, k: int = 4, alpha: float = 0.1) -> None:
        super().__init__()
        self.lin, self.prop, self.k = nn.Linear(f_in, f_out), Propagate(alpha), k

    def forward(self, graph: Graph, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h0 = self.lin(x)
        h = h0
        for _ in range(self.k):
            h = self.prop(graph, {"h": h, "h0": h0}, w)
        return h


class LearnedEdgeGCN(SagaLayer):
    """GCN whose edge weights are parameters learned with the model: ``edge.data`` is an
    ``[E]`` tensor that requires grad (here squashed by a sigmoid per edge)."""

    gather = "sum"

    def __init__(self, f_in: int, f_out: int) -> None:
        super().__init__()
        self.lin = nn.Linear(f_in, f_out)

    def apply_edge(self, edge):
        return edge.src * torch.sigmoid(edge.data).unsqueeze(-1)

    def apply_vertex(self, vertex, acc):
        return self.lin(acc)


# ============================================================================ references
def _sum_to(msg: torch.Tensor, dst: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros((n,) + msg.shape[1:], dtype=msg.dtype).index_add(0, dst, msg)


def _mean_to(msg: torch.Tensor, dst: torch.Tensor, n: int) -> torch.Tensor:
    deg = torch.bincount(dst, minlength=n).clamp(min=1).to(msg.dtype)
    return _sum_to(msg, dst, n) / deg.view(-1, *([1] * (msg.dim() - 1)))


def _extreme_to(msg: torch.Tensor, dst: torch.Tensor, n: int, how: str) -> torch.Tensor:
    idx = dst.view(-1, *([1] * (msg.dim() - 1))).expand_as(msg)
    fill = -math.inf if how == "amax" else math.inf
    out = torch.full((n,) + msg.shape[1:], fill, dtype=msg.dtype)
    out = out.scatter_reduce(0, idx, msg, how, include_self=True)
    return torch.where(torch.isinf(out), torch.zeros_like(out), out)


def _softmax_to(score: torch.Tensor, value: torch.Tensor, dst: torch.Tensor, n: int):
    """``sum_u softmax_u(score) * value`` per destination; score [E, H], value [E, H, D]."""
    smax = _extreme_to(score.detach(), dst, n, "amax")
    p = torch.exp(score - smax.index_select(0, dst))
    denom = _sum_to(p, dst, n).index_select(0, dst)
    return _sum_to((p / denom).unsqueeze(-1) * value, dst, n)


def ref_gatv2(layer: GATv2, g: Graph, x: torch.Tensor, _: Any) -> torch.Tensor:
    src, dst = g.edge_index()
    h, d = layer.heads, layer.f_out
    xs = layer.lin_l(x).view(-1, h, d)
    xd = layer.lin_r(x).view(-1, h, d)
    e = F.leaky_relu(xs.index_select(0, src) + xd.index_select(0, dst), layer.slope)
    score = (e * layer.att).sum(-1)
    return _softmax_to(score, xs.index_select(0, src), dst, g.num_nodes).flatten(1) + layer.bias


def ref_transformer(layer: Transformer, g: Graph, x: torch.Tensor, _: Any) -> torch.Tensor:
    src, dst = g.edge_index()
    h, d = layer.heads, layer.f_out
    q, k, v = (lin(x).view(-1, h, d) for lin in (layer.query, layer.key, layer.value))
    score = (q.index_select(0, dst) * k.index_select(0, src)).sum(-1) / math.sqrt(d)
    out = _softmax_to(score, v.index_select(0, src), dst, g.num_nodes).flatten(1)
    return out + layer.skip(x)


def ref_gine(layer: GINE, g: Graph, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    src, dst = g.edge_index()
    msg = torch.relu(x.index_select(0, src) + layer.edge_lin(e))
    return layer.mlp((1 + layer.eps) * x + _sum_to(msg, dst, g.num_nodes))


def ref_pna(model: PNA, g: Graph, x: torch.Tensor, _: Any) -> torch.Tensor:
    src, dst = g.edge_index()
    n = g.num_nodes
    h = model.pre(torch.cat([x.index_select(0, dst), x.index_select(0, src)], -1))
    mean = _mean_to(h, dst, n)
    var = _mean_to(h * h, dst, n) - mean * mean
    std = var.clamp(min=1e-5).sqrt()
    std = std.masked_fill(std <= math.sqrt(1e-5), 0.0)
    aggs = torch.cat([mean, _extreme_to(h, dst, n, "amin"), _extreme_to(h, dst, n, "amax"),
                      std], -1)
    deg = torch.bincount(dst, minlength=n).to(x.dtype)
    amp = aggs * (torch.log(deg + 1) / model.avg_log).unsqueeze(-1)
    att = aggs * (model.avg_log / torch.log(deg.clamp(min=1) + 1)).unsqueeze(-1)
    return model.lin(model.post(torch.cat([x, aggs, amp, att], -1)))


def ref_edgeconv(layer: EdgeConv, g: Graph, x: torch.Tensor, _: Any) -> torch.Tensor:
    src, dst = g.edge_index()
    xd, xs = x.index_select(0, dst), x.index_select(0, src)
    return _extreme_to(layer.mlp(torch.cat([xd, xs - xd], -1)), dst, g.num_nodes, "amax")


def ref_edge_mlp_norm(layer: EdgeMLPNorm, g: Graph, x: torch.Tensor, _: Any) -> torch.Tensor:
    src, dst = g.edge_index()
    xd, xs = x.index_select(0, dst), x.index_select(0, src)
    return _mean_to(layer.mlp(torch.cat([xd, xs - xd], -1)), dst, g.num_nodes)


def ref_gatedgcn(net: GatedGCNNet, g: Graph, x: torch.Tensor, e: torch.Tensor):
    c = net.conv
    src, dst = g.edge_index()
    hat = c.C(e) + c.D(x).index_select(0, dst) + c.E(x).index_select(0, src)
    gate = torch.sigmoid(hat)
    num = _sum_to(gate * c.B(x).index_select(0, src), dst, g.num_nodes)
    den = _sum_to(gate, dst, g.num_nodes)
    h = x + torch.relu(c.A(x) + num / (den + 1e-6))
    return h, e + torch.relu(hat)


def _propagate(g: Graph, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    src, dst = g.edge_index()
    return _sum_to(h.index_select(0, src) * w.unsqueeze(-1), dst, g.num_nodes)


def ref_sgc(model: SGC, g: Graph, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    for _ in range(model.k):
        x = _propagate(g, x, w)
    return model.lin(x)


def ref_appnp(model: APPNP, g: Graph, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h0 = model.lin(x)
    h = h0
    a = model.prop.alpha
    for _ in range(model.k):
        h = (1 - a) * _propagate(g, h, w) + a * h0
    return h


def ref_learned_gcn(layer: LearnedEdgeGCN, g: Graph, x: torch.Tensor,
                    w: torch.Tensor) -> torch.Tensor:
    return layer.lin(_propagate(g, x, torch.sigmoid(w)))


# ============================================================================ PyG builders
def _like(module: nn.Module, like: nn.Module) -> nn.Module:
    """``module`` in ``like``'s dtype (before weights are copied in: no rounding)."""
    return module.to(next(like.parameters()).dtype)


def _copy_linear(dst: Any, src: nn.Linear) -> None:
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        if src.bias is not None and dst.bias is not None:
            dst.bias.copy_(src.bias)


def pyg_gatv2(layer: GATv2) -> nn.Module:
    from torch_geometric.nn import GATv2Conv

    f_in = layer.lin_l.in_features
    conv = _like(GATv2Conv(f_in, layer.f_out, heads=layer.heads, negative_slope=layer.slope,
                           add_self_loops=False), layer)
    _copy_linear(conv.lin_l, layer.lin_l)
    _copy_linear(conv.lin_r, layer.lin_r)
    with torch.no_grad():
        conv.att.copy_(layer.att.view(1, layer.heads, layer.f_out))
        conv.bias.copy_(layer.bias)
    return conv


def pyg_transformer(layer: Transformer) -> nn.Module:
    from torch_geometric.nn import TransformerConv

    conv = _like(TransformerConv(layer.query.in_features, layer.f_out, heads=layer.heads), layer)
    for name in ("query", "key", "value", "skip"):
        _copy_linear(getattr(conv, f"lin_{name}"), getattr(layer, name))
    return conv


def pyg_gine(layer: GINE) -> nn.Module:
    from torch_geometric.nn import GINEConv

    mlp = nn.Sequential(nn.Linear(layer.mlp[0].in_features, layer.mlp[0].out_features),
                        nn.ReLU(), nn.Linear(layer.mlp[2].in_features, layer.mlp[2].out_features))
    conv = _like(GINEConv(mlp, eps=float(layer.eps), train_eps=True,
                          edge_dim=layer.edge_lin.in_features), layer)
    # after construction: GINEConv resets its nn's parameters
    _copy_linear(conv.nn[0], layer.mlp[0])
    _copy_linear(conv.nn[2], layer.mlp[2])
    _copy_linear(conv.lin, layer.edge_lin)
    with torch.no_grad():
        conv.eps.copy_(layer.eps)
    return conv


def pyg_pna(model: PNA, deg_hist: torch.Tensor) -> nn.Module:
    from torch_geometric.nn import PNAConv

    f_in = model.pre.out_features
    conv = _like(PNAConv(f_in, model.lin.out_features, ["mean", "min", "max", "std"],
                         ["identity", "amplification", "attenuation"], deg_hist), model)
    _copy_linear(conv.pre_nns[0][0], model.pre)
    _copy_linear(conv.post_nns[0][0], model.post)
    _copy_linear(conv.lin, model.lin)
    with torch.no_grad():  # PyG reduces the histogram in float32; use the exact value
        conv.aggr_module.avg_deg_log.fill_(model.avg_log)
    return conv


def pyg_edgeconv(layer: EdgeConv) -> nn.Module:
    from torch_geometric.nn import EdgeConv as PygEdgeConv

    lin = layer.mlp[0]
    mods = [nn.Linear(lin.in_features, lin.out_features), nn.ReLU()]
    if len(layer.mlp) > 2:
        mods.append(nn.Linear(layer.mlp[2].in_features, layer.mlp[2].out_features))
    conv = _like(PygEdgeConv(nn.Sequential(*mods), aggr="max"), layer)
    _copy_linear(conv.nn[0], lin)
    if len(layer.mlp) > 2:
        _copy_linear(conv.nn[2], layer.mlp[2])
    return conv


def pyg_edge_mlp_norm(layer: EdgeMLPNorm) -> nn.Module:
    """A PyG ``MessagePassing`` with :class:`EdgeMLPNorm`'s message and mean aggregation
    (a copy of its MLP: the same weights)."""
    import copy

    from torch_geometric.nn import MessagePassing

    class EdgeMLPNormConv(MessagePassing):
        def __init__(self, mlp: nn.Module) -> None:
            super().__init__(aggr="mean")
            self.mlp = mlp

        def forward(self, x, edge_index):
            return self.propagate(edge_index, x=x)

        def message(self, x_i, x_j):
            return self.mlp(torch.cat([x_i, x_j - x_i], dim=-1))

    return EdgeMLPNormConv(copy.deepcopy(layer.mlp))


class _PygSGC(nn.Module):
    def __init__(self, model: SGC) -> None:
        super().__init__()
        from torch_geometric.nn import SGConv

        self.conv = _like(SGConv(model.lin.in_features, model.lin.out_features, K=model.k,
                                 add_self_loops=False), model)
        _copy_linear(self.conv.lin, model.lin)

    def forward(self, x, edge_index, edge_weight):
        # SGConv always normalizes: on the ngra graph (self-loops already in) with unit
        # weights its gcn_norm is the ngra graph's gcn_norm
        return self.conv(x, edge_index)


class _PygAPPNP(nn.Module):
    def __init__(self, model: APPNP) -> None:
        super().__init__()
        from torch_geometric.nn import APPNP as PygAPPNP

        self.lin = _like(nn.Linear(model.lin.in_features, model.lin.out_features), model)
        _copy_linear(self.lin, model.lin)
        self.prop = PygAPPNP(model.k, model.prop.alpha, normalize=False)

    def forward(self, x, edge_index, edge_weight):
        return self.prop(self.lin(x), edge_index, edge_weight)


class _PygLearnedGCN(nn.Module):
    def __init__(self, layer: LearnedEdgeGCN) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.conv = _like(GCNConv(layer.lin.in_features, layer.lin.out_features,
                                  normalize=False), layer)
        _copy_linear(self.conv.lin, layer.lin)
        with torch.no_grad():  # PyG's GCNConv adds its bias after propagation
            self.conv.bias.copy_(layer.lin.bias)

    def forward(self, x, edge_index, w):
        return self.conv(x, edge_index, torch.sigmoid(w))


# ============================================================================ DGL builders
# DGL's built-in layers of the same definition, with the ngra layer's weights (its import
# through ngra.compat.import_dgl: DGL 2.1 on a newer torch). Each returns a module called
# as ``module(dgl_graph, x, edata)`` on a DGL graph with the same edges (edata in that
# graph's edge order). DGL lacks TransformerConv, the two-layer EdgeConv MLP and the
# LayerNorm edge MLP; its PNAConv is another definition (a LeakyReLU mixing layer, std
# without PNA's threshold, a graph-size normalization), so PNA has no DGL builder.
def _dgl_nn():
    from ngra.compat import import_dgl

    import_dgl()
    import dgl.nn as dglnn

    return dglnn


class _DglGATv2(nn.Module):
    """``GATv2Conv`` (biases on its two linears) plus :class:`GATv2`'s output bias."""

    def __init__(self, layer: GATv2) -> None:
        super().__init__()
        f_in = layer.lin_l.in_features
        self.conv = _like(_dgl_nn().GATv2Conv(f_in, layer.f_out, layer.heads,
                                              negative_slope=layer.slope,
                                              allow_zero_in_degree=True), layer)
        _copy_linear(self.conv.fc_src, layer.lin_l)
        _copy_linear(self.conv.fc_dst, layer.lin_r)
        self.bias = nn.Parameter(layer.bias.detach().clone())
        with torch.no_grad():
            self.conv.attn.copy_(layer.att.view(1, layer.heads, layer.f_out))

    def forward(self, graph, x, _=None):
        return self.conv(graph, x).flatten(1) + self.bias


class _DglGINE(nn.Module):
    """``GINEConv`` (no edge linear of its own) after :class:`GINE`'s edge linear."""

    def __init__(self, layer: GINE) -> None:
        super().__init__()
        self.edge_lin = _like(nn.Linear(layer.edge_lin.in_features,
                                        layer.edge_lin.out_features), layer)
        _copy_linear(self.edge_lin, layer.edge_lin)
        mlp = _like(nn.Sequential(nn.Linear(layer.mlp[0].in_features, layer.mlp[0].out_features),
                                  nn.ReLU(), nn.Linear(layer.mlp[2].in_features,
                                                       layer.mlp[2].out_features)), layer)
        _copy_linear(mlp[0], layer.mlp[0])
        _copy_linear(mlp[2], layer.mlp[2])
        self.conv = _like(_dgl_nn().GINEConv(mlp, init_eps=float(layer.eps), learn_eps=True),
                          layer)
        with torch.no_grad():
            self.conv.eps.copy_(layer.eps)

    def forward(self, graph, x, e):
        return self.conv(graph, x, self.edge_lin(e))


class _DglEdgeConv(nn.Module):
    r"""DGL's ``EdgeConv`` is :math:`\max_u \Theta(x_v - x_u) + \Phi x_v`; with
    :math:`W = [W_1 \Vert W_2]`, :math:`\Theta = -W_2` (bias ``b``), :math:`\Phi = W_1`
    (no bias) and a ReLU after the max (ReLU is monotone: max of ReLU = ReLU of max) it is
    :class:`EdgeConv`."""

    def __init__(self, layer: EdgeConv) -> None:
        super().__init__()
        lin = layer.mlp[0]
        f_in = lin.in_features // 2
        self.conv = _like(_dgl_nn().EdgeConv(f_in, lin.out_features, allow_zero_in_degree=True),
                          layer)
        with torch.no_grad():
            self.conv.phi.weight.copy_(lin.weight[:, :f_in])
            self.conv.phi.bias.zero_()
            self.conv.theta.weight.copy_(-lin.weight[:, f_in:])
            self.conv.theta.bias.copy_(lin.bias)

    def forward(self, graph, x, _=None):
        return torch.relu(self.conv(graph, x))


class _DglGatedGCN(nn.Module):
    """``GatedGCNConv`` without batch norm (ReLU, residual): the DGL names ``D`` / ``E``
    read the source / destination, :class:`GatedGCN`'s the destination / source."""

    def __init__(self, layer: GatedGCN) -> None:
        super().__init__()
        f = layer.A.in_features
        self.conv = _like(_dgl_nn().GatedGCNConv(f, f, f, batch_norm=False, residual=True),
                          layer)
        for mine, theirs in (("A", "A"), ("B", "B"), ("C", "C"), ("D", "E"), ("E", "D")):
            _copy_linear(getattr(self.conv, theirs), getattr(layer, mine))

    def forward(self, graph, x, e):
        return self.conv(graph, x, e)


class _DglGatedGCNNet(nn.Module):
    """:class:`GatedGCNNet` in DGL: ``(new vertex features, new edge features)``."""

    def __init__(self, net: GatedGCNNet) -> None:
        super().__init__()
        self.conv = _DglGatedGCN(net.conv)

    def forward(self, graph, x, e):
        return self.conv(graph, x, e)


class _DglSGC(nn.Module):
    """``SGConv`` normalizes by ``in_degree^-1/2`` on both sides: the ngra graph's
    ``gcn_norm`` (self-loops already in); the given weights are not read."""

    def __init__(self, model: SGC) -> None:
        super().__init__()
        self.conv = _like(_dgl_nn().SGConv(model.lin.in_features, model.lin.out_features,
                                           k=model.k, allow_zero_in_degree=True), model)
        _copy_linear(self.conv.fc, model.lin)

    def forward(self, graph, x, _=None):
        return self.conv(graph, x)


class _DglAPPNP(nn.Module):
    """``APPNPConv`` after :class:`APPNP`'s linear. It normalizes by ``out_degree^-1/2``
    of the source and ``in_degree^-1/2`` of the destination (and renormalizes any weights
    it is given): :class:`APPNP` on a ``gcn_norm`` graph whose in- and out-degrees agree
    (a symmetric graph: Cora, PubMed); elsewhere the same cost, another normalization."""

    def __init__(self, model: APPNP) -> None:
        super().__init__()
        self.lin = _like(nn.Linear(model.lin.in_features, model.lin.out_features), model)
        _copy_linear(self.lin, model.lin)
        self.prop = _dgl_nn().APPNPConv(model.k, model.prop.alpha)

    def forward(self, graph, x, _=None):
        h = self.lin(x)
        if h.dtype == torch.float32:
            return self.prop(graph, h)
        # its unweighted path multiplies by float32 ones; unit weights in h's dtype,
        # renormalized by out- and in-degree, are the same normalization
        return self.prop(graph, h, edge_weight=torch.ones(graph.num_edges(), dtype=h.dtype))


class _DglLearnedGCN(nn.Module):
    """``GraphConv(norm="none")`` with ``sigmoid(w)`` as its edge weights."""

    def __init__(self, layer: LearnedEdgeGCN) -> None:
        super().__init__()
        self.conv = _like(_dgl_nn().GraphConv(layer.lin.in_features, layer.lin.out_features,
                                              norm="none", allow_zero_in_degree=True), layer)
        with torch.no_grad():
            self.conv.weight.copy_(layer.lin.weight.t())
            self.conv.bias.copy_(layer.lin.bias)

    def forward(self, graph, x, w):
        return self.conv(graph, x, edge_weight=torch.sigmoid(w))


# layer name -> ``builder(ngra layer or model) -> DGL module``; absent: no DGL built-in of
# the same definition
DGL_BUILDERS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "gatv2": _DglGATv2,
    "gine": _DglGINE,
    "edgeconv": _DglEdgeConv,
    "gatedgcn": _DglGatedGCNNet,
    "sgc": _DglSGC,
    "appnp": _DglAPPNP,
    "learned_gcn": _DglLearnedGCN,
}


# ============================================================================ cases
@dataclass
class Case:
    """One conformance layer on one graph.

    Attributes:
        layer: the ngra module (a SagaLayer or a model of SagaLayers).
        graph: the graph it runs on (self-loops added where the layer wants them).
        x: ``[N, F]`` vertex features (float64, requires grad).
        edata: edge data in the graph's original edge order (may require grad), or None.
        ref: ``ref(layer, graph, x, edata)``, the plain-torch forward.
        saga: the SagaLayers inside ``layer`` whose plans the suite checks, each with the
            edge kernel kinds it is expected to lower to (``("interp",)``: the interpreted
            edge stage; ``("generic",)``: the generic plan) and the inputs it is called with
            (``(x, edata)``).
        pyg: ``pyg(layer) -> module`` called as ``module(x, edge_index, edata)``, or None.
    """

    layer: nn.Module
    graph: Graph
    x: torch.Tensor
    edata: Any
    ref: Callable
    saga: list[tuple[SagaLayer, tuple[str, ...], tuple]]
    pyg: Callable | None


LAYERS = ("gatv2", "transformer", "gine", "pna", "edgeconv", "edgeconv_mlp", "edge_mlp_norm",
          "gatedgcn", "sgc", "appnp", "learned_gcn")

# the edge kernel(s) each SagaLayer of a layer lowers to
EXPECTED: dict[str, tuple[tuple[str, ...], ...]] = {
    "gatv2": (("softmax_score",),),
    "transformer": (("softmax_score",),),
    "gine": (("fused_edge",),),
    # one SagaLayer, a gather per field: its four fields from one fused walk
    "pna": (("fused_edge_multi",) * 4,),
    "edgeconv": (("fused_edge",),),
    "edgeconv_mlp": (("interp",),),
    "edge_mlp_norm": (("generic",),),
    "gatedgcn": (("fused_edge", "fused_edge"),),
    "sgc": (("gspmm",),),
    "appnp": (("gspmm",),),
    "learned_gcn": (("gspmm",),),
}


def avg_log_degree(g: Graph) -> float:
    """PNA's ``avg_deg_log``: the mean over vertices of ``log(in-degree + 1)``."""
    deg = g.in_degrees().to(torch.float64)
    avg = float(torch.log(deg + 1).mean()) if g.num_nodes else 0.0
    return avg if avg > 0 else 1.0  # no edges: any positive normalizer


def degree_histogram(g: Graph) -> torch.Tensor:
    deg = g.in_degrees().to(torch.int64)
    return torch.bincount(deg, minlength=1)


def conformance_case(name: str, g: Graph, f_in: int = 6, f_out: int = 4, heads: int = 2,
                     edge_dim: int = 3, dtype: torch.dtype = torch.float64) -> Case:
    """The :class:`Case` of layer ``name`` (one of :data:`LAYERS`) on ``g``; parameters
    and inputs are drawn from torch's global generator."""
    x = torch.randn(g.num_nodes, f_in, dtype=dtype, requires_grad=True)
    if name == "gatv2":
        gg = g.add_self_loops()
        layer = GATv2(f_in, f_out, heads).to(dtype)
        return Case(layer, gg, x, None, ref_gatv2, [(layer, EXPECTED[name][0], (x, None))],
                    pyg_gatv2)
    if name == "transformer":
        layer = Transformer(f_in, f_out, heads).to(dtype)
        return Case(layer, g, x, None, ref_transformer, [(layer, EXPECTED[name][0], (x, None))],
                    pyg_transformer)
    if name == "gine":
        layer = GINE(f_in, f_out, edge_dim).to(dtype)
        e = torch.randn(g.num_edges, edge_dim, dtype=dtype, requires_grad=True)
        return Case(layer, g, x, e, ref_gine, [(layer, EXPECTED[name][0], (x, e))], pyg_gine)
    if name == "pna":
        model = PNA(f_in, f_out, avg_log_degree(g)).to(dtype)
        hist = degree_histogram(g)
        saga = [(model.aggregate, EXPECTED[name][0], (x, None))]
        return Case(model, g, x, None, ref_pna, saga, lambda m: pyg_pna(m, hist))
    if name in ("edgeconv", "edgeconv_mlp"):
        layer = (EdgeConv if name == "edgeconv" else EdgeConvMLP)(f_in, f_out).to(dtype)
        return Case(layer, g, x, None, ref_edgeconv, [(layer, EXPECTED[name][0], (x, None))],
                    pyg_edgeconv)
    if name == "edge_mlp_norm":
        layer = EdgeMLPNorm(f_in, f_out).to(dtype)
        return Case(layer, g, x, None, ref_edge_mlp_norm, [(layer, EXPECTED[name][0], (x, None))],
                    pyg_edge_mlp_norm)
    if name == "gatedgcn":
        net = GatedGCNNet(f_in).to(dtype)
        e = torch.randn(g.num_edges, f_in, dtype=dtype, requires_grad=True)
        return Case(net, g, x, e, ref_gatedgcn, [(net.conv, EXPECTED[name][0], (x, e))], None)
    if name in ("sgc", "appnp"):
        gg = g.gcn_norm()
        w = _unit_gcn_weights(gg).to(dtype)
        model = (SGC if name == "sgc" else APPNP)(f_in, f_out).to(dtype)
        hh = torch.randn(g.num_nodes, f_out, dtype=dtype)
        ins = (x, w) if name == "sgc" else ({"h": hh, "h0": hh}, w)
        ref = ref_sgc if name == "sgc" else ref_appnp
        pyg = _PygSGC if name == "sgc" else _PygAPPNP
        return Case(model, gg, x, w, ref, [(model.prop, EXPECTED[name][0], ins)], pyg)
    if name == "learned_gcn":
        layer = LearnedEdgeGCN(f_in, f_out).to(dtype)
        w = torch.randn(g.num_edges, dtype=dtype, requires_grad=True)
        return Case(layer, g, x, w, ref_learned_gcn, [(layer, EXPECTED[name][0], (x, w))],
                    _PygLearnedGCN)
    raise ValueError(f"unknown conformance layer {name!r}; expected one of {LAYERS}")


def _unit_gcn_weights(g: Graph) -> torch.Tensor:
    """``[E]`` GCN weights of ``g`` (a ``gcn_norm`` graph) in its original edge order, as
    a plain float64 tensor (the graph keeps its normalization as float32 vertex factors)."""
    src, dst = g.edge_index()
    deg = torch.bincount(dst, minlength=g.num_nodes).to(torch.float64)
    dinv = deg.pow(-0.5)
    dinv[torch.isinf(dinv)] = 0
    return dinv[src] * dinv[dst]
