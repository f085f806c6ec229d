r"""``pair_bce``: binary cross-entropy of dot-product scores of vertex pairs, fused.

For positive pairs and negative pairs, each given as a CSC over destinations, and
embeddings ``z`` ``[N, F]``:

.. math::
    \mathrm{loss} = \mathrm{scale} \Big(\sum_{(u, v) \in \mathrm{pos}}
        \mathrm{softplus}(-z_u \cdot z_v) + \sum_{(u, v) \in \mathrm{neg}}
        \mathrm{softplus}(z_u \cdot z_v)\Big)

a link decoder's training loss with the dot product as its score. Written out it is a
g-SDDMM (the scores), a softplus, and in backward a sigmoid and two g-SpMMs, one of them
over the pairs' transpose. Here it is two walks in forward, none in backward:

1. **Over destinations** (parallel over destination ranges, one writer per row): each
   pair's score, its loss term, its coefficient ``c_e = scale * (sigmoid(s_e) - y)``
   (``d loss / d s_e``) and the destination-side gradient ``sum_e c_e z_u`` of each ``v``
   while ``z_v`` is in cache, for the positives and the negatives of ``v`` in turn.
2. **Over sources** (with autograd recording only): the source-side gradient
   ``sum_e c_e z_v`` added into the same rows. Each thread walks every pair in
   destination order (so ``z_v`` streams) and adds the pairs whose source it owns (row
   blocks dealt round-robin to threads: R-MAT's hubs spread over them). No transpose of
   the pairs is ever built, and the coefficients die with the call.

Forward keeps one ``[N, F]`` gradient for backward, which scales it by the incoming
gradient. No per-pair feature row exists (the reference backend gathers rows: it is the
specification).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.checks import check_csc, check_feat, check_range
from ngra.kernels.registry import lookup

__all__ = ["pair_bce"]

Pairs = tuple[torch.Tensor, torch.Tensor]


def pair_bce(z: torch.Tensor, pos: Pairs | None = None, neg: Pairs | None = None, *,
             scale: float = 1.0) -> torch.Tensor:
    """The scaled binary cross-entropy of the pairs' dot-product scores (module docstring).

    Args:
        z: ``[N, F]`` float32/float64 embeddings.
        pos: the positive pairs (label 1) as ``(indptr [N + 1], indices [P])``, a CSC over
            their destinations with each pair's source in ``indices`` (int32/int64, in
            ``[0, N)``); ``None``: none.
        neg: the negative pairs (label 0), the same way; ``None``: none.
        scale: multiplies the sum (``1 / number of pairs`` for a mean). (default: 1.0)

    Returns:
        A 0-dim tensor of ``z``'s dtype, differentiable in ``z``.
    """
    z = check_feat(z, "z")
    if z.dim() != 2:
        raise ValueError(f"z must be [N, F] embeddings; got shape {list(z.shape)}.")
    sets = []
    for name, pairs in (("pos", pos), ("neg", neg)):
        if pairs is None:
            indptr = torch.zeros(z.shape[0] + 1, dtype=torch.int64, device=z.device)
            pairs = (indptr, indptr[:0])
        if not (isinstance(pairs, (tuple, list)) and len(pairs) == 2):
            raise ValueError(f"{name} must be an (indptr, indices) CSC of pairs or None; "
                             f"got {type(pairs).__name__}.")
        indptr, indices = pairs
        num_dst = check_csc(indptr, indices, names=(f"{name} indptr", f"{name} indices"))
        if num_dst != z.shape[0]:
            raise ValueError(f"{name} indptr covers {num_dst} destinations; z has "
                             f"{z.shape[0]} rows.")
        check_range(indices, z.shape[0], f"{name} indices", "rows of z")
        sets += [indptr, indices.contiguous()]
    return _PairBCE.apply(z.contiguous(), float(scale), *sets)


class _PairBCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, scale, pos_indptr, pos_indices, neg_indptr, neg_indices):
        grad = ctx.needs_input_grad[0]
        loss, gz = lookup("pair_bce", z.device)(z, pos_indptr, pos_indices, neg_indptr,
                                                neg_indices, scale, grad)
        ctx.gz = gz  # not an input or output: kept on ctx, freed with the graph
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        return ctx.gz * grad, None, None, None, None, None
