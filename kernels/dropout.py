"""Dropout with a counter-based mask: the same distribution as ``F.dropout``, drawn in parallel.

Each element is kept with probability ``1 - p`` (to within ``2**-32``) and scaled
by ``1 / (1 - p)``; the mask is a hash of the element's index and two seeds that
come from torch's default generator, so ``torch.manual_seed`` and RNG-state
replay (the streaming executor's recomputing backward) reproduce it, on any
number of threads. It is not bit-identical to ``F.dropout``'s stream.

Because the mask is a function of the seeds, nothing of size ``x`` is kept for
backward: the gradient is the same kernel applied to the incoming gradient.
Inside :func:`recompute_dropout`, a dropout *output* that autograd would save
for a later op (the input of the Linear after it) is saved as its input and
seeds instead, and recomputed when backward needs it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels._checks import check_feat
from ngra.kernels.registry import current_backend, lookup, use_backend

__all__ = ["dropout", "recompute_dropout"]


def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True) -> torch.Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    Args:
        x: float32/float64 tensor of any shape.
        p: drop probability in ``[0, 1]``. (default: ``0.5``)
        training: identity when ``False``. (default: ``True``)

    Returns:
        A tensor shaped like ``x`` (``x`` itself when not training or ``p == 0``).
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"dropout probability must be a number in [0, 1]; got {p!r}.")
    x = check_feat(x, "x")
    if not training or p == 0:
        return x
    if p == 1:
        return x * 0
    return _Dropout.apply(x, float(p))


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        ctx.backend = current_backend()
        s1, s2 = (int(s) for s in torch.randint(0, 2**32, (2,), dtype=torch.int64))
        thr = min(round(p * 2**32), 2**32)
        ctx.seeds = (s1, s2, thr, 1.0 / (1.0 - p))
        out, _ = lookup("dropout", x.device)(x.contiguous(), *ctx.seeds)
        if getattr(_state, "recompute", 0):
            _remember(out, x, ctx.seeds, ctx.backend)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        # d out / d x is the same mask and scale: the forward kernel applied to grad
        with use_backend(ctx.backend):
            return lookup("dropout", grad.device)(grad.contiguous(), *ctx.seeds)[0], None


# ------------------------------------------------------------------ recomputed outputs
_state = threading.local()
# storage address of a live dropout output -> (weakref to it, its version, how to remake it)
_LIVE: dict[int, tuple[weakref.ref, int, tuple]] = {}


def _remember(out: torch.Tensor, x: torch.Tensor, seeds: tuple, backend: str) -> None:
    key = out.untyped_storage().data_ptr()

    def forget(ref: weakref.ref, key: int = key) -> None:
        if key in _LIVE and _LIVE[key][0] is ref:
            del _LIVE[key]

    _LIVE[key] = (weakref.ref(out, forget), out._version, (x.detach(), seeds, backend))


class _Remake:
    """A saved dropout output, kept as its input and seeds."""

    __slots__ = ("x", "seeds", "backend", "shape", "stride", "offset", "grad")

    def __init__(self, t: torch.Tensor, x: torch.Tensor, seeds: tuple, backend: str) -> None:
        self.x, self.seeds, self.backend = x, seeds, backend
        self.shape, self.stride, self.offset = t.shape, t.stride(), t.storage_offset()
        self.grad = t.requires_grad

    def value(self) -> torch.Tensor:
        with use_backend(self.backend), torch.no_grad():
            out, _ = lookup("dropout", self.x.device)(self.x.contiguous(), *self.seeds)
        return out.as_strided(self.shape, self.stride, self.offset)


def _pack(t: torch.Tensor) -> Any:
    entry = _LIVE.get(t.untyped_storage().data_ptr()) if t.layout == torch.strided else None
    if entry is None:
        return t
    ref, version, (x, seeds, backend) = entry
    out = ref()
    if out is None or out._version != version or t._version != version or t.requires_grad \
            or out.dtype != t.dtype:
        return t  # gone, modified in place, or part of the graph: save it as usual
    return _Remake(t, x, seeds, backend)


def _unpack(p: Any) -> torch.Tensor:
    return p.value() if isinstance(p, _Remake) else p


@contextlib.contextmanager
def recompute_dropout() -> Iterator[None]:
    """Inside the block, autograd saves :func:`dropout` outputs as their input and seeds.

    A Linear after a dropout saves its input, the dropout output (for the weight's
    gradient): ``N x F`` that lives until backward. In this block that input is
    remade by the dropout kernel when backward reads it (bit-identical, from the
    seeds), so the only copy kept is the dropout's input, which its producer
    usually keeps anyway (the features, or an activation's saved output). Outputs
    that require grad themselves (the input of a trainable layer's dropout) are
    saved as usual: backward would need their graph. The zoo's GNN runs its
    forward in this block.
    """
    _state.recompute = getattr(_state, "recompute", 0) + 1
    try:
        with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack):
            yield
    finally:
        _state.recompute -= 1
