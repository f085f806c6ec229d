"""32-bit and 64-bit index paths give identical results; the 64-bit path where it must.

A graph keeps int32 offsets and ids while they fit (:mod:`ngra.idtype`); every kernel
takes either dtype as given. On every labeled graph case the int32 path must produce
bit-identical outputs and gradients to the int64 path, forward and backward, for the
kernels a compiled layer lowers to and for whole layers. The switch to 64 bits is
tested on synthetic offsets (a real graph past 2**31 edges does not fit a test).
"""

from __future__ import annotations

import pytest
import torch
from graph_cases import CASES, graph_case

import ngra
from ngra.graph import CSR, EdgeFactors
from ngra.idtype import INT32_MAX, ids_dtype, idtype_for, narrow, offsets_dtype
from ngra.kernels import gspmm, segment_reduce, softmax_aggregate, transpose_csc
from ngra.models import GATConv, GCNConv, SAGEConv


def _both(case, gen):
    """The case's CSC as (int64 indptr, int64 indices) and (int32, int32), same edges."""
    indptr, indices, num_src = graph_case(case, gen, torch.int64)
    return (indptr, indices), (indptr.to(torch.int32), indices.to(torch.int32)), num_src


def _run(fn, *inputs):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(torch.ones_like(out))
    return out.detach(), [t.grad for t in leaves]


def _same(a, b):
    out_a, grads_a = a
    out_b, grads_b = b
    assert torch.equal(out_a, out_b)
    for ga, gb in zip(grads_a, grads_b):
        assert (ga is None and gb is None) or torch.equal(ga, gb)


@pytest.mark.parametrize("case", list(CASES))
def test_kernels_identical_for_int32_and_int64(case, gen):
    (ip64, ix64), (ip32, ix32), num_src = _both(case, gen)
    num_dst, e = ip64.numel() - 1, ix64.numel()
    x = torch.randn(num_src, 3, 4, generator=gen)
    w = torch.rand(e, 3, generator=gen)
    s_src, s_dst = torch.rand(num_src, generator=gen), torch.rand(num_dst, generator=gen)
    for reduce in ("sum", "mean", "max"):
        _same(_run(lambda a, b: gspmm(ip64, ix64, a, b, reduce=reduce), x, w),
              _run(lambda a, b: gspmm(ip32, ix32, a, b, reduce=reduce), x, w))
    _same(_run(lambda a: gspmm(ip64, ix64, a, scale=(s_src, s_dst)), x),
          _run(lambda a: gspmm(ip32, ix32, a, scale=(s_src, s_dst)), x))
    ss, sd = torch.randn(num_src, 3, generator=gen), torch.randn(num_dst, 3, generator=gen)
    _same(_run(lambda a, b, c: softmax_aggregate(ip64, ix64, a, b, c), ss, sd, x),
          _run(lambda a, b, c: softmax_aggregate(ip32, ix32, a, b, c), ss, sd, x))
    _same(_run(lambda a: segment_reduce(ip64, a, "sum"), w),
          _run(lambda a: segment_reduce(ip32, a, "sum"), w))
    r64, r32 = transpose_csc(ip64, ix64, num_src), transpose_csc(ip32, ix32, num_src)
    for a, b in zip(r64, r32):
        assert torch.equal(a.long(), b.long())


def _wide(g: ngra.Graph) -> ngra.Graph:
    """The same graph with int64 offsets, ids and CSR (what a graph past 2**31 holds)."""
    csr = g.csr()
    wide = ngra.Graph(g.indptr.long(), g.indices.long(), None, g.num_nodes,
                      edge_factors=g.edge_factors)
    wide._cache["csr"] = CSR(csr.indptr.long(), csr.indices.long(), csr.perm.long())
    return wide


@pytest.mark.parametrize("case", ["isolated", "self_loops", "skewed"])
@pytest.mark.parametrize("layer_name", ["gcn", "sage", "gat"])
def test_layers_identical_for_int32_and_int64(case, layer_name, gen):
    src, dst, num_src, num_dst = CASES[case](gen)
    n = max(num_src, num_dst)
    g = ngra.Graph.from_edge_index(torch.stack([src, dst]), num_nodes=n)
    g = ngra.Graph.from_csc(g.indptr, g.indices)  # in CSC order
    if layer_name == "gcn":
        g = g.gcn_norm(order="csc")
        layer = GCNConv(5, 4)
    else:
        layer = SAGEConv(5, 4) if layer_name == "sage" else GATConv(5, 2, heads=2)
    assert g.indptr.dtype == g.indices.dtype == torch.int32
    wide = _wide(g)
    x = torch.randn(n, 5, generator=gen)
    _same(_run(lambda a: layer(g, a), x), _run(lambda a: layer(wide, a), x))


def test_the_64_bit_switch_on_synthetic_offsets():
    # offsets past 2**31 edges take int64; ids stay int32 while the vertices fit
    indptr = torch.tensor([0, 5, INT32_MAX + 1, INT32_MAX + 9], dtype=torch.int64)
    assert narrow(indptr, int(indptr[-1])).dtype == torch.int64
    assert narrow(indptr[:2], int(indptr[1])).dtype == torch.int32
    assert offsets_dtype(int(indptr[-1])) == torch.int64
    assert offsets_dtype(INT32_MAX) == torch.int32
    assert ids_dtype(indptr.numel() - 1) == torch.int32
    # ids past 2**31 vertices take int64 (vertex ids go up to num_nodes - 1)
    assert ids_dtype(INT32_MAX + 1) == torch.int32 and ids_dtype(INT32_MAX + 2) == torch.int64
    assert idtype_for(-1) == torch.int32
    # a graph given wide arrays whose values fit keeps the narrow dtypes
    g = ngra.Graph.from_csc(torch.tensor([0, 1, 3]), torch.tensor([1, 0, 1]))
    assert g.indptr.dtype == g.indices.dtype == torch.int32


def test_factored_weights_match_the_edge_tensor(gen):
    ei = torch.randint(0, 30, (2, 200), generator=gen)
    g = ngra.Graph.from_edge_index(ei, num_nodes=30).gcn_norm()
    assert isinstance(g.edge_factors, EdgeFactors)
    explicit = ngra.Graph(g.indptr, g.indices, None, g.num_nodes, g.edge_weight)
    layer = GCNConv(6, 3)
    x = torch.randn(30, 6, generator=gen)
    a, b = _run(lambda t: layer(g, t), x), _run(lambda t: layer(explicit, t), x)
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1][0], b[1][0])
