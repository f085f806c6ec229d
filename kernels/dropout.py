"""Dropout with a counter-based mask: the same distribution as ``F.dropout``, drawn in parallel.

Each element is kept with probability ``1 - p`` (to within ``2**-32``) and scaled
by ``1 / (1 - p)``; the mask is a hash of the element's index and two seeds that
come from torch's default generator, so ``torch.manual_seed`` and RNG-state
replay (the streaming executor's recomputing backward) reproduce it, on any
number of threads. It is not bit-identical to ``F.dropout``'s stream.

Because the mask is a function of the seeds, no mask is stored: backward is the
same kernel applied to the incoming gradient.

Inside ``with dropout_rows(ids):`` a tensor with one row per id draws row ``r``'s
elements from index ``ids[r] * row_size + column`` instead of its flat position: a
process holding some rows of a larger tensor (multi-device training: ``ids`` are the
rows' global vertex ids) draws exactly the mask the whole tensor would get, whatever
rows it holds.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels._checks import check_feat
from ngra.kernels.registry import current_backend, lookup, thread_setting, use_backend

__all__ = ["dropout", "check_p", "draw_seeds", "dropout_rows", "row_base"]

_rows = threading.local()


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


@contextlib.contextmanager
def dropout_rows(ids: torch.Tensor | None) -> Iterator[None]:
    """Draw the masks of ``[len(ids), ...]`` tensors by global row id in the block.

    Args:
        ids: ``[R]`` int64 global row ids of the rows this process holds (``None``:
            flat positions, the default). Tensors with another row count keep flat
            positions.
    """
    if ids is not None:
        ids = torch.as_tensor(ids).to(torch.int64)
        if ids.dim() != 1:
            raise ValueError(f"dropout_rows: ids must be 1-D [rows]; got shape {list(ids.shape)}.")
    with thread_setting(_rows, "ids", ids):
        yield


def row_base(x: torch.Tensor) -> torch.Tensor | None:
    """``[R]`` flat index of each row's first element under :func:`dropout_rows`
    (``ids * row_size``), or ``None`` when ``x`` draws by flat position."""
    ids = getattr(_rows, "ids", None)
    if ids is None or x.dim() == 0 or x.shape[0] != ids.shape[0]:
        return None
    row = x.numel() // x.shape[0] if x.shape[0] else 0
    return (ids.to(x.device) * row).contiguous()


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
        ctx.base = row_base(x)
        return lookup("dropout", x.device)(x.contiguous(), *ctx.seeds, ctx.base)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        # d out / d x is the same mask and scale: the forward kernel applied to grad
        with use_backend(ctx.backend):
            return lookup("dropout", grad.device)(grad.contiguous(), *ctx.seeds, ctx.base), None
