r"""Link decoders: a score per vertex pair from the encoder's vertex embeddings.

Each decoder maps embeddings ``z`` ``[N, F]`` and pairs ``[2, P]`` (row 0 the sources,
row 1 the destinations) to ``[P]`` **logits** (train with ``BCEWithLogitsLoss``; a
probability is ``sigmoid(score)``):

* :class:`DotDecoder`: :math:`s(u, v) = z_u \cdot z_v`.
* :class:`HadamardMLPDecoder`: :math:`s(u, v) = \mathrm{MLP}(z_u \odot z_v)` (OGB's
  ``LinkPredictor``).
* :class:`DistMultDecoder`: :math:`s(u, r, v) = \sum_f z_{u,f}\, R_{r,f}\, z_{v,f}`
  (Yang et al. 2015; R-GCN's link decoder).

**Chunks.** Pairs are scored ``chunk`` at a time, so the gathered ``[p, F]`` rows of
one chunk are the largest temporaries: scoring all ``N^2`` candidate pairs of an
evaluation never builds ``[P, F]``. With autograd recording, each chunk runs under
activation checkpointing (its gathered rows are recomputed in backward rather than
kept), so training memory is bounded the same way; gradients equal the unchunked ones
(dropout in the MLP replays the same mask, torch's checkpoint restores the RNG state).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["CHUNK", "DistMultDecoder", "DotDecoder", "HadamardMLPDecoder", "PairDecoder"]

#: Pairs scored at once by default.
CHUNK = 1 << 16


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

    def _chunk(self, z: torch.Tensor, s: torch.Tensor, d: torch.Tensor,
               r: torch.Tensor | None) -> torch.Tensor:
        return self.score(z.index_select(0, s), z.index_select(0, d), r)

    def _check(self, z: torch.Tensor, pairs: torch.Tensor, rel: torch.Tensor | None) -> None:
        name = type(self).__name__
        if z.dim() != 2:
            raise ValueError(f"{name}: z must be [N, F] embeddings; got {list(z.shape)}.")
        if pairs.dim() != 2 or pairs.shape[0] != 2 or pairs.is_floating_point():
            raise ValueError(f"{name}: pairs must be a [2, P] integer tensor (sources, "
                             f"destinations); got {pairs.dtype} {list(pairs.shape)}. If you "
                             "have [P, 2], pass pairs.t().")
        if pairs.numel() and (int(pairs.min()) < 0 or int(pairs.max()) >= z.shape[0]):
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
    r""":math:`s(u, v) = z_u \cdot z_v`. No parameters.

    Args:
        chunk: pairs scored at once (default: 65536).
    Shapes: ``z`` [N, F], ``pairs`` [2, P] -> [P].
    """

    def score(self, src, dst, rel):
        return (src * dst).sum(-1)


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
