r"""``pair_bce``: binary cross-entropy of dot-product scores of vertex pairs, fused.

For pairs ``e = (u -> v)`` given as a CSC over destinations and embeddings ``z`` ``[N, F]``:

.. math::
    \mathrm{loss} = \mathrm{scale} \sum_e \mathrm{softplus}(-(2y - 1)\, z_u \cdot z_v)

(``y`` = 1 for positive pairs, 0 for negatives): a link decoder's training loss with
the dot product as its score. Written out it is a g-SDDMM (the scores), a softplus,
and in backward a sigmoid and two g-SpMMs. Here the **forward** is one walk over the
destinations that computes each score, its loss term, its coefficient
``c_e = scale * (sigmoid(s_e) - y)`` (``d loss / d s_e``) and the destination-side
gradient ``sum_e c_e z_u`` of each ``v`` while ``z_v`` is in cache; **backward** adds
the source-side gradient, a g-SpMM over the transpose weighted by ``c``, and scales
both by the incoming gradient. No per-pair feature row exists in either pass (the
reference backend gathers rows: it is the specification).

The destination-side gradient ``[N, F]`` is kept from forward to backward; a call
without autograd recording keeps nothing.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.checks import check_csc, check_feat, check_range
from ngra.kernels.gspmm import gspmm
from ngra.kernels.registry import current_backend, lookup, use_backend
from ngra.kernels.transpose import Rev, reverse_of

__all__ = ["pair_bce"]


def pair_bce(indptr: torch.Tensor, indices: torch.Tensor, z: torch.Tensor, *, label: int,
             scale: float = 1.0, rev: Rev | None = None) -> torch.Tensor:
    """The scaled binary cross-entropy of the pairs' dot-product scores (module docstring).

    Args:
        indptr: ``[N + 1]`` int32/int64 CSC offsets over the pairs' destinations.
        indices: ``[P]`` int32/int64 source of each pair, in ``[0, N)``.
        z: ``[N, F]`` float32/float64 embeddings.
        label: 1 (every pair is an edge) or 0 (every pair a negative).
        scale: multiplies the sum (``1 / number of pairs`` for a mean). (default: 1.0)
        rev: the pairs' transpose for backward (built and cached when ``None``).

    Returns:
        A 0-dim tensor of ``z``'s dtype, differentiable in ``z``.
    """
    z = check_feat(z, "z")
    if z.dim() != 2:
        raise ValueError(f"z must be [N, F] embeddings; got shape {list(z.shape)}.")
    if label not in (0, 1):
        raise ValueError(f"label must be 0 or 1; got {label!r}.")
    num_dst = check_csc(indptr, indices)
    if num_dst != z.shape[0]:
        raise ValueError(f"indptr covers {num_dst} destinations; z has {z.shape[0]} rows.")
    check_range(indices, z.shape[0], "indices", "rows of z")
    return _PairBCE.apply(z.contiguous(), indptr, indices.contiguous(), int(label),
                          float(scale), rev)


class _PairBCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, indptr, indices, label, scale, rev):
        ctx.backend = current_backend()
        loss, coef, gdst = lookup("pair_bce", z.device)(indptr, indices, z, label, scale)
        ctx.save_for_backward(z, indptr, indices, coef, gdst)
        ctx.rev = rev
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        z, indptr, indices, coef, gdst = ctx.saved_tensors
        with use_backend(ctx.backend):
            rev_indptr, rev_indices, rev_perm = reverse_of(indptr, indices, z.shape[0], ctx.rev)
            gz = gspmm(rev_indptr, rev_indices, z, coef.index_select(0, rev_perm.long()),
                       reduce="sum")
        gz += gdst
        gz *= grad
        return gz, None, None, None, None, None
