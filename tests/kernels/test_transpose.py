"""CSC -> CSR transpose: numba == reference == ngra.Graph.csr()."""

from __future__ import annotations

import pytest
import torch
from graph_cases import CASES, graph_case

import ngra
from ngra.kernels import transpose_csc, use_backend


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_cpu_matches_ref(case, index_dtype, gen):
    indptr, indices, num_src = graph_case(case, gen, index_dtype)
    with use_backend("ref"):
        ref = transpose_csc(indptr, indices, num_src)
    with use_backend("cpu"):
        cpu = transpose_csc(indptr, indices, num_src)
    for a, b in zip(ref, cpu):
        assert torch.equal(a, b)
    rev_indptr, rev_indices, rev_perm = cpu
    # offsets and positions are 32-bit while E < 2**31 (ngra.idtype)
    assert rev_indices.dtype == index_dtype and rev_perm.dtype == rev_indptr.dtype == torch.int32
    assert rev_indptr.numel() == num_src + 1
    # Every CSR edge is the CSC edge rev_perm points to.
    dst = torch.repeat_interleave(indptr[1:] - indptr[:-1])
    src = torch.repeat_interleave(rev_indptr[1:] - rev_indptr[:-1])
    assert torch.equal(indices[rev_perm].long(), src)
    assert torch.equal(dst[rev_perm], rev_indices.long())
    lean = transpose_csc(indptr, indices, num_src, with_perm=False)
    assert lean[2] is None and torch.equal(lean[0], rev_indptr)
    assert torch.equal(lean[1], rev_indices)


@pytest.mark.parametrize("chunk", [7, 1 << 21])  # many blocks of edges; one
@pytest.mark.parametrize("case", ["random", "self_loops", "multi_edges", "skewed", "empty",
                                  "empty_no_dst", "bipartite_wide", "bipartite_narrow"])
def test_gpu_matches_ref(case, chunk, gen, monkeypatch):
    """The gpu backend's block-by-block stable sort (torch ops, run here on CPU tensors)
    gives the reference's CSR, edge order within a source included."""
    import ngra.kernels.gpu.transpose as gpu_transpose

    monkeypatch.setattr(gpu_transpose, "CHUNK_EDGES", chunk)
    for index_dtype in (torch.int32, torch.int64):
        indptr, indices, num_src = graph_case(case, gen, index_dtype)
        with use_backend("ref"):
            ref = transpose_csc(indptr, indices, num_src)
        with use_backend("gpu"):
            got = transpose_csc(indptr, indices, num_src)
            lean = transpose_csc(indptr, indices, num_src, with_perm=False)
        for a, b in zip(ref, got):
            assert a.dtype == b.dtype and torch.equal(a, b)
        assert lean[2] is None and torch.equal(lean[0], ref[0]) and torch.equal(lean[1], ref[1])


def test_matches_graph_csr(gen):
    ei = torch.randint(0, 20, (2, 80), generator=gen)
    g = ngra.Graph.from_edge_index(ei, num_nodes=20)
    csr = g.csr()
    for backend in ("ref", "cpu"):
        with use_backend(backend):
            rev = transpose_csc(g.indptr, g.indices, 20)
        assert torch.equal(rev[0], csr.indptr)
        assert torch.equal(rev[1], csr.indices)
        assert torch.equal(rev[2], csr.perm)
