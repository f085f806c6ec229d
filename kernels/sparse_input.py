"""``x @ W.T + b`` over the non-zeros of ``x`` when ``x`` is a mostly-zero input.

Bag-of-words node features are mostly zeros (Planetoid: 1.27% of Cora's 2,708 x 1,433
entries are non-zero, 0.85% of CiteSeer's 3,327 x 3,703), and a GNN's first layer
multiplies them by a weight: as a dense GEMM, almost every multiply-add is by zero
(CiteSeer, 64 outputs: 1.6 GFLOP, 8.5 ms on 2 threads). :func:`linear` sums over the
non-zeros only when ``x``:

* needs no gradient (an input, not an activation), lives on the CPU, is 2-D, contiguous
  and floating point like the weight, and holds at least :data:`MIN_BYTES`;
* looks mostly zero: a strided sample of about 4,096 entries has at most twice
  :data:`MAX_DENSITY` of them non-zero.

One fixed order, whatever the call history or thread count: each output row is summed
alone, over its non-zeros in increasing column order, from zero, then the bias is added
(:mod:`ngra.kernels.ref.sparse_input` spells it out). So evaluating a model twice on the
same input gives the same bits. The first call for a tensor scans it dense, skipping
zeros (``scan_linear``: a tensor used once, a dropout's fresh output, is never copied);
from its second call, when the whole tensor has at most :data:`MAX_DENSITY` of its
entries non-zero, a CSR copy of ``x`` is multiplied instead (``csr_linear``, the same
sums in the same order, reading the non-zeros only; CiteSeer 1.3 ms). The copy and the
CSR of ``x.T`` (for the weight gradient, ``x.T @ grad``) are reused while the tensor lives
and is not modified (its version counter is checked on every call); a tensor found dense
is remembered as dense, so it is not sampled again. Results equal the dense product up to
float rounding (the sums skip the zeros). The weight gradient is outside the guarantee:
torch's ``sparse.mm`` from the CSR of ``x.T`` on reuse, a dense ``grad.T @ x`` at a first
call.
"""

from __future__ import annotations

import threading
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ngra.kernels.registry import lookup

__all__ = ["MAX_DENSITY", "MIN_BYTES", "linear", "sparse_form"]

#: Largest fraction of non-zero entries for which a CSR copy is made.
MAX_DENSITY = 0.05
#: Smallest input (bytes) worth summing over its non-zeros: below it the GEMM is microseconds.
MIN_BYTES = 1 << 20

_lock = threading.Lock()
# id(x) -> (weakref to x, (version, shape, strides), form): one of the markers below, or
# the (csr, csr_t) pair
_forms: dict[int, tuple] = {}
_DENSE = object()  # the sample showed it dense: F.linear
_FIRST = object()  # mostly zero, seen once: scanned this time
_SCAN = object()  # mostly zero by the sample, above MAX_DENSITY in all: scanned every time
_SAMPLE = 4096


def _candidate(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.layout == torch.strided and x.dim() == 2 and x.device.type == "cpu"
            and x.is_contiguous()
            and x.is_floating_point() and x.dtype == weight.dtype and not x.requires_grad
            and x.numel() * x.element_size() >= MIN_BYTES)


def _form(x: torch.Tensor) -> object:
    """What :func:`linear` does with ``x`` as it is now: ``_DENSE``, ``_FIRST`` or
    ``_SCAN`` (scan it), or the ``(csr, csr_t)`` pair to multiply; remembered for ``x``."""
    key, stamp = id(x), (x._version, tuple(x.shape), x.stride())
    with _lock:
        hit = _forms.get(key)
        seen = hit is not None and hit[0]() is x and hit[1] == stamp
        if seen and hit[2] is not _FIRST:
            return hit[2]
    if not seen:
        form = _FIRST if _sample_mostly_zero(x) else _DENSE
    elif int(torch.count_nonzero(x)) <= MAX_DENSITY * x.numel():
        form = _csr_pair(x)
    else:
        form = _SCAN

    def forget(ref: weakref.ref, key: int = key) -> None:
        with _lock:
            if key in _forms and _forms[key][0] is ref:
                del _forms[key]

    with _lock:
        _forms[key] = (weakref.ref(x, forget), stamp, form)
    return form


def sparse_form(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(csr, csr_t)``: CSR copies of ``x`` and ``x.T`` when :func:`linear` multiplies
    them for ``x`` as it is now, else ``None``. The first call for a tensor only remembers
    it and returns ``None``: a tensor used once never pays for the count and the copies,
    one used again (the input features, every epoch) pays once."""
    form = _form(x)
    return form if isinstance(form, tuple) else None


def _sample_mostly_zero(x: torch.Tensor) -> bool:
    """A strided sample of about :data:`_SAMPLE` entries of ``x`` has at most twice
    :data:`MAX_DENSITY` of them non-zero. Dense tensors stop here: an activation read
    twice in one forward (SAGE's two Linears) is a new tensor every call, and counting all
    of it each time cost 15 ms per forward on ego-Twitter."""
    flat = x.reshape(-1)
    sample = flat[:: max(1, flat.numel() // _SAMPLE)]
    return int(torch.count_nonzero(sample)) <= 2 * MAX_DENSITY * sample.numel()


def _csr_pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR tensors of ``x`` and of ``x.T``, both from one ``nonzero`` scan (CiteSeer:
    ~30 ms; ``x.t().to_sparse_csr()`` took 200)."""
    rows, cols = x.nonzero().unbind(1)  # row-major: sorted by row, then column
    values = x[rows, cols]
    n, f = x.shape

    def offsets(ids: torch.Tensor, count: int) -> torch.Tensor:
        out = torch.zeros(count + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(ids, minlength=count), 0, out=out[1:])
        return out

    by_col = torch.sort(cols, stable=True).indices  # rows stay sorted within a column
    with warnings.catch_warnings():  # "sparse CSR tensor support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        csr = torch.sparse_csr_tensor(offsets(rows, n), cols, values, (n, f))
        csr_t = torch.sparse_csr_tensor(offsets(cols, f), rows[by_col], values[by_col], (f, n))
    return csr, csr_t


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, summed over the non-zeros of ``x`` in one fixed order
    where that pays (see the module docstring); ``F.linear`` itself otherwise."""
    if (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)
            and weight.dim() == 2 and weight.shape[1] == x.shape[-1] and _candidate(x, weight)):
        form = _form(x)
        if isinstance(form, tuple):
            return _NonZeroLinear.apply(weight, bias, x, *form)
        if form is not _DENSE:
            return _NonZeroLinear.apply(weight, bias, x, None, None)
    return F.linear(x, weight, bias)


class _NonZeroLinear(torch.autograd.Function):
    """``x @ weight.T + bias`` over the non-zeros of ``x``: from ``csr`` when given, else
    by a scan of ``x``; gradients for the weight and the bias."""

    @staticmethod
    def forward(ctx, weight, bias, x, csr, csr_t):
        wt = weight.detach().t().contiguous()
        if csr is None:
            out = lookup("scan_linear", x.device)(x, wt)
            ctx.save_for_backward(x)
        else:
            out = lookup("csr_linear", x.device)(csr.crow_indices(), csr.col_indices(),
                                                 csr.values(), wt)
            ctx.csr_t = csr_t
        ctx.has_bias = bias is not None
        return out if bias is None else out.add_(bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        gw = gb = None
        if ctx.needs_input_grad[0]:
            if ctx.saved_tensors:
                gw = g.t().mm(ctx.saved_tensors[0])
            else:
                gw = torch.sparse.mm(ctx.csr_t, g.contiguous()).t()
        if ctx.has_bias and ctx.needs_input_grad[1]:
            gb = g.sum(0)
        return gw, gb, None, None, None
