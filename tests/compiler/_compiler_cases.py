"""Shared helpers of the compiler tests: labeled graph cases (from ``tests/graph_cases.py``),
tile grids, plain-torch references.

The references below write each zoo model's math directly with ``index_select`` /
``index_add`` over the original edge list, independent of ngra's executor and kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from graph_cases import SQUARE_CASES, case_generator, square_graph

from ngra import Graph
from ngra.models import relation_norm

N = 14
GRAPH_CASES = SQUARE_CASES


def make_graph(case: str, n: int = N) -> Graph:
    """A labeled square graph case with ``n`` vertices, seeded from ``(case, n)`` and
    ``$NGRA_TEST_SEED`` (fresh on each run unless that is set; see ``graph_cases``)."""
    return square_graph(case, n, case_generator("square", case, n))


def edge_types(graph: Graph, num_types: int) -> torch.Tensor:
    gen = case_generator("edge_types", graph.num_edges, num_types)
    return torch.randint(0, num_types, (graph.num_edges,), generator=gen)


# ---------------------------------------------------------------------------- references
def _sum_to(msg: torch.Tensor, dst: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros((n,) + msg.shape[1:], dtype=msg.dtype).index_add(0, dst, msg)


def _mean_to(msg: torch.Tensor, dst: torch.Tensor, n: int) -> torch.Tensor:
    deg = torch.bincount(dst, minlength=n).clamp(min=1).to(msg.dtype)
    return _sum_to(msg, dst, n) / deg.view(-1, *([1] * (msg.dim() - 1)))


def ref_gcn(layer, g, x, w):
    src, dst = g.edge_index()
    agg = _sum_to(x.index_select(0, src) * w.unsqueeze(-1), dst, g.num_nodes)
    return agg @ layer.lin.weight.T + layer.lin.bias


def ref_sage(layer, g, x, _):
    src, dst = g.edge_index()
    agg = _mean_to(x.index_select(0, src), dst, g.num_nodes)
    return agg @ layer.lin_l.weight.T + layer.lin_l.bias + x @ layer.lin_r.weight.T


def ref_gin(layer, g, x, _):
    src, dst = g.edge_index()
    h = (1 + layer.eps) * x + _sum_to(x.index_select(0, src), dst, g.num_nodes)
    l1, l2 = layer.mlp[0], layer.mlp[2]
    return torch.relu(h @ l1.weight.T + l1.bias) @ l2.weight.T + l2.bias


def ref_commnet(layer, g, x, _):
    src, dst = g.edge_index()
    agg = _mean_to(x.index_select(0, src), dst, g.num_nodes)
    return torch.tanh(x @ layer.h.weight.T + layer.h.bias + agg @ layer.c.weight.T)


def ref_gat(layer, g, x, _):
    src, dst = g.edge_index()
    n, heads, f = g.num_nodes, layer.heads, layer.f_out
    h = (x @ layer.lin.weight.T).view(n, heads, f)
    a_s = (h * layer.a_src).sum(-1)
    a_d = (h * layer.a_dst).sum(-1)
    e = F.leaky_relu(a_s.index_select(0, src) + a_d.index_select(0, dst), layer.negative_slope)
    emax = torch.full((n, heads), -torch.inf, dtype=e.dtype).scatter_reduce(
        0, dst.view(-1, 1).expand(-1, heads), e, "amax", include_self=True)
    p = torch.exp(e - emax.index_select(0, dst))
    denom = _sum_to(p, dst, n)
    alpha = p / denom.index_select(0, dst)
    out = _sum_to(alpha.unsqueeze(-1) * h.index_select(0, src), dst, n)
    out = out.flatten(1) if layer.concat else out.mean(1)
    return out + layer.bias


def ref_ggcn(layer, g, x, _):
    src, dst = g.edge_index()
    hd = x @ layer.w_h.weight.T + layer.w_h.bias
    hs = x @ layer.w_c.weight.T + layer.w_c.bias
    gate = torch.sigmoid(hd.index_select(0, dst) + hs.index_select(0, src))
    agg = _sum_to(gate * x.index_select(0, src), dst, g.num_nodes)
    return torch.relu(agg @ layer.w.weight.T + layer.w.bias)


def _typed_messages(weight, x, src, etype, num_types, width):
    """Per-type loop: sum_t [type == t] (x_src @ W_t^T), W_t the t-th block of rows."""
    msg = torch.zeros(src.numel(), width, dtype=x.dtype)
    for t in range(num_types):
        sel = (etype == t).nonzero().view(-1)
        w_t = weight[t * width:(t + 1) * width]
        msg = msg.index_add(0, sel, x.index_select(0, src.index_select(0, sel)) @ w_t.T)
    return msg


def ref_ggnn(layer, g, x, etype):
    src, dst = g.edge_index()
    msg = _typed_messages(layer.lin.weight, x, src, etype, layer.num_types, layer.width)
    m = _sum_to(msg, dst, g.num_nodes)
    return layer.gru(m, x)


def ref_rgcn(layer, g, x, ed):
    src, dst = g.edge_index()
    msg = _typed_messages(layer.lin.weight, x, src, ed["type"], layer.num_types, layer.f_out)
    m = _sum_to(msg * ed["norm"].unsqueeze(-1), dst, g.num_nodes)
    return m + x @ layer.root.weight.T + layer.root.bias


def zoo_case(name: str, g: Graph, f_in: int = 6, f_out: int = 4, dtype=torch.float64):
    """``(layer, graph, edge_data, reference, expected edge kinds)`` for zoo model ``name``."""
    from ngra import models

    if name == "gcn":
        gg = g.gcn_norm()
        return (models.GCNConv(f_in, f_out), gg, gg.edge_weight_original().to(dtype), ref_gcn,
                ("gspmm",))
    if name == "sage":
        return models.SAGEConv(f_in, f_out), g, None, ref_sage, ("gspmm",)
    if name == "gin":
        layer = models.GINConv(f_in, f_out)
        with torch.no_grad():
            layer.eps.fill_(0.3)
        return layer, g, None, ref_gin, ("gspmm",)
    if name == "commnet":
        return models.CommNetConv(f_in, f_out), g, None, ref_commnet, ("gspmm",)
    if name == "gat":
        return (models.GATConv(f_in, f_out, heads=2), g.add_self_loops(), None, ref_gat,
                ("softmax_aggregate",))
    if name == "gat_mean":
        return (models.GATConv(f_in, f_out, heads=3, concat=False), g, None, ref_gat,
                ("softmax_aggregate",))
    if name == "ggcn":
        return models.GGCNConv(f_in, f_out), g, None, ref_ggcn, ("fused_edge",)
    if name == "ggnn":
        layer = models.GGNNConv(f_in, 3)
        return layer, g, edge_types(g, 3), ref_ggnn, ("gspmm_typed",)
    if name == "rgcn":
        et = edge_types(g, 3)
        norm = relation_norm(g, et, 3).to(dtype)
        return (models.RGCNConv(f_in, f_out, 3), g, {"type": et, "norm": norm}, ref_rgcn,
                ("gspmm_typed",))
    raise ValueError(name)


ZOO = ("gcn", "sage", "gin", "commnet", "gat", "gat_mean", "ggcn", "ggnn", "rgcn")


def grads(out: torch.Tensor, probe: torch.Tensor, inputs: list[torch.Tensor]) -> list:
    gs = torch.autograd.grad((out * probe).sum(), inputs, allow_unused=True)
    return [torch.zeros_like(i) if g is None else g for g, i in zip(gs, inputs)]


def assert_close_all(a: list, b: list, what: str, **tol) -> None:
    for i, (x, y) in enumerate(zip(a, b)):
        torch.testing.assert_close(x, y, msg=lambda m: f"{what} [{i}]: {m}", **tol)
