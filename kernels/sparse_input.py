"""``x @ W.T + b`` from a sparse copy of ``x`` when ``x`` is a mostly-zero input.

Bag-of-words node features are mostly zeros (Planetoid: 1.27% of Cora's 2,708 x 1,433
entries are non-zero, 0.85% of CiteSeer's 3,327 x 3,703), and a GNN's first layer
multiplies them by a weight: as a dense GEMM, almost every multiply-add is by zero
(CiteSeer, 64 outputs: 1.6 GFLOP, 8.5 ms on 2 threads). :func:`linear` multiplies a
CSR copy of ``x`` instead (``torch.sparse.mm``; CiteSeer 1.3 ms), when ``x``:

* needs no gradient (an input, not an activation), lives on the CPU, is 2-D, contiguous
  and floating point like the weight, and holds at least :data:`MIN_BYTES`;
* has at most :data:`MAX_DENSITY` of its entries non-zero (counted once, after a
  strided sample has not already shown it dense).

The CSR copy and the CSR of ``x.T`` (for the weight gradient, ``x.T @ grad``) are made
at a tensor's second use (the first runs dense: a tensor used once is never copied) and
reused while the tensor lives and is not modified (its version counter is checked on
every call); a dense tensor is remembered as dense, so the count is not taken again.
Results equal the dense product up to float rounding (the sums run over non-zeros only,
in another order).
"""

from __future__ import annotations

import threading
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

__all__ = ["MAX_DENSITY", "MIN_BYTES", "linear", "sparse_form"]

#: Largest fraction of non-zero entries for which the sparse product is used.
MAX_DENSITY = 0.05
#: Smallest input (bytes) worth a sparse copy: below it the dense GEMM is microseconds.
MIN_BYTES = 1 << 20

_lock = threading.Lock()
# id(x) -> (weakref to x, (version, shape, strides), (csr, csr_t) or None or _FIRST)
_forms: dict[int, tuple] = {}
_FIRST = object()  # seen once: dense this time
_SAMPLE = 4096


def _candidate(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.layout == torch.strided and x.dim() == 2 and x.device.type == "cpu"
            and x.is_contiguous()
            and x.is_floating_point() and x.dtype == weight.dtype and not x.requires_grad
            and x.numel() * x.element_size() >= MIN_BYTES)


def sparse_form(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(csr, csr_t)``: CSR copies of ``x`` and ``x.T`` when at most :data:`MAX_DENSITY`
    of ``x`` is non-zero, else ``None``; remembered for ``x`` as it is now. The first call
    for a tensor only remembers it and returns ``None``: a tensor used once (a dropout's
    fresh output) never pays for the count and the copies, one used again (the input
    features, every epoch) pays once."""
    key, stamp = id(x), (x._version, tuple(x.shape), x.stride())
    with _lock:
        hit = _forms.get(key)
        seen = hit is not None and hit[0]() is x and hit[1] == stamp
        if seen and hit[2] is not _FIRST:
            return hit[2]
    if not seen:
        form = _FIRST
    elif _mostly_zero(x):
        form = _csr_pair(x)
    else:
        form = None

    def forget(ref: weakref.ref, key: int = key) -> None:
        with _lock:
            if key in _forms and _forms[key][0] is ref:
                del _forms[key]

    with _lock:
        _forms[key] = (weakref.ref(x, forget), stamp, form)
    return None if form is _FIRST else form


def _mostly_zero(x: torch.Tensor) -> bool:
    """At most :data:`MAX_DENSITY` of ``x`` non-zero. A strided sample of about
    :data:`_SAMPLE` entries rejects dense tensors first: an activation read twice in one
    forward (SAGE's two Linears) is a new tensor every call, and counting all of it each
    time cost 15 ms per forward on ego-Twitter."""
    flat = x.reshape(-1)
    sample = flat[:: max(1, flat.numel() // _SAMPLE)]
    if int(torch.count_nonzero(sample)) > 2 * MAX_DENSITY * sample.numel():
        return False
    return int(torch.count_nonzero(x)) <= MAX_DENSITY * x.numel()


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
    """``F.linear(x, weight, bias)``, through a sparse copy of ``x`` where that pays (see
    the module docstring); ``F.linear`` itself otherwise."""
    if isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and _candidate(x, weight):
        form = sparse_form(x)
        if form is not None and weight.dim() == 2 and weight.shape[1] == x.shape[1]:
            return _SparseLinear.apply(weight, bias, *form)
    return F.linear(x, weight, bias)


class _SparseLinear(torch.autograd.Function):
    """``csr @ weight.T + bias``; gradients for the weight (``(csr_t @ g).T``) and bias."""

    @staticmethod
    def forward(ctx, weight, bias, csr, csr_t):
        ctx.csr_t = csr_t
        ctx.has_bias = bias is not None
        out = torch.sparse.mm(csr, weight.t())
        return out if bias is None else out.add_(bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        gw = gb = None
        if ctx.needs_input_grad[0]:
            gw = torch.sparse.mm(ctx.csr_t, g.contiguous()).t()
        if ctx.has_bias and ctx.needs_input_grad[1]:
            gb = g.sum(0)
        return gw, gb, None, None
