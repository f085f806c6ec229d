"""Dropout with a counter-based mask: the same distribution as ``F.dropout``, drawn in parallel.

Each element is kept with probability ``1 - p`` (to within ``2**-32``) and scaled
by ``1 / (1 - p)``; the mask is a hash of the element's index and two seeds that
come from torch's default generator, so ``torch.manual_seed`` and RNG-state
replay (the streaming executor's recomputing backward) reproduce it, on any
number of threads. It is not bit-identical to ``F.dropout``'s stream.

Because the mask is a function of the seeds, no mask is stored: backward is the
same kernel applied to the incoming gradient.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels._checks import check_feat
from ngra.kernels.registry import current_backend, lookup, use_backend

__all__ = ["dropout", "check_p", "draw_seeds"]


def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True) -> torch.Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    Args:
        x: float32/float64 tensor of any shape.
        p: drop probability in ``[0, 1]``. (default: ``0.5``)
        training: identity when ``False``. (default: ``True``)

    Returns:
        A tensor shaped like ``x`` (``x`` itself when not training or ``p == 0``).
    """
    check_p(p)
    x = check_feat(x, "x")
    if not training or p == 0:
        return x
    if p == 1:
        return x * 0
    return _Dropout.apply(x, float(p))


def check_p(p: float) -> None:
    """Raise ``ValueError`` unless ``p`` is a drop probability in ``[0, 1]``."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"dropout probability must be a number in [0, 1]; got {p!r}.")


def draw_seeds(p: float) -> tuple[int, int, int, float]:
    """``(s1, s2, thr, scale)`` for the ``dropout`` kernels: two seeds from torch's
    default generator, the keep threshold and ``1 / (1 - p)``, for ``0 < p < 1``.

    Element ``i`` of a flattened tensor draws from ``(i + s1) mod 2**32``: a block that
    starts at flat index ``k`` gets the whole tensor's mask with ``s1 + k``.
    """
    s1, s2 = (int(s) for s in torch.randint(0, 2**32, (2,), dtype=torch.int64))
    return s1, s2, min(round(p * 2**32), 2**32), 1.0 / (1.0 - p)


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        ctx.backend = current_backend()
        ctx.seeds = draw_seeds(p)
        return lookup("dropout", x.device)(x.contiguous(), *ctx.seeds)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        # d out / d x is the same mask and scale: the forward kernel applied to grad
        with use_backend(ctx.backend):
            return lookup("dropout", grad.device)(grad.contiguous(), *ctx.seeds), None
