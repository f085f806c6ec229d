"""Link decoders: scores against a plain-torch reference, chunked == unchunked, forward
and backward, and errors that name the input."""

from __future__ import annotations

import pytest
import torch

from ngra.models import DistMultDecoder, DotDecoder, HadamardMLPDecoder


def _reference(dec, z, pairs, rel):
    """Plain torch on all pairs at once."""
    s, d = z[pairs[0]], z[pairs[1]]
    if isinstance(dec, DotDecoder):
        return (s * d).sum(-1)
    if isinstance(dec, DistMultDecoder):
        return (s * dec.relations[rel] * d).sum(-1)
    h = s * d
    for lin in dec.lins[:-1]:
        h = torch.relu(lin(h))
    return dec.lins[-1](h).squeeze(-1)


def _decoders():
    return [DotDecoder(chunk=7), HadamardMLPDecoder(8, 16, layers=3, chunk=7),
            DistMultDecoder(8, num_relations=3, chunk=7)]


@pytest.mark.parametrize("dec", _decoders(), ids=lambda d: type(d).__name__)
def test_chunked_equals_reference_forward_and_backward(dec):
    z = torch.randn(20, 8, dtype=torch.float64)
    dec = dec.double()
    pairs = torch.randint(0, 20, (2, 50))
    rel = torch.randint(0, 3, (50,)) if isinstance(dec, DistMultDecoder) else None
    weight = torch.randn(50, dtype=torch.float64)

    def grads(fn):
        zz = z.clone().requires_grad_()
        dec.zero_grad()
        (fn(zz) * weight).sum().backward()
        return zz.grad, [p.grad.clone() for p in dec.parameters()]

    ref_z, ref_p = grads(lambda zz: _reference(dec, zz, pairs, rel))
    got_z, got_p = grads(lambda zz: dec(zz, pairs, rel))
    torch.testing.assert_close(got_z, ref_z)
    for a, b in zip(got_p, ref_p):
        torch.testing.assert_close(a, b)
    with torch.no_grad():
        torch.testing.assert_close(dec(z, pairs, rel), _reference(dec, z, pairs, rel))


def test_dropout_replays_its_mask_under_checkpointing():
    dec = HadamardMLPDecoder(4, 8, dropout=0.5, chunk=3).train()
    z = torch.randn(10, 4, requires_grad=True)
    pairs = torch.randint(0, 10, (2, 12))
    torch.manual_seed(0)
    chunked = dec(z, pairs)
    g_chunked, = torch.autograd.grad(chunked.sum(), z)
    dec.chunk = 1 << 16
    torch.manual_seed(0)
    whole = torch.cat([dec(z, pairs[:, i:i + 3]) for i in range(0, 12, 3)])
    g_whole, = torch.autograd.grad(whole.sum(), z)
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(g_chunked, g_whole)


def test_eval_never_builds_all_pairs():
    """Under no_grad each chunk's rows are freed before the next: the largest
    index_select output is [chunk, F]."""
    sizes = []
    real = torch.Tensor.index_select

    def spy(self, dim, index):
        out = real(self, dim, index)
        sizes.append(out.shape[0])
        return out

    dec = HadamardMLPDecoder(4, 4, chunk=100)
    z = torch.randn(50, 4)
    torch.Tensor.index_select = spy
    try:
        with torch.no_grad():
            out = dec(z, torch.randint(0, 50, (2, 1000)))
    finally:
        torch.Tensor.index_select = real
    assert out.shape == (1000,) and max(sizes) == 100


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_dot_scores_make_no_per_pair_rows(backend):
    """The dot decoder's forward and backward make no tensor of ``P x F`` elements (nor
    half of one): the pairs' CSC, g-SDDMM and g-SpMM; equal to gathering the rows."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from ngra.kernels import use_backend

    n, f, p = 300, 16, 5000
    largest = []

    class Sizes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    largest.append(t.numel())
            return out

    z = torch.randn(n, f, dtype=torch.float64, requires_grad=True)
    pairs = torch.randint(0, n, (2, p))
    w = torch.randn(p, dtype=torch.float64)
    with use_backend(backend), Sizes():
        got = DotDecoder()(z, pairs)
        (g,) = torch.autograd.grad((got * w).sum(), z)
    if backend != "ref":  # the reference kernels gather rows: they are the specification
        assert max(largest) < p * f // 2, max(largest)
    zz = z.detach().requires_grad_()
    want = (zz[pairs[0]] * zz[pairs[1]]).sum(-1)
    (g_want,) = torch.autograd.grad((want * w).sum(), zz)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(g, g_want)
    assert DotDecoder()(z, pairs[:, :0]).shape == (0,)


def test_errors_name_the_input():
    z = torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"\[2, P\] integer.*\[3, 2\].*pairs.t\(\)"):
        DotDecoder()(z, torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 7\]; z has 5 rows"):
        DotDecoder()(z, torch.tensor([[0, 7], [1, 2]]))
    with pytest.raises(ValueError, match=r"rel must be \[2\] relation ids.*got None"):
        DistMultDecoder(4, 2)(z, torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(ValueError, match=r"\[0, num_relations=2\)"):
        DistMultDecoder(4, 2)(z, torch.tensor([[0, 1], [1, 2]]), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="untyped"):
        DotDecoder()(z, torch.tensor([[0], [1]]), torch.tensor([0]))


@pytest.mark.parametrize("dec", _decoders(), ids=lambda d: type(d).__name__)
def test_bce_sum_equals_the_loss_of_the_scores(dec):
    """A decoder's training-loss sum (fused for the dot decoder) == binary cross-entropy
    of its scores, forward and backward; empty sets count 0."""
    z = torch.randn(30, 8, dtype=torch.float64)
    dec = dec.double()
    pos, neg = torch.randint(0, 30, (2, 40)), torch.randint(0, 30, (2, 25))
    typed = isinstance(dec, DistMultDecoder)
    pr = torch.randint(0, 3, (40,)) if typed else None
    nr = torch.randint(0, 3, (25,)) if typed else None

    def grads(fn):
        zz = z.clone().requires_grad_()
        dec.zero_grad()
        out = fn(zz)
        out.backward()
        return out.detach(), zz.grad

    got = grads(lambda zz: dec.bce_sum(zz, pos, neg, pr, nr))
    want = grads(lambda zz: torch.nn.functional.binary_cross_entropy_with_logits(
        torch.cat([dec(zz, pos, pr), dec(zz, neg, nr)]),
        torch.cat([torch.ones(40), torch.zeros(25)]).double(), reduction="sum"))
    torch.testing.assert_close(got, want)
    empty = torch.zeros(2, 0, dtype=torch.long)
    zz = z.clone().requires_grad_()
    zero = dec.bce_sum(zz, empty, empty, pr[:0] if typed else None, nr[:0] if typed else None)
    assert float(zero.detach()) == 0.0 and zero.requires_grad


def test_dot_decoder_on_pairs_grouped_by_destination():
    """Pairs already grouped by destination skip the sort (PairCSC.inverse is None) and
    score the same, forward and backward."""
    from ngra.models.decoders import PairCSC

    z = torch.randn(40, 5, dtype=torch.float64)
    pairs = torch.randint(0, 40, (2, 300))
    grouped = pairs[:, torch.argsort(pairs[1], stable=True)]
    assert PairCSC(grouped, 40).inverse is None and PairCSC(pairs, 40).inverse is not None
    for p in (pairs, grouped):
        zz = z.clone().requires_grad_()
        got = DotDecoder()(zz, p)
        (g,) = torch.autograd.grad(got.sum(), zz)
        zr = z.clone().requires_grad_()
        want = (zr[p[0]] * zr[p[1]]).sum(-1)
        (gr,) = torch.autograd.grad(want.sum(), zr)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(g, gr)
