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


def test_gpu_backend_raises_clearly_on_cpu_tensors(monkeypatch):
    import ngra.kernels.gpu.util as gpu_util

    monkeypatch.setattr(gpu_util, "INTERPRET", False)  # as outside Triton's interpreter
    indptr, indices = torch.tensor([0, 1]), torch.tensor([0])
    with use_backend("gpu"), pytest.raises(RuntimeError, match="needs CUDA tensors"):
        K.gspmm(indptr, indices, torch.randn(1, 2))


def test_import_does_not_load_numba_or_triton():
    code = ("import sys, ngra, ngra.kernels; "
            "assert 'numba' not in sys.modules, 'numba imported'; "
            "assert 'triton' not in sys.modules, 'triton imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_without_triton_ngra_runs_on_cpu_and_gpu_says_why():
    """triton absent (blocked from import): ngra imports, trains on CPU, and asking for the
    gpu backend names the missing package and the extra that installs it."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, ngra\n"
        "from ngra import kernels as K\n"
        "ip, ix = torch.tensor([0, 1, 2]), torch.tensor([1, 0])\n"
        "x = torch.randn(2, 3, requires_grad=True)\n"
        "K.gspmm(ip, ix, x).sum().backward()\n"
        "assert 'gpu' not in K.available('gspmm')\n"
        "try:\n"
        "    with K.use_backend('gpu'):\n"
        "        K.gspmm(ip, ix, x)\n"
        "except NotImplementedError as e:\n"
        "    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert "triton is not importable" in r.stdout and "ngra[gpu]" in r.stdout, r.stdout


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
