r"""Graph readouts: one vector per graph from its nodes' rows.

A batch of graphs (:class:`~ngra.datasets.batching.GraphBatch`) keeps each graph's nodes
contiguous, ``ptr`` ``[B + 1]`` marking where each starts, so a readout is a segment
reduction over ``ptr``: the kernels' :func:`~ngra.kernels.segment_reduce` (``sum``,
``mean``, ``max``; forward and backward on every backend) and, for attention pooling,
:func:`~ngra.kernels.edge_softmax` (a softmax over each segment, here each graph's nodes):

.. math::
    \mathrm{sum}_b = \sum_{v \in b} x_v, \quad
    \mathrm{mean}_b = \frac{1}{|b|} \sum_{v \in b} x_v, \quad
    \mathrm{max}_b = \max_{v \in b} x_v, \quad
    \mathrm{att}_b = \sum_{v \in b} \mathrm{softmax}_{v \in b}(\mathrm{gate}(x_v))\, x_v

A graph without nodes reads out as 0 for every kind (max included: there is no row to
take the max of). The gradient of ``max`` goes to the first row reaching the maximum.
"""

from __future__ import annotations

import torch
from torch import nn

from ngra.kernels import edge_softmax, segment_reduce

__all__ = ["AttentionPool", "MaxPool", "MeanPool", "READOUTS", "SumPool", "readout"]

#: Readout kinds :func:`readout` takes.
READOUTS = ("sum", "mean", "max")


def _check(x: torch.Tensor, ptr: torch.Tensor) -> None:
    if not isinstance(ptr, torch.Tensor) or ptr.dim() != 1 or ptr.numel() < 1:
        raise ValueError(f"ptr must be a 1-D [num_graphs + 1] tensor of node offsets; got "
                         f"{ptr if not isinstance(ptr, torch.Tensor) else list(ptr.shape)}.")
    if int(ptr[-1]) != x.shape[0]:
        raise ValueError(f"ptr[-1] must equal the number of node rows: x has {x.shape[0]} rows, "
                         f"ptr ends at {int(ptr[-1])}. Pass the ptr of the batch x belongs to.")


def readout(x: torch.Tensor, ptr: torch.Tensor, kind: str = "sum") -> torch.Tensor:
    """Reduce each graph's node rows: ``out[b] = kind(x[ptr[b]:ptr[b+1]])``.

    Args:
        x: ``[N, *F]`` float32/float64 node rows, each graph's nodes contiguous.
        ptr: ``[B + 1]`` int64/int32 node offsets (``GraphBatch.ptr``).
        kind: ``"sum"``, ``"mean"`` or ``"max"`` (default: ``"sum"``).

    Returns:
        ``[B, *F]``; 0 for a graph without nodes.
    """
    if kind not in READOUTS:
        raise ValueError(f"readout kind must be one of {READOUTS}; got {kind!r}. For attention "
                         "pooling use AttentionPool(in_dim).")
    _check(x, ptr)
    return segment_reduce(ptr, x, kind)


class _Pool(nn.Module):
    kind = "sum"

    def forward(self, x: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
        """``[N, F]`` node rows and ``[B + 1]`` offsets -> ``[B, F]``."""
        return readout(x, ptr, self.kind)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"


class SumPool(_Pool):
    r"""Sum of each graph's node rows: :math:`\sum_{v \in b} x_v`. Shapes: ``x`` [N, F],
    ``ptr`` [B + 1] -> [B, F]."""

    kind = "sum"


class MeanPool(_Pool):
    r"""Mean of each graph's node rows (0 for a graph without nodes). Shapes as
    :class:`SumPool`."""

    kind = "mean"


class MaxPool(_Pool):
    r"""Elementwise max of each graph's node rows (0 for a graph without nodes). Shapes as
    :class:`SumPool`."""

    kind = "max"


class AttentionPool(nn.Module):
    r"""Global attention pooling (Li et al. 2016, PyG's ``AttentionalAggregation``):

    .. math::
        \mathrm{out}_b = \sum_{v \in b} \alpha_v\, h(x_v), \qquad
        \alpha = \mathrm{softmax}_{v \in b}\big(\mathrm{gate}(x_v)\big)

    Args:
        in_dim: node row width ``F``.
        gate: module ``[N, F] -> [N, 1]`` scoring nodes (default: ``nn.Linear(in_dim, 1)``).
        value: module ``[N, F] -> [N, F']`` applied before weighting (default: identity).

    Shapes: ``x`` [N, F], ``ptr`` [B + 1] -> [B, F'] (0 for a graph without nodes).
    """

    def __init__(self, in_dim: int, gate: nn.Module | None = None,
                 value: nn.Module | None = None) -> None:
        super().__init__()
        self.gate = nn.Linear(in_dim, 1) if gate is None else gate
        self.value = nn.Identity() if value is None else value

    def forward(self, x: torch.Tensor, ptr: torch.Tensor) -> torch.Tensor:
        _check(x, ptr)
        score = self.gate(x)
        if score.dim() != 2 or score.shape != (x.shape[0], 1):
            raise ValueError(f"gate must map [N, F] to [N, 1] scores; got {list(score.shape)} "
                             f"for x of shape {list(x.shape)}.")
        alpha = edge_softmax(ptr, score)
        return segment_reduce(ptr, alpha * self.value(x), "sum")
