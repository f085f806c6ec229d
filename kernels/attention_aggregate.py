"""``attention_aggregate``: :func:`~ngra.kernels.softmax_aggregate` whose scores are row
dot products of the value itself, ``score_src = value . w_src`` and
``score_dst = value . w_dst`` per head: GAT's attention over ``W h`` as one op.

Written as ``rowdot`` + ``softmax_aggregate``, the backward holds three ``N x H x D``
tensors at once: the value (the rowdots' weight gradients read it after the
aggregation's backward), the output gradient and the value gradient. Here one
backward computes all gradients, and the cpu kernel folds the score gradients
into its walk over sources, where row ``u`` of the value is last read just before
row ``u`` of its gradient is written. So when nothing else holds the value's memory
(the compiler's hoisted ``W h``, dropped after forward) the gradient is written over
the value and the backward peak is one ``N x H x D`` tensor lower.

Reusing the value's memory makes the saved value unusable afterwards: its version
counter is bumped (autograd then refuses any other reader), and a second backward
through the same graph (``retain_graph=True``) raises. :func:`keep_value` turns the
reuse off for code that needs that.

With a :class:`Recompute` (how to make the value again from its inputs, e.g. GAT's
``dropout(x) W``) nothing of the value is saved at all: backward makes it again, writes
its gradient over it and differentiates the inputs through it. Between forward and
backward the layer then holds no ``N x H x D`` tensor, and a second backward works.
The ``[N, H]`` scores are recomputed in backward in both modes.

Attention dropout (``dropout=``, an :class:`~ngra.kernels.dropout.EdgeDropout`) runs
inside the same kernels as in :func:`~ngra.kernels.softmax_aggregate`: the keep flags
are hashed from the edge counters in forward and again in backward, never stored.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.checks import (
    check_csc,
    check_feat,
    check_rev,
    check_same_device,
    check_slope,
    kernel_offsets,
    sole_owner_uses,
    storage_uses,
)
from ngra.kernels.dropout import EdgeDropout, check_edge_dropout
from ngra.kernels.lean import vjp
from ngra.kernels.registry import lookup, thread_setting
from ngra.kernels.rowdot import check_row_weight
from ngra.kernels.transpose import reverse_of

__all__ = ["Recompute", "attention_aggregate", "keep_value"]

_state = threading.local()


@contextlib.contextmanager
def keep_value() -> Iterator[None]:
    """Inside the block, attention_aggregate's forward records that its backward must not
    write the value gradient over the value (so the graph can be differentiated twice)."""
    with thread_setting(_state, "keep", True):
        yield


def attention_aggregate(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    value: torch.Tensor,
    w_src: torch.Tensor,
    w_dst: torch.Tensor,
    *,
    negative_slope: float = 0.2,
    rev: Any = None,
    recompute: Recompute | None = None,
    dropout: EdgeDropout | None = None,
) -> torch.Tensor:
    r"""``softmax_aggregate(score_src, score_dst, value)`` with
    ``score_src = rowdot(value, w_src)`` and ``score_dst = rowdot(value, w_dst)``:

    .. math::
        e_{uv} = \mathrm{LeakyReLU}(w^{src}_h \cdot \mathrm{value}_{u,h}
                 + w^{dst}_h \cdot \mathrm{value}_{v,h}), \quad
        \mathrm{out}_{v,h} = \sum_{u \to v} \mathrm{softmax}_u(e_{uv})\, \mathrm{value}_{u,h}

    Sources and destinations are the same vertices (a square graph). Differentiable
    in ``value``, ``w_src`` and ``w_dst``; see the module docstring for when the value
    gradient reuses the value's memory.

    Args:
        indptr: ``[N + 1]`` int32/int64 CSC offsets over destinations.
        indices: ``[E]`` int32/int64 source of each edge, destination-sorted.
        value: ``[N, H, D]`` float32/float64.
        w_src, w_dst: score weights of value's dtype broadcasting to ``[H, D]``
            (e.g. GAT's ``a_src`` ``[H, D]``).
        negative_slope: LeakyReLU slope (default: ``0.2``).
        rev: optional reverse CSR, as for :func:`~ngra.kernels.softmax_aggregate`.
        recompute: how to make ``value`` again (a :class:`Recompute`): then nothing of
            the value is saved, backward recomputes it and differentiates
            ``recompute.inputs`` through it (``value`` itself gets no gradient).
        dropout: attention dropout of the normalized weights, as for
            :func:`~ngra.kernels.softmax_aggregate` (default: ``None``).

    Returns:
        ``[N, H, D]`` of value's dtype (0 for a vertex without in-edges).

    Raises:
        TypeError: non-tensors, wrong or mixed dtypes, mixed devices.
        ValueError: value not 3-D, weights not broadcastable to ``[H, D]``, a graph
            that is not square over value's rows, malformed ``indptr``/``indices``.
    """
    value = check_feat(value, "value")
    if value.dim() != 3:
        raise ValueError(f"value must be 3-D [N, H, D]; got shape {list(value.shape)}. "
                         "Reshape with value.view(N, H, D).")
    w_src = check_row_weight(value, w_src, "w_src")
    w_dst = check_row_weight(value, w_dst, "w_dst")
    num = value.shape[0]
    num_dst = check_csc(indptr, indices, num)
    if num_dst != num:
        raise ValueError(f"attention_aggregate needs a square graph over value's {num} rows "
                         f"(sources are destinations); indptr has {num_dst} destinations.")
    check_same_device(indices, value=value, w_src=w_src, w_dst=w_dst)
    negative_slope = check_slope(negative_slope)
    if rev is not None:
        rev = check_rev(rev, num, num, indices.numel(), indices.device)
    dropout = check_edge_dropout(dropout, indices.numel(), indices.device)
    if recompute is None:
        inputs: tuple = ()
    else:
        if not isinstance(recompute, Recompute):
            raise TypeError(f"recompute must be an ngra.kernels.Recompute; got "
                            f"{type(recompute).__name__}.")
        value, inputs = value.detach(), tuple(recompute.inputs)
    return _AttentionAggregate.apply(kernel_offsets(indptr), indices.contiguous(),
                                     value.contiguous(), w_src, w_dst, negative_slope, rev,
                                     recompute, dropout, *inputs)


@dataclass(frozen=True)
class Recompute:
    """How :func:`attention_aggregate` makes its value again in backward instead of
    saving it: ``fn(*inputs)`` returns the same ``[N, H, D]`` value when torch's CPU
    random state is ``rng_state`` (the state the first computation started from; ``None``
    when ``fn`` draws no random numbers). ``fn`` must read every tensor that wants a
    gradient through ``inputs`` (the gradients flow to them), nothing else."""

    fn: Callable[..., torch.Tensor]
    inputs: Sequence[torch.Tensor]
    rng_state: torch.Tensor | None = None


class _AttentionAggregate(torch.autograd.Function):
    """Saves the ``lse`` and the value (or, with a :class:`Recompute`, its inputs); the
    ``[N, H]`` scores are recomputed in backward."""

    @staticmethod
    def forward(ctx, indptr, indices, value, w_src, w_dst, negative_slope, rev, recompute, drop,
                *inputs):
        heads, dim = value.shape[1:]
        ws = w_src.expand(heads, dim).contiguous()
        wd = w_dst.expand(heads, dim).contiguous()
        fwd = lookup("softmax_aggregate_fwd", value.device)
        ctx.fold = lookup("softmax_aggregate_bwd_fold", value.device)  # forward's backend
        out, lse = fwd(indptr, indices, *_scores(value, ws, wd), value, negative_slope, drop=drop)
        if recompute is None:
            # a detached alias: its own tensor sharing value's memory, so that the memory's
            # use count tells whether anything else (the caller's value, a view) holds it
            ctx.save_for_backward(indptr, indices, ws, wd, lse, value.detach())
        else:
            ctx.save_for_backward(indptr, indices, ws, wd, lse, *inputs)
        # the inputs are saved tensors (released after backward), not held by ctx
        ctx.recompute = None if recompute is None else (recompute.fn, recompute.rng_state)
        ctx.shape = value.shape
        ctx.negative_slope, ctx.rev, ctx.w_shapes = negative_slope, rev, (w_src.shape, w_dst.shape)
        ctx.drop = drop
        ctx.reuse = not getattr(_state, "keep", False) and _SOLE_OWNER_USES > 0
        ctx.spent = False
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        if ctx.spent:
            raise RuntimeError(
                "attention_aggregate: this graph's backward already ran and wrote the value "
                "gradient over the saved value, so it cannot run again (retain_graph=True). "
                "Run the forward inside ngra.kernels.keep_value() to differentiate it twice.")
        indptr, indices, ws, wd, lse, *rest = ctx.saved_tensors
        if ctx.recompute is None:
            (value,) = rest
            # in place only when this backward holds the value's only references
            inplace = ctx.reuse and storage_uses(value) == _SOLE_OWNER_USES
        else:
            leaves, value, inplace = _recompute(ctx.recompute, rest, ctx.shape)
        rev = reverse_of(indptr, indices, value.shape[0], ctx.rev)
        g_value, g_ws, g_wd = ctx.fold(indptr, indices, rev, value, ws, wd,
                                       *_scores(value.detach(), ws, wd), lse,
                                       grad_out.to(value.dtype).contiguous(),
                                       ctx.negative_slope, inplace, drop=ctx.drop)
        if inplace and g_value.data_ptr() == value.data_ptr() and ctx.recompute is None:
            ctx.spent = True
            torch.autograd.graph.increment_version(value)
        need = ctx.needs_input_grad
        grads = [None, None, g_value if need[2] else None,
                 g_ws.sum_to_size(ctx.w_shapes[0]) if need[3] else None,
                 g_wd.sum_to_size(ctx.w_shapes[1]) if need[4] else None, None, None, None, None]
        if ctx.recompute is not None:
            wanted = [t for t in leaves if t.requires_grad]
            got = iter(vjp(value, wanted, g_value, allow_unused=True)
                       if wanted else ())
            grads += [next(got) if t.requires_grad else None for t in leaves]
        return tuple(grads)


def _scores(value: torch.Tensor, ws: torch.Tensor, wd: torch.Tensor) -> tuple:
    """``(value . ws, value . wd)`` ``[N, H]``: GEMMs against the block-diagonal weight
    rows (H columns each), no ``[N, H, D]`` product."""
    flat = value.reshape(value.shape[0], -1)
    return flat @ torch.block_diag(*ws).t(), flat @ torch.block_diag(*wd).t()


def _recompute(rc: tuple, inputs: list, shape: torch.Size) -> tuple:
    """``(leaves, value, inplace)``: the value made again by ``fn`` (``rc = (fn,
    rng_state)``) from detached ``inputs`` (with grad, from ``rng_state``), and whether its
    memory may take its gradient: no input shares it and the recomputation saved none
    of it for its own backward."""
    fn, rng_state = rc
    leaves = [t.detach().requires_grad_(t.requires_grad) for t in inputs]
    saved: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.add(t.untyped_storage().data_ptr())
        return t

    with contextlib.ExitStack() as stack:
        if rng_state is not None:
            stack.enter_context(torch.random.fork_rng(devices=[]))
            torch.set_rng_state(rng_state)
        stack.enter_context(torch.enable_grad())
        stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
        value = fn(*leaves)
    if not isinstance(value, torch.Tensor) or value.shape != shape:
        got = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise RuntimeError(f"attention_aggregate: Recompute.fn made {got}, not the forward's "
                           f"value of shape {list(shape)}.")
    value = value.contiguous()
    ptr = value.untyped_storage().data_ptr()
    shared = ptr in saved or any(t.untyped_storage().data_ptr() == ptr for t in inputs)
    return leaves, value, not shared


#: what a saved alias of the value shows when nothing else holds the value's memory
_SOLE_OWNER_USES = sole_owner_uses("alias")
