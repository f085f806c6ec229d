"""ngra.Graph: construction, validation, CSC/CSR, helpers and interop."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from ngra import Graph


def _rand_edges(n=50, e=300, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else int(torch.randint(1 << 30, ())))
    return torch.randint(0, n, (2, e), generator=g)


def _pairs(ei):
    return sorted(map(tuple, ei.t().tolist()))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.uint8])
def test_from_edge_index_any_int_dtype(dtype):
    ei = _rand_edges(40, 200).to(dtype)
    g = Graph.from_edge_index(ei, num_nodes=40)
    assert g.num_nodes == 40 and g.num_edges == 200
    # 32-bit ids and offsets where they fit (ngra.idtype)
    assert g.indptr.dtype == torch.int32 and g.indices.dtype == torch.int32
    # CSC invariants: destinations sorted, perm maps back to the original order
    dst = g.dst_index()
    assert torch.all(dst[1:] >= dst[:-1])
    assert torch.equal(g.edge_index(), ei.long())
    assert torch.equal(g.edge_index("csc")[:, :], ei.long()[:, g.perm.long()])


def test_csr_matches_csc():
    ei = _rand_edges()
    g = Graph.from_edge_index(ei, num_nodes=50)
    csr = g.csr()
    src = torch.repeat_interleave(torch.arange(50), csr.indptr[1:] - csr.indptr[:-1])
    assert _pairs(torch.stack([src, csr.indices])) == _pairs(ei)
    # perm: CSR edge -> CSC position with the same (src, dst)
    assert not csr.has_perm  # built only when a kernel reads edge data in backward
    assert torch.equal(g.indices[csr.perm].long(), src)
    assert torch.equal(g.dst_index()[csr.perm], csr.indices)
    assert csr is g.csr()  # cached


def test_empty_and_isolated():
    g = Graph.from_edge_index(torch.zeros(2, 0, dtype=torch.long), num_nodes=5)
    assert g.num_edges == 0 and g.indptr.tolist() == [0] * 6 and not g.has_perm
    assert g.in_degrees().tolist() == [0] * 5
    assert Graph.from_edge_index(torch.zeros(2, 0, dtype=torch.long)).num_nodes == 0
    assert g.csr().indptr.tolist() == [0] * 6


@pytest.mark.parametrize(
    "ei, kw, exc, match",
    [
        (torch.zeros(3, 4, dtype=torch.long), {}, ValueError, r"shape \[2, num_edges\].*\[3, 4\]"),
        (torch.zeros(2, 3), {}, TypeError, "integer vertex ids.*float32"),
        (torch.tensor([[0, -1], [1, 0]]), {}, ValueError, "negative vertex id"),
        (torch.tensor([[0, 5], [1, 0]]), {"num_nodes": 3}, ValueError, "refers to vertex 5.*num_nodes=3"),
        (torch.tensor([[0, 1], [1, 0]]), {"num_nodes": -1}, ValueError, "num_nodes must be >= 0"),
        (torch.tensor([[0, 1], [1, 0]]), {"num_nodes": 2.0}, TypeError, "num_nodes must be an int"),
        (torch.tensor([[0, 1], [1, 0]]), {"edge_weight": torch.tensor([1.0, float("nan")])},
         ValueError, "finite.*edge 1"),
        (torch.tensor([[0, 1], [1, 0]]), {"edge_weight": torch.tensor([1, 2])}, TypeError, "float"),
        (torch.tensor([[0, 1], [1, 0]]), {"edge_weight": torch.ones(3)}, ValueError, r"shape \[2\]"),
        ("nope", {}, TypeError, "torch.Tensor, numpy array or list"),
        # a raw 2**40 id once asked the allocator for 8.8 TB of offsets
        (torch.tensor([[0, 2**40], [1, 0]]), {}, ValueError, "at most 2,147,483,647 vertices"),
        (torch.tensor([[0, 1], [1, 0]]), {"num_nodes": 2**33}, ValueError, "Renumber"),
    ],
)
def test_validation_errors(ei, kw, exc, match):
    with pytest.raises(exc, match=match):
        Graph.from_edge_index(ei, **kw)


def test_immutable():
    g = Graph.from_edge_index(torch.tensor([[0], [1]]))
    with pytest.raises(AttributeError, match="immutable"):
        g.num_nodes = 3


def test_from_csc_validation():
    g = Graph.from_csc(torch.tensor([0, 1, 3]), torch.tensor([1, 0, 1]))
    assert g.num_edges == 3 and g.in_degrees().tolist() == [1, 2]
    with pytest.raises(ValueError, match="non-decreasing"):
        Graph.from_csc(torch.tensor([0, 2, 1]), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"indptr\[-1\]"):
        Graph.from_csc(torch.tensor([0, 1, 2]), torch.tensor([0]))
    with pytest.raises(ValueError, match="indices must be in"):
        Graph.from_csc(torch.tensor([0, 1, 2]), torch.tensor([0, 7]))


def test_scipy_roundtrip():
    ei = _rand_edges(30, 100).unique(dim=1)
    w = torch.rand(ei.shape[1])
    g = Graph.from_edge_index(ei, num_nodes=30, edge_weight=w)
    m = g.to_scipy()
    dense = torch.zeros(30, 30)
    dense[ei[0], ei[1]] = w
    assert np.allclose(m.toarray(), dense.numpy())
    g2 = Graph.from_scipy(sp.csr_matrix(m))
    assert _pairs(g2.edge_index()) == _pairs(ei)
    with pytest.raises(ValueError, match="square"):
        Graph.from_scipy(sp.csr_matrix((3, 4)))


def test_helpers():
    ei = torch.tensor([[0, 1, 1, 2, 2], [1, 0, 2, 2, 0]])  # one self-loop at 2
    g = Graph.from_edge_index(ei, num_nodes=4)
    assert g.has_self_loops()
    assert not g.remove_self_loops().has_self_loops()
    gl = g.add_self_loops()
    assert gl.num_edges == 5 + 4
    s = g.remove_self_loops().symmetrize()
    assert _pairs(s.edge_index()) == sorted({(0, 1), (1, 0), (1, 2), (2, 1), (2, 0), (0, 2)})
    assert g.in_degrees().tolist() == [2, 1, 2, 0]
    assert g.out_degrees().tolist() == [1, 2, 2, 0]


@pytest.mark.parametrize("order", ["original", "csc"])
def test_gcn_norm_matches_definition(order):
    ei = _rand_edges(20, 60)
    g = Graph.from_edge_index(ei, num_nodes=20).gcn_norm(order=order)
    # unweighted: two [N] factors, no [E] tensor; edge_weight is made from them
    assert g.edge_factors is not None and g.has_perm == (order == "original")
    full = g.edge_index("csc")
    deg = torch.bincount(full[1], minlength=20).float()
    expect = deg[full[0]].rsqrt() * deg[full[1]].rsqrt()
    assert torch.allclose(g.edge_weight, expect)


def test_to_another_device_moves_a_shared_factor_once():
    """GCN's normalization is one [N] tensor on both sides: a device gets one copy."""
    g = Graph.from_edge_index(_rand_edges(20, 60), num_nodes=20).gcn_norm(order="csc")
    assert g.edge_factors.src is g.edge_factors.dst
    moved = g.to("meta")
    f = moved.edge_factors
    assert f.src.device.type == "meta" and f.src is f.dst
    assert moved.indices.dtype == torch.int32 and not moved.has_perm


def test_self_loops_in_csc_order_need_no_perm():
    ei = torch.tensor([[2, 0, 1, 2], [0, 1, 1, 2]])  # in CSC order, a loop at 2
    g = Graph.from_edge_index(ei, num_nodes=4)
    assert not g.has_perm
    lean, kept = g.add_self_loops(order="csc"), g.add_self_loops()
    assert not lean.has_perm and kept.has_perm
    assert torch.equal(lean.edge_index("csc"), kept.edge_index("csc"))
    # the loop of each vertex follows its in-edges; the original order appends the loops
    assert lean.edge_index().tolist() == [[2, 0, 0, 1, 1, 2, 2, 3], [0, 0, 1, 1, 1, 2, 2, 3]]
    assert kept.edge_index().tolist() == [[2, 0, 1, 2, 0, 1, 2, 3], [0, 1, 1, 2, 0, 1, 2, 3]]
    w = torch.arange(4.0)
    kept_w = Graph.from_edge_index(ei, num_nodes=4, edge_weight=w).add_self_loops(fill_value=9)
    assert kept_w.edge_weight_original().tolist() == [0, 1, 2, 3, 9, 9, 9, 9]
    no_loops = kept.remove_self_loops()
    assert no_loops.edge_index().tolist() == [[2, 0], [0, 1]]


def test_gcn_norm_matches_pyg():
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    ei = Graph.from_edge_index(_rand_edges(25, 80), num_nodes=25).remove_self_loops().symmetrize().edge_index()
    w = torch.rand(ei.shape[1])
    ref_ei, ref_w = gcn_norm(ei, w, num_nodes=25, add_self_loops=True)
    ours = Graph.from_edge_index(ei, num_nodes=25, edge_weight=w).gcn_norm()
    a = dict(zip(map(tuple, ours.edge_index().t().tolist()), ours.edge_weight_original().tolist()))
    b = dict(zip(map(tuple, ref_ei.t().tolist()), ref_w.tolist()))
    assert a.keys() == b.keys()
    assert all(abs(a[k] - b[k]) < 1e-6 for k in a)


def test_pyg_and_dgl_roundtrip():
    pytest.importorskip("torch_geometric")
    ei = _rand_edges(30, 90)
    w = torch.rand(90)
    g = Graph.from_edge_index(ei, num_nodes=30, edge_weight=w)
    d = g.to_pyg()
    assert torch.equal(d.edge_index, ei) and torch.equal(d.edge_weight, w)
    g2 = Graph.from_pyg(d)
    assert torch.equal(g2.indices, g.indices) and torch.equal(g2.edge_weight, g.edge_weight)
    try:
        from ngra.compat import import_dgl
        import_dgl()
    except ImportError:
        pytest.skip("dgl absent")
    dg = g.to_dgl()
    assert dg.num_nodes() == 30 and torch.equal(dg.edata["w"], w)
    g3 = Graph.from_dgl(dg, weight_field="w")
    assert torch.equal(g3.edge_index(), ei) and torch.equal(g3.edge_weight, g.edge_weight)


def test_pickle_and_copy():
    import copy
    import pickle

    g = Graph.from_edge_index(_rand_edges(10, 30), num_nodes=10, edge_weight=torch.rand(30))
    for h in (pickle.loads(pickle.dumps(g)), copy.deepcopy(g), copy.copy(g)):
        assert torch.equal(h.indptr, g.indptr) and torch.equal(h.perm, g.perm)
        assert torch.equal(h.edge_weight, g.edge_weight) and h.num_nodes == 10
