"""What a plan's edge stage sees of one tile: its edges, with ids local to its staged rows.

The runtime builds and stages tiles (:mod:`ngra.runtime.tiles`,
:mod:`ngra.runtime.staging`); the compiler's plans read them. The type lives here, below
the runtime, so that both can name it.
"""

from __future__ import annotations

import torch

from ngra.graph import segment_ids

__all__ = ["Rev", "TileView"]

Rev = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class TileView:
    """One tile's edges, with ids local to the rows staged for it.

    Attributes:
        dst_lo, dst_hi: the destination interval ``[dst_lo, dst_hi)``; the staged
            destination rows are exactly these ``D`` rows.
        indptr: ``[D + 1]`` local CSC offsets over the interval.
        src_idx: ``[E_t]`` source of each tile edge (CSC order), a row of the
            staged source rows.
        edge_ids: ``[E_t]`` positions of the tile's edges in the graph's CSC edge
            order (``None``: every edge, in order); the stager gathers edge data with it.
        rev: the reverse (source-sorted) structure for backward kernels,
            ``(rev_indptr [S + 1] over the S staged source rows, rev_indices [E_t]
            local destinations, rev_perm [E_t] tile-CSC position of each CSR edge)``,
            the graph's :class:`~ngra.graph.CSR` (the whole-graph tile; its ``perm`` is
            built only for kernels that read edge data in backward), or ``None``
            (kernels transpose on demand).
        key: ``(column, row)`` of the tile in its grid.
        whole: the tile holds every edge of the graph (the 1 x 1 grid): no other
            tile merges into its accumulator state.
    """

    __slots__ = ("dst_lo", "dst_hi", "indptr", "src_idx", "edge_ids", "rev", "key", "whole",
                 "_dst_idx")

    def __init__(self, dst_lo: int, dst_hi: int, indptr: torch.Tensor, src_idx: torch.Tensor,
                 edge_ids: torch.Tensor | None, rev: Rev | None = None,
                 key: tuple[int, int] = (0, 0), whole: bool = False,
                 dst_idx: torch.Tensor | None = None) -> None:
        self.dst_lo, self.dst_hi = int(dst_lo), int(dst_hi)
        self.indptr, self.src_idx, self.edge_ids, self.rev = indptr, src_idx, edge_ids, rev
        self.key, self.whole = key, whole
        self._dst_idx = dst_idx

    @property
    def dst_idx(self) -> torch.Tensor:
        """``[E_t]`` local destination (row of the staged destination rows) of each edge."""
        if self._dst_idx is None:
            self._dst_idx = segment_ids(self.indptr, dtype=self.src_idx.dtype,
                                        total=self.src_idx.numel())
        return self._dst_idx

    @property
    def num_edges(self) -> int:
        return int(self.src_idx.numel())

    @property
    def num_dst(self) -> int:
        return self.dst_hi - self.dst_lo

    def __repr__(self) -> str:
        return f"TileView(dst=[{self.dst_lo}, {self.dst_hi}), edges={self.num_edges})"
