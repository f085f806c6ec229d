"""kernels/cpu/_outputs.py: large kernel outputs reuse a kept block only once nothing
shares it, keep a bounded amount idle, and stay plain where large frees must go back."""

import pytest
import torch

from ngra import memstat
from ngra.kernels import gspmm
from ngra.kernels.cpu import _outputs


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(_outputs, "MIN_BYTES", 1 << 12)
    monkeypatch.setattr(_outputs, "MAX_IDLE_BYTES", 1 << 20)
    monkeypatch.setattr(_outputs, "_blocks", [])
    monkeypatch.setattr(memstat, "mapped_from", lambda: None)


def test_a_block_is_reused_only_when_no_tensor_shares_it(small_blocks):
    a = _outputs.empty((64, 32), torch.float32)
    assert a.shape == (64, 32) and a.is_contiguous() and not a._is_view()
    view = a[3:]  # a view keeps the block busy
    ptr = a.data_ptr()
    del a
    b = _outputs.empty((64, 32), torch.float32)
    assert b.data_ptr() != ptr
    del view
    c = _outputs.empty((64, 32), torch.float32)
    assert c.data_ptr() == ptr
    saved = []

    class Keep(torch.autograd.Function):  # autograd holding the output keeps it busy too
        @staticmethod
        def forward(ctx, x):
            y = _outputs.empty(tuple(x.shape), x.dtype).copy_(x)
            ctx.save_for_backward(y)
            saved.append(y.data_ptr())
            return y.sum()

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return g * torch.ones_like(y)

    del b, c
    loss = Keep.apply(torch.randn(64, 32, requires_grad=True))
    d = _outputs.empty((64, 32), torch.float32)
    assert d.data_ptr() != saved[0]
    loss.backward()


def test_idle_blocks_are_bounded(small_blocks):
    outs = [_outputs.empty((256, 256), torch.float32) for _ in range(3)]  # 256 KiB each
    del outs
    assert _outputs.idle_bytes() == 3 << 18
    big = [_outputs.empty((512, 256), torch.float32) for _ in range(2)]  # 512 KiB each
    assert _outputs.idle_bytes() <= 1 << 20
    del big  # 2 MiB idle now, trimmed at the next call
    keep = _outputs.empty((64, 32), torch.float32)
    assert keep.numel() and _outputs.idle_bytes() <= 1 << 20
    too_big = _outputs.empty((1024, 1024), torch.float32)  # over half the idle bound
    assert all(b.untyped_storage().data_ptr() != too_big.data_ptr() for b in _outputs._blocks)


def test_plain_allocations_where_large_frees_go_back(small_blocks, monkeypatch):
    monkeypatch.setattr(memstat, "mapped_from", lambda: 1 << 20)
    _outputs.empty((64, 32), torch.float32)
    assert _outputs._blocks == []


def test_gspmm_outputs_in_reused_blocks_are_right(small_blocks):
    """Outputs written over a reused block equal fresh ones: every row is written."""
    indptr = torch.tensor([0, 2, 2, 5])
    indices = torch.tensor([0, 1, 2, 0, 1])
    x = torch.randn(3, 600)
    want = [gspmm(indptr, indices, x, reduce=r) for r in ("sum", "mean")]
    for _ in range(3):
        for r, w in zip(("sum", "mean"), want):
            out = gspmm(indptr, indices, x, reduce=r)
            torch.testing.assert_close(out, w)
            out.fill_(float("nan"))  # garbage left in the block for the next call
    assert _outputs._blocks
