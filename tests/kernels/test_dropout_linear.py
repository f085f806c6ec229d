"""dropout_linear == Linear(s) of ngra.kernels.dropout(x) with the same seeds, forward and
backward, on every backend; the packed CPU masks == the reference's; clear errors."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from ngra.kernels import dropout, dropout_linear, lookup, use_backend
from ngra.kernels.dropout import draw_seeds

pytestmark = pytest.mark.usefixtures("parallel_kernels")
DL = sys.modules["ngra.kernels.dropout_linear"]


def _params(f_in: int, outs: list[int], bias: list[bool], dtype):
    ws = [torch.randn(o, f_in, dtype=dtype, requires_grad=True) for o in outs]
    bs = [torch.randn(o, dtype=dtype, requires_grad=True) if b else None
          for o, b in zip(outs, bias)]
    return ws, bs


def _grads(outs, leaves, seed=1):
    gen = torch.Generator().manual_seed(seed)
    gs = [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outs]
    live = [t for t in leaves if t is not None]
    return torch.autograd.grad(outs, live, gs)


@pytest.mark.parametrize("backend", ["ref", "cpu", "gpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n,f_in,outs,bias,x_grad", [
    (300, 37, [5], [True], False),          # 300 * 37 elements: not a multiple of 8
    (257, 64, [8, 3], [True, False], True),  # two Linears, one mask; input gradient
    (1, 3, [2], [False], True),
    (0, 16, [4], [True], True),             # no rows
])
def test_matches_linear_of_dropout(backend, dtype, n, f_in, outs, bias, x_grad, monkeypatch):
    # ~40-row blocks: several blocks, the last one partial
    monkeypatch.setattr(DL, "BLOCK_BYTES", 40 * f_in * torch.finfo(dtype).bits // 8 + 3)
    x = torch.randn(n, f_in, dtype=dtype, requires_grad=x_grad)
    ws, bs = _params(f_in, outs, bias, dtype)
    with use_backend(backend):
        torch.manual_seed(7)
        d = dropout(x, 0.4)
        want = [F.linear(d, w, b) for w, b in zip(ws, bs)]
        torch.manual_seed(7)
        got = dropout_linear(x, ws, bs, 0.4)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    leaves = ([x] if x_grad else []) + ws + bs
    for g, w in zip(_grads(got, leaves), _grads(want, leaves)):
        torch.testing.assert_close(g, w)


def test_backends_draw_the_same_mask():
    x = torch.randn(1001, 13, dtype=torch.float64)
    w = [torch.randn(6, 13, dtype=torch.float64)]
    res = []
    for backend in ("ref", "cpu", "gpu"):
        torch.manual_seed(3)
        with use_backend(backend):
            res.append(dropout_linear(x, w, None, 0.5)[0])
    torch.testing.assert_close(res[0], res[1])
    torch.testing.assert_close(res[0], res[2])


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 200_003])
def test_cpu_packed_mask_equals_reference(n):
    x = torch.rand(n) + 0.5
    seeds = draw_seeds(0.3)
    with use_backend("ref"):
        ref_out = torch.empty_like(x)
        ref_mask = lookup("dropout_mask", x.device)(x, *seeds, ref_out)
    with use_backend("cpu"):
        cpu_out = torch.empty_like(x)
        bits = lookup("dropout_mask", x.device)(x, *seeds, cpu_out)
        assert bits.nbytes == (n + 7) // 8  # one bit per element
        again = lookup("dropout_apply", x.device)(x, bits, seeds[3], torch.empty_like(x))
    assert torch.equal(cpu_out, ref_out)
    assert torch.equal(again, ref_out)
    assert torch.equal(ref_out != 0, ref_mask)


def test_identity_cases():
    x = torch.randn(20, 6)
    w, b = torch.randn(3, 6), torch.randn(3)
    torch.testing.assert_close(dropout_linear(x, [w], [b], 0.0)[0], F.linear(x, w, b))
    torch.testing.assert_close(dropout_linear(x, [w], [b], 0.5, training=False)[0],
                               F.linear(x, w, b))
    torch.testing.assert_close(dropout_linear(x, [w], [b], 1.0)[0], b.expand(20, 3))


def test_keeps_no_dropped_copy():
    """Autograd holds x and the weights, nothing of x's size but x itself."""
    x = torch.randn(5000, 100)
    w = torch.randn(4, 100, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        dropout_linear(x, [w], None, 0.5)
    big = [t for t in saved if t.numel() >= x.numel()]
    assert len(big) == 1 and big[0].data_ptr() == x.data_ptr()


@pytest.mark.parametrize("args,match", [
    ((torch.randn(5, 4), [torch.randn(3, 5)], None, 0.5), r"weights\[0\] must be \[F_out, 4\]"),
    ((torch.randn(5, 4), [torch.randn(3, 4, dtype=torch.float64)], None, 0.5),
     r"weights\[0\] must be torch.float32"),
    ((torch.randn(5, 4), [torch.randn(3, 4)], [torch.randn(2)], 0.5), r"biases\[0\] must be None or \[3\]"),
    ((torch.randn(5, 4), [torch.randn(3, 4)], [None, None], 0.5), "one entry .* per weight"),
    ((torch.randn(5, 4), [], None, 0.5), "at least one weight"),
    ((torch.randn(5, 4), [torch.randn(3, 4)], None, 1.5), r"probability must be a number in \[0, 1\]"),
    ((torch.randn(5), [torch.randn(3, 5)], None, 0.5), "x must have shape"),
    ((torch.randn(2, 5, 4), [torch.randn(3, 4)], None, 0.5), r"x must be \[N, F_in\]"),
])
def test_bad_input_errors(args, match):
    with pytest.raises((ValueError, TypeError), match=match):
        dropout_linear(*args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_matches_cpu(monkeypatch):
    # the gpu kernels draw their seeds from the CUDA generator (seed_device); drawn on the
    # host like the cpu kernels' here, both backends hash one mask
    monkeypatch.setattr(DL, "seed_device", lambda device, op="dropout": None)
    x = torch.randn(3001, 40, dtype=torch.float64)
    ws, bs = _params(40, [6, 2], [True, False], torch.float64)
    res = []
    for backend, dev in (("cpu", "cpu"), ("gpu", "cuda")):
        xd = x.to(dev).requires_grad_()
        wd = [w.detach().to(dev).requires_grad_() for w in ws]
        bd = [None if b is None else b.detach().to(dev).requires_grad_() for b in bs]
        torch.manual_seed(5)
        with use_backend(backend):
            outs = dropout_linear(xd, wd, bd, 0.3)
            gr = _grads(outs, [xd] + wd + bd)
        res.append([t.cpu() for t in outs + list(gr)])
    for a, b in zip(*res):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("backend", ["ref", "cpu", "gpu"])
@pytest.mark.parametrize("block_bytes", [None, 1024])  # one block; many blocks
def test_replaying_masks_reproduces_outputs_and_gradients(backend, block_bytes, monkeypatch):
    """dropout_linear(..., masks=dropout_masks(out)) is the same dropout again: the same
    outputs and gradients (x, weights, biases), and it draws no random numbers."""
    if block_bytes is not None:
        monkeypatch.setattr(DL, "BLOCK_BYTES", block_bytes)
    x = torch.randn(300, 37, dtype=torch.float64, requires_grad=True)
    ws, bs = _params(37, [5, 3], [True, False], torch.float64)
    with use_backend(backend):
        first = dropout_linear(x, ws, bs, 0.4)
        masks = DL.dropout_masks(first[0])
        assert masks is not None and masks.shape == (300, 37) and masks.p == 0.4
        state = torch.get_rng_state()
        again = dropout_linear(x, ws, bs, 0.4, masks=masks)
        assert torch.equal(torch.get_rng_state(), state)
        for a, b in zip(first, again):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        leaves = [x, *ws, *bs]
        for a, b in zip(_grads(first, leaves), _grads(again, leaves)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_masks_of_other_tensors_and_mismatched_replays():
    x = torch.randn(20, 6)
    ws, bs = _params(6, [4], [True], torch.float32)
    assert DL.dropout_masks(torch.randn(3, requires_grad=True) * 2) is None
    with torch.no_grad():
        assert DL.dropout_masks(dropout_linear(x, ws, bs, 0.5)[0]) is None
    masks = DL.dropout_masks(dropout_linear(x, ws, bs, 0.5)[0])
    with pytest.raises(ValueError, match="drawn for x of shape"):
        dropout_linear(torch.randn(21, 6), ws, bs, 0.5, masks=masks)
    with pytest.raises(ValueError, match="p=0.5"):
        dropout_linear(x, ws, bs, 0.3, masks=masks)
    with pytest.raises(TypeError, match="DropoutMasks"):
        dropout_linear(x, ws, bs, 0.5, masks=[1, 2])


@pytest.mark.parametrize("x_grad", [False, True])
def test_no_dropout_on_a_mapped_x_streams_blocks_and_equals_linears(tmp_path, monkeypatch,
                                                                    x_grad):
    """p == 0 on features mapped from disk: the block path (each block's pages released
    after reading), equal to plain Linears forward and backward."""
    import numpy as np

    from ngra.mapped import is_mapped, register_mapped

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(301, 24, generator=gen)
    np.save(tmp_path / "x.npy", x.numpy())
    arr = np.load(tmp_path / "x.npy", mmap_mode="c")
    register_mapped(arr)
    xm = torch.from_numpy(arr).requires_grad_(x_grad)
    assert is_mapped(xm)
    monkeypatch.setattr(DL, "BLOCK_BYTES", 24 * 4 * 50)  # 7 blocks
    released = []
    monkeypatch.setattr(DL, "release_mapped", lambda t, lo, hi: released.append((lo, hi)))
    ws, bs = _params(24, [6, 3], [True, False], torch.float32)
    outs = dropout_linear(xm, ws, bs, p=0.0)
    assert outs[0].grad_fn is not None and "StreamedLinear" in type(outs[0].grad_fn).__name__
    xr = x.clone().requires_grad_(x_grad)
    want = [F.linear(xr, w, b) for w, b in zip(ws, bs)]
    for o, w in zip(outs, want):
        torch.testing.assert_close(o, w)
    leaves = [xm if x_grad else None, *ws, bs[0]]
    got = _grads(outs, leaves)
    ref = _grads(want, [xr if x_grad else None, *ws, bs[0]])
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r)
    assert len(released) == 14  # every block once forward, once for the weight gradients
