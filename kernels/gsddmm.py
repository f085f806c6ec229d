"""g-SDDMM: one value per edge from its source / destination / edge operands.

Computes attention logits (``dot`` of query and key), edge-wise messages
(``mul``) and the per-edge gradients of g-SpMM without a Python loop over edges.
Validation and autograd live here; kernels are reached through the registry.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.checks import (
    check_choice,
    check_csc,
    check_feat,
    check_range,
    check_rev,
    check_same_device,
    kernel_offsets,
    sddmm_layout,
)
from ngra.kernels.registry import current_backend, lookup, use_backend
from ngra.kernels.transpose import Rev, reverse_of

__all__ = ["OPS", "TARGETS", "gsddmm"]

OPS = ("add", "sub", "mul", "div", "dot")
TARGETS = ("src", "dst", "edge")


def gsddmm(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    *,
    op: str,
    lhs_target: str = "dst",
    rhs_target: str = "src",
    rev: Rev | None = None,
) -> torch.Tensor:
    r"""Generalized sampled dense-dense matrix multiplication over a CSC graph.

    .. math::
        \mathbf{out}_e = \mathrm{op}(\mathbf{lhs}_{t_l(e)}, \mathbf{rhs}_{t_r(e)})

    for every edge :math:`e = (u \to v)`, where target ``"src"`` selects row
    :math:`u`, ``"dst"`` row :math:`v` and ``"edge"`` row :math:`e` (the operand
    is then an ``[E, ...]`` tensor in CSC edge order). Feature shapes are aligned
    on the left and broadcast (``[N, H]`` against ``[N, H, D]`` gives
    ``[E, H, D]``). Differentiable w.r.t. both operands.

    ``op="dot"`` reduces the last feature dim and drops it, like
    ``(a * b).sum(-1)``: ``[N, H, D]`` with ``[N, H, D]`` gives ``[E, H]`` and
    ``[N, F]`` with ``[N, F]`` gives ``[E]``.

    Args:
        indptr: ``[num_dst + 1]`` int32/int64 CSC offsets over destinations.
        indices: ``[E]`` int32/int64 source of each edge.
        lhs: ``[rows, *Fl]`` float32/float64; rows = num_src (or more), num_dst or E
            by ``lhs_target``.
        rhs: ``[rows, *Fr]``, same dtype as ``lhs``.
        op: ``"add"``, ``"sub"``, ``"mul"``, ``"div"`` or ``"dot"``.
        lhs_target: ``"src"``, ``"dst"`` or ``"edge"``. (default: ``"dst"``)
        rhs_target: ``"src"``, ``"dst"`` or ``"edge"``. (default: ``"src"``)
        rev: optional reverse structure for the backward pass to ``"src"`` operands
            (see :func:`ngra.kernels.gspmm`). (default: ``None``)

    Returns:
        ``[E, *broadcast(Fl, Fr)]``, without the last dim for ``dot``.
    """
    check_choice(op, "op", OPS)
    check_choice(lhs_target, "lhs_target", TARGETS)
    check_choice(rhs_target, "rhs_target", TARGETS)
    lhs = check_feat(lhs, "lhs")
    rhs = check_feat(rhs, "rhs")
    if lhs.dtype != rhs.dtype:
        raise TypeError(f"lhs and rhs must have one dtype; got {lhs.dtype} and {rhs.dtype}.")
    check_same_device(indices, lhs=lhs, rhs=rhs)
    num_dst = check_csc(indptr, indices)
    num_edges = indices.numel()
    src_rows = []
    for name, x, target in (("lhs", lhs, lhs_target), ("rhs", rhs, rhs_target)):
        want = {"dst": num_dst, "edge": num_edges}.get(target)
        if want is not None and x.shape[0] != want:
            what = "num_dst" if target == "dst" else "E, one per edge"
            raise ValueError(
                f"{name} targets {target!r} so it needs {want} rows ({what}); "
                f"got shape {list(x.shape)}."
            )
        if target == "src":
            src_rows.append(x.shape[0])
    if src_rows:
        if len(set(src_rows)) > 1 and rev is not None:
            raise ValueError(
                f"rev describes one source set, but the 'src' operands have {src_rows} rows."
            )
        check_range(indices, min(src_rows), "indices", "rows of the operands targeting 'src'")
        if rev is not None:
            rev = check_rev(rev, src_rows[0], num_dst, num_edges, indices.device)
    full, out_shape, layout = sddmm_layout(lhs.shape[1:], rhs.shape[1:], op)
    if layout is None:
        # Not a trailing broadcast (e.g. [N, 1, D] with [N, H, 1]): expand both.
        lhs, rhs = _expand(lhs, full), _expand(rhs, full)
        _, _, layout = sddmm_layout(full, full, op)
    heads, dim_l, dim_r, _ = layout
    lhs3 = lhs.reshape(lhs.shape[0], heads, dim_l).contiguous()
    rhs3 = rhs.reshape(rhs.shape[0], heads, dim_r).contiguous()
    out = _GSDDMM.apply(
        kernel_offsets(indptr),
        indices.contiguous(),
        lhs3,
        rhs3,
        op,
        lhs_target,
        rhs_target,
        rev,
    )
    return out.reshape((num_edges,) + out_shape)


def _expand(x: torch.Tensor, full: tuple[int, ...]) -> torch.Tensor:
    feat = tuple(x.shape[1:]) + (1,) * (len(full) - (x.dim() - 1))
    return x.reshape((x.shape[0],) + feat).expand((x.shape[0],) + full)


class _GSDDMM(torch.autograd.Function):
    """Autograd over normalized operands ``[rows, H, Dl]`` / ``[rows, H, Dr]``."""

    @staticmethod
    def forward(ctx, indptr, indices, lhs, rhs, op, lhs_target, rhs_target, rev):
        ctx.backend = current_backend()
        out = lookup("gsddmm", lhs.device)(indptr, indices, lhs, rhs, op, lhs_target, rhs_target)
        ctx.op, ctx.targets, ctx.rev = op, (lhs_target, rhs_target), rev
        ctx.save_for_backward(indptr, indices, lhs, rhs, out if op == "div" else None)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        with use_backend(ctx.backend):
            return _GSDDMM._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out):
        indptr, indices, lhs, rhs, out = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        sddmm = lookup("gsddmm", lhs.device)
        op, (lt, rt) = ctx.op, ctx.targets
        grads = [None, None]
        for side, (x, xt, y, yt) in enumerate(((lhs, lt, rhs, rt), (rhs, rt, lhs, lt))):
            if not ctx.needs_input_grad[2 + side]:
                continue
            # Per-edge gradient w.r.t. the operand's selected row.
            if op in ("add", "sub"):
                pe = -grad_out if (op == "sub" and side == 1) else grad_out
            elif op in ("mul", "dot"):
                pe = sddmm(indptr, indices, grad_out, y, "mul", "edge", yt)
            elif side == 0:  # d(a / b) / da = 1 / b
                pe = sddmm(indptr, indices, grad_out, y, "div", "edge", yt)
            else:  # d(a / b) / db = -(a / b) / b
                pe = -sddmm(indptr, indices, grad_out * out, x, "div", "edge", xt)
            if x.shape[2] == 1 and pe.shape[2] != 1:
                pe = pe.sum(-1, keepdim=True)
            elif pe.shape[2] != x.shape[2]:
                pe = pe.expand(-1, -1, x.shape[2])
            grads[side] = _rows_grad(pe.contiguous(), xt, x.shape[0], indptr, indices, ctx.rev)
        return None, None, grads[0], grads[1], None, None, None, None


def _rows_grad(
    per_edge: torch.Tensor,
    target: str,
    rows: int,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    rev: Rev | None,
) -> torch.Tensor:
    """Sum ``per_edge`` [E, H, D] into the rows its edges selected."""
    if target == "edge":
        return per_edge
    shape = per_edge.shape[1:]
    if target == "dst":
        flat = per_edge.view(per_edge.shape[0], math.prod(shape))
        out, _ = lookup("segment_reduce", per_edge.device)(indptr, flat, "sum")
        return out.view((rows,) + shape)
    rev_indptr, _, rev_perm = reverse_of(indptr, indices, rows, rev)
    # Sum over each source's out-edges: a g-SpMM whose "source rows" are the edges.
    out, _ = lookup("gspmm", per_edge.device)(rev_indptr, rev_perm, per_edge, None, "sum", None)
    return out
