"""Backend plumbing: every op on every backend, optional backends never break import."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import ngra.kernels as K
from ngra.kernels import available, lookup, use_backend

OPS = [
    "gspmm",
    "gspmm_backward",
    "gspmm_arg_backward",
    "gsddmm",
    "edge_softmax",
    "edge_softmax_backward",
    "segment_reduce",
    "segment_reduce_backward",
    "transpose_csc",
]


@pytest.mark.parametrize("op", OPS)
def test_every_op_has_every_backend(op):
    assert set(available(op)) == {"ref", "cpu", "gpu"}


def test_auto_picks_numba_on_cpu_tensors():
    import ngra.kernels.cpu.gspmm as cpu_gspmm

    with use_backend("auto"):
        assert lookup("gspmm", "cpu") is cpu_gspmm.gspmm


def test_public_api():
    for name in (
        "gspmm",
        "gsddmm",
        "edge_softmax",
        "segment_reduce",
        "transpose_csc",
        "register",
        "lookup",
        "use_backend",
        "available",
    ):
        assert name in K.__all__ and callable(getattr(K, name))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_gpu_backend_raises_clearly_on_cpu_tensors():
    indptr, indices = torch.tensor([0, 1]), torch.tensor([0])
    with use_backend("gpu"), pytest.raises(RuntimeError, match="needs CUDA tensors"):
        K.gspmm(indptr, indices, torch.randn(1, 2))


def test_import_does_not_load_numba():
    code = "import sys, ngra.kernels; assert 'numba' not in sys.modules, 'numba imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_matches_ref():
    indptr, indices = torch.tensor([0, 2, 2, 5]), torch.tensor([0, 1, 1, 2, 0])
    x, w = torch.randn(3, 2, 4), torch.randn(5, 2)
    for reduce in ("sum", "mean", "max", "min"):
        with use_backend("ref"):
            ref = K.gspmm(indptr, indices, x, w, reduce=reduce)
        out = K.gspmm(indptr.cuda(), indices.cuda(), x.cuda(), w.cuda(), reduce=reduce)
        torch.testing.assert_close(out.cpu(), ref)
