"""Dropout by global row ids (``kernels.dropout_rows``): a process holding some rows of a
tensor draws exactly the whole tensor's mask on them, on every backend, forward and backward,
and inside ``dropout_linear``."""

from __future__ import annotations

import sys

import pytest
import torch

from ngra.kernels import dropout, dropout_linear, dropout_rows, use_backend

BACKENDS = ("ref", "cpu", "gpu")  # gpu: Triton kernels, in the interpreter without CUDA


def _rows(n: int) -> torch.Tensor:
    return torch.randperm(n)[: n // 2 + 1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(37, 5), (64, 3, 4), (9, 1)])
def test_rows_draw_the_whole_tensors_mask(backend, shape):
    x = torch.randn(shape, dtype=torch.float64)
    rows = _rows(shape[0])
    with use_backend(backend):
        torch.manual_seed(3)
        whole = dropout(x, 0.4)
        torch.manual_seed(3)
        part = x[rows].clone().requires_grad_()
        with dropout_rows(rows):
            got = dropout(part, 0.4)
        got.backward(torch.ones_like(got))
    assert torch.equal(got.detach(), whole[rows])
    assert torch.equal(part.grad, (whole[rows] != 0).double() / 0.6)


def test_identity_ids_change_nothing():
    x = torch.randn(50, 7)
    torch.manual_seed(1)
    a = dropout(x, 0.3)
    torch.manual_seed(1)
    with dropout_rows(torch.arange(50)):
        b = dropout(x, 0.3)
    assert torch.equal(a, b)


def test_other_row_counts_keep_flat_positions():
    x = torch.randn(20, 4)
    torch.manual_seed(2)
    a = dropout(x, 0.5)
    torch.manual_seed(2)
    with dropout_rows(torch.arange(7)):
        b = dropout(x, 0.5)
    assert torch.equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_linear_by_rows(backend, monkeypatch):
    monkeypatch.setattr(sys.modules["ngra.kernels.dropout_linear"], "BLOCK_BYTES",
                        7 * 13 * 4)  # several row blocks
    x = torch.randn(61, 13)
    w1, w2 = torch.randn(5, 13, requires_grad=True), torch.randn(3, 13, requires_grad=True)
    rows = _rows(61)
    with use_backend(backend):
        torch.manual_seed(4)
        full = dropout_linear(x, [w1, w2], None, 0.5)
        torch.manual_seed(4)
        part = x[rows].clone().requires_grad_()
        with dropout_rows(rows):
            got = dropout_linear(part, [w1, w2], None, 0.5)
        (got[0].sum() + got[1].pow(2).sum()).backward()
    for g, f in zip(got, full):
        torch.testing.assert_close(g, f[rows])
    torch.manual_seed(4)
    d = dropout(x, 0.5)[rows].detach().clone().requires_grad_()
    (torch.nn.functional.linear(d, w1).sum() + torch.nn.functional.linear(d, w2).pow(2).sum()
     ).backward()
    torch.testing.assert_close(part.grad, d.grad * (d != 0) / 0.5)  # mask * scale * dL/dd


def test_bad_ids():
    with pytest.raises(ValueError, match="1-D"):
        with dropout_rows(torch.zeros(2, 2, dtype=torch.long)):
            pass
