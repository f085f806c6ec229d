"""A structure memory-mapped from disk is walked in blocks: same results, pages dropped.

When ``indptr``/``indices`` are mapped (the on-disk store) the g-SpMM's forward and its
CSC-walk backward go through the destinations in blocks of edges
(``kernels/cpu/util.walk_blocks``), reading the next block ahead and dropping each
block's pages after it. Checked against the same kernels on the same graph in memory
(the reference backend for the gradients: the in-memory cpu backward transposes), on
every labeled graph case with blocks of a few edges, and the dropped ranges against the
edges: every edge released exactly once, in order.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from graph_cases import CASES, graph_case
from kernel_testing import assert_same, run

import ngra.kernels.cpu.util as cpu_util
import ngra.mapped as mapped
from ngra.datasets.store import mapped_tensor
from ngra.kernels import gspmm
from ngra.kernels.checks import check_csc

pytestmark = pytest.mark.usefixtures("parallel_kernels")


def _mapped(t: torch.Tensor, path) -> torch.Tensor:
    np.save(path, t.numpy())
    return mapped_tensor(path)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 7 edges, and a record of the ranges released from each mapped array."""
    monkeypatch.setattr(cpu_util, "MAPPED_BLOCK_EDGES", 7)
    released: list[tuple[int, int, int]] = []
    real = mapped.release_mapped

    def spy(t, lo=None, hi=None):
        released.append((t.ctypes.data if hasattr(t, "ctypes") else t.data_ptr(), lo, hi))
        return real(t, lo, hi)

    monkeypatch.setattr(mapped, "release_mapped", spy)
    return released


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize(("reduce", "scaled"), [("sum", False), ("mean", False), ("max", False),
                                                ("sum", True), ("mean", True)])
def test_mapped_structure_gives_the_in_memory_results(case, reduce, scaled, gen, tmp_path,
                                                      small_blocks):
    indptr, indices, num_src = graph_case(case, gen, torch.int32)
    num_dst = indptr.numel() - 1
    x = torch.randn(num_src, 2, 3, dtype=torch.float64, generator=gen)
    scale = ((torch.rand(num_src, dtype=torch.float64, generator=gen) + 0.5,
              torch.rand(num_dst, dtype=torch.float64, generator=gen) + 0.5) if scaled else None)
    m_indptr, m_indices = _mapped(indptr, tmp_path / "ip.npy"), _mapped(indices, tmp_path / "ix.npy")
    assert mapped.is_mapped(m_indices) or not indices.numel()

    want = run("ref", lambda a: gspmm(indptr, indices, a, reduce=reduce, scale=scale), [x],
               gen=gen)
    check_csc(m_indptr, m_indices, num_src)  # validated once (in blocks), before the record
    small_blocks.clear()
    got = run("cpu", lambda a: gspmm(m_indptr, m_indices, a, reduce=reduce, scale=scale), [x],
              want[2])
    assert_same([got[0], got[1][0]], [want[0], want[1][0]], torch.float64)

    # every edge's pages dropped once, block after block, in forward (and the CSC walk's
    # backward for sum/mean: a second pass of the same blocks)
    ptr = m_indices.data_ptr()
    spans = [(lo, hi) for p, lo, hi in small_blocks if p == ptr]
    passes = 1 if reduce == "max" else 2
    e = indices.numel()
    if e:
        assert len(spans) % passes == 0 and len(spans) >= passes
        per = len(spans) // passes
        for k in range(passes):
            mine = spans[k * per:(k + 1) * per]
            assert mine[0][0] == 0 and mine[-1][1] == e
            assert all(a[1] == b[0] for a, b in zip(mine, mine[1:]))
        if e > 7 * 3:
            assert per > 1  # it did walk in blocks


def test_walk_blocks_cover_the_rows_once(tmp_path, monkeypatch, gen):
    """In memory: one block over every row. Mapped: contiguous blocks of about
    ``MAPPED_BLOCK_EDGES`` edges from row 0 to the last, whatever the skew."""
    monkeypatch.setattr(cpu_util, "MAPPED_BLOCK_EDGES", 5)
    indptr, indices, _ = graph_case("skewed", gen, torch.int32)
    n = indptr.numel() - 1
    assert list(cpu_util.walk_blocks(indptr.numpy(), (indices.numpy(),))) == [(0, n)]
    m = _mapped(indices, tmp_path / "ix.npy").numpy()
    blocks = list(cpu_util.walk_blocks(indptr.numpy(), (m,)))
    assert blocks[0][0] == 0 and blocks[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    assert len(blocks) <= max(1, -(-int(indptr[-1]) // 5)) and all(a < b for a, b in blocks)


def test_checks_read_a_mapped_structure_in_blocks(tmp_path, monkeypatch, small_blocks):
    """The kernels' input checks read a mapped array in blocks, dropping each (never the
    whole array resident), and find what they find in memory: a decrease of ``indptr``
    across a block boundary, an id out of range in the last block."""
    import ngra.kernels.checks as checks

    monkeypatch.setattr(checks, "_CHECK_BLOCK", 4)
    indptr = torch.tensor([0, 1, 2, 3, 4, 6, 5, 7, 9], dtype=torch.int32)  # 6 > 5 at [5..6]
    indices = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 9], dtype=torch.int32)  # 9 out of range
    ok = torch.arange(10, dtype=torch.int32)
    for arr, name in ((indptr, "ip"), (indices, "ix"), (ok, "ok")):
        m = _mapped(arr, tmp_path / f"{name}.npy")
        assert checks._first_decrease(m) == checks._first_decrease(arr)
        assert checks._min_max(m) == checks._min_max(arr)
    m_ip, m_ix = _mapped(indptr, tmp_path / "ip2.npy"), _mapped(indices, tmp_path / "ix2.npy")
    with pytest.raises(ValueError, match=r"indptr\[6\] = 5 < indptr\[5\] = 6"):
        checks.check_csc(m_ip, m_ix, 9)
    m_ok = _mapped(torch.tensor([0, 2, 4, 6, 9], dtype=torch.int32), tmp_path / "ip3.npy")
    with pytest.raises(ValueError, match="found 9"):
        checks.check_csc(m_ok, m_ix, 9)
    spans = [(lo, hi) for p, lo, hi in small_blocks if p == m_ix.data_ptr()]
    assert spans and spans[0] == (0, 4) and spans[-1][1] == 9
