"""numba g-SDDMM: per-edge binary op of rows picked from src / dst / edge operands.

Parallel over destinations (CSC), so the destination row is reused across its
in-edges and every output row (one per edge) has one writer. Operands arrive
as ``[rows, H, D]`` with equal ``D``; a broadcast operand (``D = 1``) is
expanded here, which keeps the kernel to one branch-free loop per op.
Specializations: {float32, float64} x {int32, int64 indices}.
"""

from __future__ import annotations

import torch
from numba import njit

from ngra.kernels.cpu.util import as_numpy, prefetch_distance, prefetch_row, run_rows
from ngra.kernels.registry import register

ADD, SUB, MUL, DIV, DOT = 0, 1, 2, 3, 4
OP_CODES = {"add": ADD, "sub": SUB, "mul": MUL, "div": DIV, "dot": DOT}
SRC, DST, EDGE = 0, 1, 2
TARGET_CODES = {"src": SRC, "dst": DST, "edge": EDGE}


# reassoc lets the dot product's reduction vectorize; it only reorders additions.
@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _sddmm(indptr, indices, lhs, rhs, out, op, lhs_target, rhs_target, pf, v0, v1):
    """``out[j, h, :] = op(lhs[row_l(j), h, :], rhs[row_r(j), h, :])``; ``dot`` writes ``out[j, h, 0]``."""
    nh, nd = lhs.shape[1], lhs.shape[2]
    num_edges = indices.shape[0]
    for v in range(v0, v1):
        for j in range(indptr[v], indptr[v + 1]):
            if j + pf < num_edges:
                if lhs_target == SRC:
                    prefetch_row(lhs, indices[j + pf])
                if rhs_target == SRC:
                    prefetch_row(rhs, indices[j + pf])
            u = indices[j]
            a = u if lhs_target == SRC else (v if lhs_target == DST else j)
            b = u if rhs_target == SRC else (v if rhs_target == DST else j)
            if op == DOT:
                for h in range(nh):
                    acc = out.dtype.type(0)
                    for d in range(nd):
                        acc += lhs[a, h, d] * rhs[b, h, d]
                    out[j, h, 0] = acc
            elif op == ADD:
                for h in range(nh):
                    for d in range(nd):
                        out[j, h, d] = lhs[a, h, d] + rhs[b, h, d]
            elif op == SUB:
                for h in range(nh):
                    for d in range(nd):
                        out[j, h, d] = lhs[a, h, d] - rhs[b, h, d]
            elif op == MUL:
                for h in range(nh):
                    for d in range(nd):
                        out[j, h, d] = lhs[a, h, d] * rhs[b, h, d]
            else:
                for h in range(nh):
                    for d in range(nd):
                        out[j, h, d] = lhs[a, h, d] / rhs[b, h, d]


@register("gsddmm", "cpu")
def gsddmm(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    op: str,
    lhs_target: str,
    rhs_target: str,
) -> torch.Tensor:
    """See :func:`ngra.kernels.ref.gsddmm.gsddmm` (same contract)."""
    dim = max(lhs.shape[2], rhs.shape[2])
    if lhs.shape[2] != dim:
        lhs = lhs.expand(-1, -1, dim).contiguous()
    if rhs.shape[2] != dim:
        rhs = rhs.expand(-1, -1, dim).contiguous()
    out_dim = 1 if op == "dot" else dim
    out = torch.empty((indices.numel(), lhs.shape[1], out_dim), dtype=lhs.dtype)
    ip = as_numpy(indptr)
    row_bytes = lhs.shape[1] * dim * lhs.element_size()
    run_rows(
        _sddmm,
        ip,
        ip,
        as_numpy(indices),
        as_numpy(lhs),
        as_numpy(rhs),
        as_numpy(out),
        OP_CODES[op],
        TARGET_CODES[lhs_target],
        TARGET_CODES[rhs_target],
        prefetch_distance(row_bytes),
        row_bytes=row_bytes,
    )
    return out
