"""Dropout fused into the Linears that read its output: no dropped copy of ``x`` ever exists.

``dropout_linear(x, [W1, W2], [b1, None], p)`` is ``[F.linear(d, W1, b1), F.linear(d, W2)]``
with ``d = ngra.kernels.dropout(x, p)``, the same mask for every Linear. ``d`` is made a
block of rows at a time into a reused workspace, each block consumed by the matrix
products, in forward and again for the weight gradients in backward.
Autograd then saves ``x`` (which exists anyway) instead of ``d``: a GNN's first layer
reads an ``N x F_in`` input, the largest vertex tensor of many models (PubMed:
19,717 x 500, 39 MB; this also spares page-faulting a fresh buffer of that size in
every step).

The mask is the one :func:`ngra.kernels.dropout` draws for the same generator state:
a block starting at flat index ``k`` takes seed ``s1 + k`` (see
:func:`ngra.kernels.dropout.draw_seeds`). Forward keeps each block's mask (the
``dropout_mask`` op; on the CPU packed bits, 1/32 of the dropped copy), so backward
applies it (``dropout_apply``) instead of hashing every element again. An ``x`` memory-
mapped from the on-disk store has each block's pages dropped once read
(:func:`ngra.mapped.release_mapped`), so it streams from disk at one block of RSS;
without dropout (``p == 0``) such an ``x`` still goes a block at a time, forward and
for the weight gradients (plain Linears would read it whole, and autograd keep it).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.checks import check_feat
from ngra.kernels.dropout import check_p, draw_seeds, row_base, seed_device
from ngra.kernels.registry import current_backend, lookup, use_backend
from ngra.mapped import is_mapped, release_mapped

__all__ = ["DropoutMasks", "dropout_linear", "dropout_masks"]

#: Bytes of ``x`` per row block, and of the per-thread workspace that holds a dropped
#: block. Few large blocks (3 on PubMed's input): each block pays a thread-pool dispatch
#: for its mask and for its GEMMs, and 1-4 MiB blocks made a PubMed GAT step slower in
#: development timings.
BLOCK_BYTES = 1 << 24
_M32 = 0xFFFFFFFF


def dropout_linear(x: torch.Tensor, weights: Sequence[torch.Tensor],
                   biases: Sequence[torch.Tensor | None] | None = None, p: float = 0.5,
                   training: bool = True, masks: DropoutMasks | None = None) -> list[torch.Tensor]:
    """``[dropout(x, p) @ W.T + b for W, b in zip(weights, biases)]``, one mask for all.

    Args:
        x: ``[N, F_in]`` float32/float64.
        weights: one or more ``[F_out_i, F_in]`` tensors, same dtype and device as ``x``.
        biases: ``[F_out_i]`` tensors or ``None`` per weight (default: no biases).
        p: drop probability in ``[0, 1]``. (default: ``0.5``)
        training: plain Linears when ``False``. (default: ``True``)
        masks: replay the dropout of an earlier call on this ``x`` and ``p`` (its
            :func:`dropout_masks`) instead of drawing a new one: no random numbers, no
            hashing, the same outputs for the same weights. (default: draw)

    Returns:
        One ``[N, F_out_i]`` tensor per weight.
    """
    check_p(p)
    x = check_feat(x, "x", min_dim=2)
    weights = list(weights)
    biases = [None] * len(weights) if biases is None else list(biases)
    _check(x, weights, biases)
    if not training or p == 0:
        if is_mapped(x) and torch.is_grad_enabled():  # x on disk: one block resident
            return list(_StreamedLinear.apply(x, len(weights), *weights, *biases))
        return [torch.nn.functional.linear(x, w, b) for w, b in zip(weights, biases)]
    if p == 1:
        return [torch.nn.functional.linear(x * 0, w, b) for w, b in zip(weights, biases)]
    if masks is not None:
        if not isinstance(masks, DropoutMasks):
            raise TypeError(f"masks must be the DropoutMasks of an earlier dropout_linear "
                            f"(ngra.kernels.dropout_masks); got {type(masks).__name__}.")
        if masks.shape != tuple(x.shape) or masks.p != float(p):
            raise ValueError(f"masks were drawn for x of shape {list(masks.shape)} and "
                             f"p={masks.p}; this call has {list(x.shape)} and p={float(p)}.")
    return list(_DropoutLinear.apply(x, float(p), len(weights), masks, *weights, *biases))


@dataclass(frozen=True)
class DropoutMasks:
    """The per-block masks one dropout_linear forward drew (packed bits on the CPU: 1/32 of
    ``x``), for replaying that dropout (``dropout_linear(..., masks=...)``)."""

    blocks: tuple
    scale: float
    p: float
    shape: tuple[int, ...]
    backend: str


def dropout_masks(out: torch.Tensor) -> DropoutMasks | None:
    """The masks of the dropout_linear forward that made ``out`` (one of its outputs, under
    autograd), or ``None`` when ``out`` was not made so (or its backward already ran)."""
    node = out.grad_fn
    masks = getattr(node, "masks", None) if isinstance(node, _DropoutLinear._backward_cls) \
        else None
    if masks is None:
        return None
    return DropoutMasks(tuple(masks), node.scale, node.p, node.x_shape, node.backend)


def _check(x: torch.Tensor, weights: list, biases: list) -> None:
    if x.dim() != 2:
        raise ValueError(f"x must be [N, F_in]; got shape {list(x.shape)}.")
    if not weights:
        raise ValueError("dropout_linear needs at least one weight; got none.")
    if len(biases) != len(weights):
        raise ValueError(f"biases must have one entry (tensor or None) per weight: "
                         f"{len(weights)} weights, {len(biases)} biases.")
    for i, (w, b) in enumerate(zip(weights, biases)):
        if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[1] != x.shape[1]:
            got = list(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
            raise ValueError(f"weights[{i}] must be [F_out, {x.shape[1]}] (x is "
                             f"{list(x.shape)}); got {got}.")
        if w.dtype != x.dtype or w.device != x.device:
            raise ValueError(f"weights[{i}] must be {x.dtype} on {x.device} like x; "
                             f"got {w.dtype} on {w.device}.")
        if b is not None and (not isinstance(b, torch.Tensor) or b.shape != (w.shape[0],)
                              or b.dtype != x.dtype or b.device != x.device):
            got = (f"{list(b.shape)} {b.dtype} on {b.device}" if isinstance(b, torch.Tensor)
                   else type(b).__name__)
            raise ValueError(f"biases[{i}] must be None or [{w.shape[0]}] {x.dtype} on "
                             f"{x.device}; got {got}.")


def _blocks(x: torch.Tensor):
    """``(r0, r1)`` row ranges of about :data:`BLOCK_BYTES` each."""
    rows = max(1, BLOCK_BYTES // max(1, x.shape[1] * x.element_size()))
    return [(r0, min(r0 + rows, x.shape[0])) for r0 in range(0, x.shape[0], rows)] or [(0, 0)]


_WORKSPACE = threading.local()


def _buffer(x: torch.Tensor, rows: int) -> torch.Tensor:
    """A ``[rows, F_in]`` block buffer from this thread's workspace of :data:`BLOCK_BYTES`
    per dtype and device, kept between calls: a fresh one would be page-faulted in
    again by every forward and backward."""
    cache = getattr(_WORKSPACE, "buffers", None)
    if cache is None:
        cache = _WORKSPACE.buffers = {}
    need = rows * x.shape[1]
    buf = cache.get((x.dtype, x.device))
    if buf is None or buf.numel() < need:
        buf = cache[(x.dtype, x.device)] = torch.empty(need, dtype=x.dtype, device=x.device)
    return buf[:need].view(rows, x.shape[1])


def _linears_into(d: torch.Tensor, weights, biases, outs: list[torch.Tensor], r0: int,
                  r1: int) -> None:
    """Rows ``[r0, r1)`` of every output: the block ``d`` through each Linear."""
    for w, b, out in zip(weights, biases, outs):
        if b is None:
            torch.mm(d, w.t(), out=out[r0:r1])
        else:
            torch.addmm(b, d, w.t(), out=out[r0:r1])


def _empty_outs(x: torch.Tensor, weights) -> list[torch.Tensor]:
    """One ``[N, F_out_i]`` output per weight, like ``x``."""
    return [torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
            for w in weights]


def _through_weights(grads: list[torch.Tensor], weights) -> torch.Tensor:
    """``sum_i g_i W_i``: the gradient of the Linears' shared input."""
    out = grads[0].mm(weights[0])  # not sum(...): 0 + t would copy t
    for g, w in zip(grads[1:], weights[1:]):
        out.addmm_(g, w)
    return out


def _bias_grads(grads: list[torch.Tensor], need, has_bias) -> list[torch.Tensor | None]:
    return [g.sum(0) if n and has else None for g, n, has in zip(grads, need, has_bias)]


def _dense_grads(grads, weights, x: torch.Tensor) -> list[torch.Tensor]:
    """Each output's incoming gradient, zeros where autograd gave none."""
    return [torch.zeros(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
            if g is None else g.contiguous() for g, w in zip(grads, weights)]


class _DropoutLinear(torch.autograd.Function):
    """Forward drops each row block of ``x`` into one reused buffer and keeps the block's
    mask (packed bits on the CPU: ``N * F_in / 8`` bytes in all); backward re-applies
    the masks to ``x`` (weight gradients) and to ``sum_i g_i W_i`` (the input's)."""

    @staticmethod
    def forward(ctx, x, p, k, replay, *params):
        weights, biases = params[:k], params[k:]
        ctx.backend = current_backend() if replay is None else replay.backend
        ctx.k, ctx.p, ctx.x_shape = k, p, tuple(x.shape)
        ctx.has_bias = tuple(b is not None for b in biases)
        if replay is None:
            s1, s2, thr, scale = draw_seeds(p, seed_device(x.device, "dropout_mask"))
        else:
            scale = replay.scale
        ctx.scale = scale
        x = x.contiguous()
        base = row_base(x) if replay is None else None  # dropout_rows: by global row ids
        with use_backend(ctx.backend):
            kern = lookup("dropout_mask" if replay is None else "dropout_apply", x.device)
        outs = _empty_outs(x, weights)
        blocks = _blocks(x)
        buf = _buffer(x, blocks[0][1] - blocks[0][0])
        ctx.masks = []
        for i, (r0, r1) in enumerate(blocks):
            d = buf[:r1 - r0]  # the block's first flat index offsets the seed: same mask
            if replay is None and base is not None:
                ctx.masks.append(kern(x[r0:r1], s1, s2, thr, scale, d, base[r0:r1]))
            elif replay is None:
                ctx.masks.append(kern(x[r0:r1], (s1 + r0 * x.shape[1]) & _M32, s2, thr,
                                      scale, d))
            else:
                ctx.masks.append(replay.blocks[i])
                kern(x[r0:r1], replay.blocks[i], scale, d)
            _linears_into(d, weights, biases, outs, r0, r1)
            release_mapped(x, r0, r1)  # x on disk (storage=disk): keep one block resident
        ctx.save_for_backward(x, *weights)
        return tuple(outs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[4:4 + ctx.k]
        need_b = ctx.needs_input_grad[4 + ctx.k:]
        grads = _dense_grads(grads, weights, x)
        blocks = _blocks(x)
        with use_backend(ctx.backend):
            apply = lookup("dropout_apply", x.device)
            gx = None
            if need_x:  # d loss / d x = mask * scale * (sum_i g_i W_i)
                gd = _through_weights(grads, weights)
                for (r0, r1), mask in zip(blocks, ctx.masks):
                    apply(gd[r0:r1], mask, ctx.scale, gd[r0:r1])
                gx = gd
            gw = [torch.zeros_like(w) if n else None for w, n in zip(weights, need_w)]
            if any(n for n in need_w):
                buf = _buffer(x, blocks[0][1] - blocks[0][0])
                for (r0, r1), mask in zip(blocks, ctx.masks):
                    d = apply(x[r0:r1], mask, ctx.scale, buf[:r1 - r0])
                    for g, acc in zip(grads, gw):
                        if acc is not None:
                            acc.addmm_(g[r0:r1].t(), d)
                    release_mapped(x, r0, r1)
        ctx.masks = None
        gb = _bias_grads(grads, need_b, ctx.has_bias)
        return (gx, None, None, None, *gw, *gb)


class _StreamedLinear(torch.autograd.Function):
    """``[x @ W_i.T + b_i]`` for an ``x`` mapped from disk, one row block resident at a
    time: forward, and backward's weight gradients, read ``x`` block by block and drop
    each block's pages once read."""

    @staticmethod
    def forward(ctx, x, k, *params):
        weights, biases = params[:k], params[k:]
        ctx.k, ctx.has_bias = k, tuple(b is not None for b in biases)
        outs = _empty_outs(x, weights)
        for r0, r1 in _blocks(x):
            _linears_into(x[r0:r1], weights, biases, outs, r0, r1)
            release_mapped(x, r0, r1)
        ctx.save_for_backward(x, *weights)
        return tuple(outs)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[2:2 + ctx.k]
        need_b = ctx.needs_input_grad[2 + ctx.k:]
        grads = _dense_grads(grads, weights, x)
        gx = None
        if need_x:
            gx = _through_weights(grads, weights)
        gw = [torch.zeros_like(w) if n else None for w, n in zip(weights, need_w)]
        if any(need_w):
            for r0, r1 in _blocks(x):
                for g, acc in zip(grads, gw):
                    if acc is not None:
                        acc.addmm_(g[r0:r1].t(), x[r0:r1])
                release_mapped(x, r0, r1)
        gb = _bias_grads(grads, need_b, ctx.has_bias)
        return (gx, None, *gw, *gb)
