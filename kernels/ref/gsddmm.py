"""Reference g-SDDMM: select both operands' rows per edge, apply the op (plain torch)."""

from __future__ import annotations

import torch

from ngra.kernels.ref.util import dst_ids
from ngra.kernels.registry import register


@register("gsddmm", "ref")
def gsddmm(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    op: str,
    lhs_target: str,
    rhs_target: str,
) -> torch.Tensor:
    """``out[j] = op(lhs[row(j, lhs_target)], rhs[row(j, rhs_target)])`` for every edge j.

    ``row(j, "src") = indices[j]``, ``row(j, "dst")`` = the destination of edge j,
    ``row(j, "edge") = j``. Operands are ``[rows, H, Dl]`` / ``[rows, H, Dr]``
    with ``Dl, Dr`` equal or one of them 1; ``out`` is ``[E, H, max(Dl, Dr)]``,
    or ``[E, H, 1]`` for ``dot``.
    """
    rows = {"src": indices.long(), "dst": dst_ids(indptr)}

    def pick(x: torch.Tensor, target: str) -> torch.Tensor:
        return x if target == "edge" else x.index_select(0, rows[target])

    a, b = pick(lhs, lhs_target), pick(rhs, rhs_target)
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div":
        return a / b
    return (a * b).sum(-1, keepdim=True)
