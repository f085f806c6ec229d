"""The executor's view of a graph that one process holds only a share of.

Multi-device training (:mod:`ngra.distributed`) gives every layer a
:class:`Partitioned` graph instead of an :class:`ngra.Graph`: the vertices (and vertex
data rows) this process owns, the in-edges of those vertices, and a way to bring in
what those edges read from other processes. Layers do not know: the executor runs the
plan's vertex-side ``pre`` stage on the owned rows, hands the terms to
:meth:`Partitioned.propagate` (which exchanges what the edge stage reads, then walks
the local tiles), and runs ``post`` on the owned rows. The exchange therefore carries
the plan's terms, after hoisting: often a narrow transformed row, never the raw input
when the plan reads something narrower.
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from ngra.compiler.plan import Plan

__all__ = ["Partitioned"]


class Partitioned(abc.ABC):
    """A process's share of a partitioned graph (see the module docstring).

    Attributes:
        num_nodes: rows of vertex data this process holds (its owned vertices).
        num_edges: its in-edges (edge data is given for these, in ``perm``'s order).
        perm: ``[num_edges]`` position of each local CSC edge in the local edge order.
        edge_ids: ``[num_edges]`` each local CSC edge's id in the whole graph's original
            edge order: the counters a softmax gather's attention dropout hashes its masks
            from, so every process draws the masks of one whole-graph run.
        edge_weight: ``[num_edges]`` weights in local CSC order, or ``None``.
    """

    num_nodes: int
    num_edges: int
    perm: torch.Tensor
    edge_ids: torch.Tensor
    edge_weight: torch.Tensor | None

    @abc.abstractmethod
    def in_degrees(self) -> torch.Tensor:
        """``[num_nodes]`` in-degree of each owned vertex (all its in-edges are local)."""

    @abc.abstractmethod
    def propagate(self, plan: Plan, terms: Any, edata: Any, drop: Any = None) -> Any:
        """The accumulator ``[num_nodes, ...]`` of ``plan``'s edge stage over the local
        in-edges, given the owned rows of ``pre``'s terms and the edge data (CSC order);
        ``drop``: a softmax gather's attention dropout over the local CSC edges (an
        :class:`~ngra.kernels.EdgeDropout` whose counters are :attr:`edge_ids`), or ``None``."""

    @abc.abstractmethod
    def explain_lines(self, plan: Plan, terms: Any) -> list[str]:
        """Where the exchange sits in ``plan`` and how many bytes it moves."""
