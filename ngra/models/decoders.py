r"""Link decoders: a score per vertex pair from the encoder's vertex embeddings.

Each decoder maps embeddings ``z`` ``[N, F]`` and pairs ``[2, P]`` (row 0 the sources,
row 1 the destinations) to ``[P]`` **logits** (train with ``BCEWithLogitsLoss``; a
probability is ``sigmoid(score)``):

* :class:`DotDecoder`: :math:`s(u, v) = z_u \cdot z_v`.
* :class:`HadamardMLPDecoder`: :math:`s(u, v) = \mathrm{MLP}(z_u \odot z_v)` (OGB's
  ``LinkPredictor``).
* :class:`DistMultDecoder`: :math:`s(u, r, v) = \sum_f z_{u,f}\, R_{r,f}\, z_{v,f}`
  (Yang et al. 2015; R-GCN's link decoder).

**Dot products through the pairs' CSC.** :class:`DotDecoder` makes no per-pair feature
rows at all: the pairs become a CSC graph over the ``N`` vertices (grouped by
destination once per pair tensor, cached for the fixed ones), the scores are its
g-SDDMM ``dot`` and, in backward, the gradient of ``z`` is two g-SpMMs weighted by the
scores' gradients (over the pairs' destinations and, through the cached transpose,
their sources), the kernels a GCN layer runs on. Memory is ``O(P)`` indices and
scores, never ``[P, F]``. The training loss (:meth:`DotDecoder.bce_sum`) goes further:
:func:`ngra.kernels.pair_bce` scores both sets, the loss and the whole gradient in two
walks over the pairs grouped by destination, so no score vector nor transpose exists.

**Chunks.** The other decoders score ``chunk`` pairs at a time, so the gathered
``[p, F]`` rows of one chunk are the largest temporaries: scoring all ``N^2`` candidate
pairs of an evaluation never builds ``[P, F]``. With autograd recording, each chunk runs
under activation checkpointing (its gathered rows are recomputed in backward rather
than kept), so training memory is bounded the same way; gradients equal the unchunked
ones (dropout in the MLP replays the same mask, torch's checkpoint restores the RNG
state).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.utils.checkpoint import checkpoint

from ngra.kernels import gsddmm, gspmm, pair_bce, transpose_csc
from ngra.kernels.transpose import reverse_of

__all__ = ["CHUNK", "DistMultDecoder", "DotDecoder", "HadamardMLPDecoder", "PairCSC",
           "PairDecoder", "bce_of_scores", "pair_csc"]

#: Pairs scored at once by default.
CHUNK = 1 << 16


def bce_of_scores(pos_scores: torch.Tensor, neg_scores: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy summed over positive scores (label 1) and negative scores
    (label 0): ``softplus(-s)`` and ``softplus(s)``, with no concatenated copy of the
    scores nor label vectors."""
    return (torch.nn.functional.softplus(-pos_scores).sum()
            + torch.nn.functional.softplus(neg_scores).sum())


class PairDecoder(nn.Module):
    """Base class: checks the inputs and scores the pairs chunk by chunk.

    Subclasses implement :meth:`score` on one chunk's gathered rows.

    Args:
        chunk: pairs scored at once (default: :data:`CHUNK`).
    """

    needs_relation = False

    def __init__(self, chunk: int = CHUNK) -> None:
        super().__init__()
        if int(chunk) < 1:
            raise ValueError(f"chunk must be >= 1 pairs; got {chunk}.")
        self.chunk = int(chunk)

    def score(self, src: torch.Tensor, dst: torch.Tensor,
              rel: torch.Tensor | None) -> torch.Tensor:
        """``[p]`` scores of one chunk: ``src``/``dst`` ``[p, F]`` rows, ``rel`` ``[p]`` or None."""
        raise NotImplementedError

    def forward(self, z: torch.Tensor, pairs: torch.Tensor,
                rel: torch.Tensor | None = None) -> torch.Tensor:
        """Score ``pairs`` ``[2, P]`` of embeddings ``z`` ``[N, F]`` -> ``[P]`` logits.

        ``rel``: ``[P]`` relation ids (:class:`DistMultDecoder`), else ``None``.
        """
        self._check(z, pairs, rel)
        num = pairs.shape[1]
        if num <= self.chunk:
            return self._chunk(z, pairs[0], pairs[1], rel)
        out = []
        record = torch.is_grad_enabled() and (z.requires_grad or any(
            p.requires_grad for p in self.parameters()))
        for lo in range(0, num, self.chunk):
            s, d = pairs[0, lo:lo + self.chunk], pairs[1, lo:lo + self.chunk]
            r = None if rel is None else rel[lo:lo + self.chunk]
            if record:
                out.append(checkpoint(self._chunk, z, s, d, r, use_reentrant=False))
            else:
                out.append(self._chunk(z, s, d, r))
        return torch.cat(out)

    def bce_sum(self, z: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor,
                pos_rel: torch.Tensor | None = None,
                neg_rel: torch.Tensor | None = None) -> torch.Tensor:
        """The training loss's sum: binary cross-entropy of the ``pos`` pairs' scores
        (label 1) and the ``neg`` pairs' (label 0)."""
        return bce_of_scores(self(z, pos, pos_rel), self(z, neg, neg_rel))

    def _chunk(self, z: torch.Tensor, s: torch.Tensor, d: torch.Tensor,
               r: torch.Tensor | None) -> torch.Tensor:
        return self.score(z.index_select(0, s), z.index_select(0, d), r)

    def _check(self, z: torch.Tensor, pairs: torch.Tensor, rel: torch.Tensor | None,
               ids: bool = True) -> None:
        """Refuse bad shapes and (``ids``: a pass over the pairs) ids outside ``z``."""
        name = type(self).__name__
        if z.dim() != 2:
            raise ValueError(f"{name}: z must be [N, F] embeddings; got {list(z.shape)}.")
        if pairs.dim() != 2 or pairs.shape[0] != 2 or pairs.is_floating_point():
            raise ValueError(f"{name}: pairs must be a [2, P] integer tensor (sources, "
                             f"destinations); got {pairs.dtype} {list(pairs.shape)}. If you "
                             "have [P, 2], pass pairs.t().")
        if ids and pairs.numel() and (int(pairs.min()) < 0 or int(pairs.max()) >= z.shape[0]):
            raise ValueError(f"{name}: pairs hold vertex ids in [{int(pairs.min())}, "
                             f"{int(pairs.max())}]; z has {z.shape[0]} rows.")
        if self.needs_relation:
            if rel is None or rel.shape != (pairs.shape[1],):
                got = None if rel is None else list(rel.shape)
                raise ValueError(f"{name}: rel must be [{pairs.shape[1]}] relation ids, one "
                                 f"per pair; got {got}.")
        elif rel is not None:
            raise ValueError(f"{name} scores untyped pairs; got rel. Use DistMultDecoder "
                             "for typed pairs.")


class DotDecoder(PairDecoder):
    r""":math:`s(u, v) = z_u \cdot z_v`. No parameters; scored through the pairs' CSC
    (module docstring), all pairs at once.

    Args:
        chunk: unused (the CSC path makes no per-pair rows); kept for the interface.
    Shapes: ``z`` [N, F], ``pairs`` [2, P] -> [P].
    """

    def forward(self, z: torch.Tensor, pairs: torch.Tensor,
                rel: torch.Tensor | None = None) -> torch.Tensor:
        self._check(z, pairs, rel)
        if pairs.shape[1] == 0:
            return z.new_zeros(0) + 0 * z.sum()  # keeps the graph for an empty share
        csc = pair_csc(pairs, z.shape[0])
        scores = _PairDot.apply(z.contiguous(), csc)
        return scores if csc.inverse is None else scores.index_select(0, csc.inverse)

    def bce_sum(self, z: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor,
                pos_rel: torch.Tensor | None = None,
                neg_rel: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`PairDecoder.bce_sum` fused (:func:`ngra.kernels.pair_bce`): both sets'
        scores, loss and gradient in one call over their CSCs, no score vector kept."""
        sets = []
        for pairs, rel in ((pos, pos_rel), (neg, neg_rel)):
            known = pair_csc(pairs, z.shape[0], cached_only=True)
            self._check(z, pairs, rel, ids=known is None)  # a cached set was checked
            csc = known or (pair_csc(pairs, z.shape[0]) if pairs.shape[1] else None)
            sets.append(None if csc is None else (csc.indptr, csc.indices))
        return pair_bce(z, *sets)

    def score(self, src, dst, rel):
        return (src * dst).sum(-1)


class PairCSC:
    """Pairs ``[2, P]`` as a CSC graph over ``N`` vertices: ``indptr`` ``[N + 1]`` over
    destinations, ``indices`` the sources in that order, ``inverse`` ``[P]`` the CSC
    position of each pair (``None`` when the pairs come grouped by destination, as
    ``sample_negatives`` gives them); its transpose made on first use (and
    cached by the kernels)."""

    def __init__(self, pairs: torch.Tensor, num_nodes: int) -> None:
        src, dst = pairs[0], pairs[1]
        self.num_nodes = num_nodes
        self.inverse: torch.Tensor | None = None
        self._reverse: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if dst.numel() < 2 or bool((dst[1:] >= dst[:-1]).all()):  # grouped already
            counts = torch.bincount(dst, minlength=num_nodes)
            self.indptr = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
            self.indices = src
            return
        # grouped by destination with the transpose kernel's counting sort (no
        # comparison sort): the pairs as one column whose "sources" are their destinations
        one = torch.tensor([0, dst.numel()], dtype=torch.int64, device=dst.device)
        self.indptr, _, order = transpose_csc(one, dst, num_nodes)
        order = order.to(torch.int64)
        self.indices = src.index_select(0, order)
        self.inverse = torch.empty_like(order)
        self.inverse[order] = torch.arange(order.numel(), device=order.device)

    def reverse(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The transpose (CSR over sources), made on first use and kept here: a run's
        fixed pairs are transposed once, whatever else the kernels' cache sees."""
        if self._reverse is None:
            self._reverse = reverse_of(self.indptr, self.indices, self.num_nodes, None)
        return self._reverse


_CSC_CACHE: list[tuple[Any, int, int, PairCSC]] = []  # (weakref to pairs, version, N, csc)
_CSC_LOCK = threading.Lock()
#: Pair tensors whose CSC is kept: a run's fixed sets (training positives, validation and
#: test positives and negatives) and an epoch's negatives.
_CSC_KEEP = 8


def pair_csc(pairs: torch.Tensor, num_nodes: int, cached_only: bool = False) -> PairCSC | None:
    """The :class:`PairCSC` of ``pairs`` (cached for the last few pair tensors, by
    identity and version: a run's fixed pairs are sorted once); ``cached_only``: the
    cached one or ``None``."""
    version = pairs._version
    with _CSC_LOCK:
        for ref, v, n, csc in _CSC_CACHE:
            if ref() is pairs and v == version and n == num_nodes:
                return csc
    if cached_only:
        return None
    csc = PairCSC(pairs, num_nodes)
    with _CSC_LOCK:
        _CSC_CACHE[:] = [c for c in _CSC_CACHE if c[0]() is not None]
        _CSC_CACHE.insert(0, (weakref.ref(pairs), version, num_nodes, csc))
        del _CSC_CACHE[_CSC_KEEP:]
    return csc


class _PairDot(torch.autograd.Function):
    """Scores in CSC order: g-SDDMM ``dot``; backward two weighted g-SpMMs."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, csc: PairCSC) -> torch.Tensor:
        ctx.save_for_backward(z)
        ctx.csc = csc
        return gsddmm(csc.indptr, csc.indices, z, z, op="dot")

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (z,) = ctx.saved_tensors
        csc, grad = ctx.csc, grad.contiguous()
        # d s_e / d z_dst(e) = z_src(e), summed over each destination's pairs ...
        gz = gspmm(csc.indptr, csc.indices, z, grad, reduce="sum")
        # ... and d s_e / d z_src(e) = z_dst(e), over each source's pairs (the transpose)
        rev_indptr, rev_indices, rev_perm = csc.reverse()
        gz += gspmm(rev_indptr, rev_indices, z, grad.index_select(0, rev_perm), reduce="sum")
        return gz, None


class HadamardMLPDecoder(PairDecoder):
    r""":math:`s(u, v) = \mathrm{MLP}(z_u \odot z_v)`: ``layers`` Linears, ReLU and dropout
    between them, the last one to a single logit (OGB's ``LinkPredictor``).

    Args:
        dim: embedding width ``F``.
        hidden: hidden width.
        layers: number of Linears (default: 2).
        dropout: dropout between layers in training (default: 0.0).
        chunk: pairs scored at once (default: 65536).
    Shapes: ``z`` [N, dim], ``pairs`` [2, P] -> [P].
    """

    def __init__(self, dim: int, hidden: int, layers: int = 2, dropout: float = 0.0,
                 chunk: int = CHUNK) -> None:
        super().__init__(chunk)
        if layers < 1:
            raise ValueError(f"layers must be >= 1; got {layers}.")
        widths = [dim] + [hidden] * (layers - 1) + [1]
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.dropout = float(dropout)

    def score(self, src, dst, rel):
        h = src * dst
        for lin in self.lins[:-1]:
            h = nn.functional.dropout(torch.relu(lin(h)), self.dropout, self.training)
        return self.lins[-1](h).squeeze(-1)


class DistMultDecoder(PairDecoder):
    r""":math:`s(u, r, v) = \langle z_u, R_r, z_v \rangle`, one diagonal relation ``R_r``
    ``[F]`` per relation type.

    Args:
        dim: embedding width ``F``.
        num_relations: number of relation types; ``rel`` ids are in ``[0, num_relations)``.
        chunk: pairs scored at once (default: 65536).
    Shapes: ``z`` [N, dim], ``pairs`` [2, P], ``rel`` [P] -> [P].
    """

    needs_relation = True

    def __init__(self, dim: int, num_relations: int, chunk: int = CHUNK) -> None:
        super().__init__(chunk)
        self.relations = nn.Parameter(torch.empty(num_relations, dim))
        nn.init.xavier_uniform_(self.relations)

    def forward(self, z: torch.Tensor, pairs: torch.Tensor,
                rel: torch.Tensor | None = None) -> torch.Tensor:
        k = self.relations.shape[0]
        if rel is not None and rel.numel() and (int(rel.min()) < 0 or int(rel.max()) >= k):
            raise ValueError(f"DistMultDecoder: rel holds ids in [{int(rel.min())}, "
                             f"{int(rel.max())}]; expected [0, num_relations={k}).")
        return super().forward(z, pairs, rel)

    def score(self, src, dst, rel):
        return (src * self.relations.index_select(0, rel) * dst).sum(-1)
