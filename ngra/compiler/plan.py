"""The plan interface: what the runtime calls on a compiled (or generic) layer.

A layer call runs a plan's three stages:

* ``pre(x, dropout) -> Pre(terms, carry)``: the vertex-side stage. ``terms`` are what the
  edge stage reads (hoisted terms, a transform moved before propagation), ``[N, ...]``;
  ``carry`` is what this call's edge stage and ``post`` need of it besides the terms
  (opaque to the caller, ``None`` when nothing): the caller hands it on, the plan keeps
  nothing;
* ``edge(tile, src, dst, edata, drop, carry) -> partial``: the accumulator's partial state
  of one staged :class:`~ngra.compiler.tile.TileView`, from its staged source rows
  ``src``, destination rows ``dst`` (both shaped like the terms) and edge data rows
  ``edata``; ``drop`` is a softmax gather's attention dropout on the tile's edges;
* ``post(x, acc, graph, carry) -> out``: ApplyVertex on the gathered ``acc``.

A plan is a value: the compiler caches one per layer and input signature, and two calls
of one layer (threads, re-entrant calls) may run its stages at once. Per-call data goes
through ``carry``, never onto the plan.

The rest of :class:`Plan` is what the runtime asks of a plan to stage, stream, budget and
explain it; each has a default here that is right for the generic plan.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol

import torch

from ngra.compiler.tile import TileView

if TYPE_CHECKING:
    from ngra.compiler.gather import Accumulator
    from ngra.compiler.ir import Program
    from ngra.compiler.passes import PassNote

__all__ = ["Plan", "Pre", "StagedTile"]


class Pre(NamedTuple):
    """What :meth:`Plan.pre` returns.

    Attributes:
        terms: the vertex terms the edge stage reads: a dict ``term key -> [N, ...]``
            (compiled) or the vertex data itself (generic).
        carry: what this call's :meth:`Plan.edge` and :meth:`Plan.post` read besides the
            terms, to be handed to them; ``None`` when nothing.
    """

    terms: Any
    carry: Any = None


class StagedTile(Protocol):
    """A tile staged for its edge stage (:class:`ngra.runtime.staging.Staged`)."""

    view: TileView
    src: Any
    dst: Any
    edata: Any
    drop: Any


class Plan(abc.ABC):
    """A layer's executable plan (see the module docstring).

    Attributes:
        kind: ``"generic"`` or ``"compiled"``.
        layer: the SAGA layer the plan runs (its parameters are read at run time).
        accumulator: the Gather accumulator (:func:`ngra.compiler.gather.make_accumulator`).
        edge_kinds: how the edge stage runs, one entry per lowered output (``"gspmm"``,
            ``"softmax_aggregate"``, ``"fused_edge"``, ``"interp"``; ``"generic"``).
        program: the compiled program, or ``None`` (generic).
        notes: the compiler passes' notes (why they did or did not fire).
        reason: why the generic plan runs, or ``""``.
    """

    kind: ClassVar[str]
    layer: torch.nn.Module
    accumulator: Accumulator
    edge_kinds: tuple[str, ...]
    program: Program | None = None
    notes: Sequence[PassNote] = ()
    reason: str = ""

    @property
    def layer_name(self) -> str:
        return type(self.layer).__name__

    # ------------------------------------------------------------------ stages
    @abc.abstractmethod
    def pre(self, x: Any, dropout: float = 0.0) -> Pre:
        """The vertex-side stage; ``dropout > 0`` only where :meth:`fuses_input_dropout`."""

    @abc.abstractmethod
    def edge(self, tile: TileView, src: Any, dst: Any, edata: Any, drop: Any = None,
             carry: Any = None) -> Any:
        """The accumulator's partial state of one staged tile."""

    @abc.abstractmethod
    def post(self, x: Any, acc: Any, graph: Any = None, carry: Any = None) -> Any:
        """ApplyVertex on the gathered ``acc`` (``graph``: what it reads of the graph, its
        in-degrees; ``x`` may be ``None`` where :meth:`post_reads_x` is false)."""

    @abc.abstractmethod
    def describe(self) -> list[str]:
        """The explain lines."""

    # ------------------------------------------------------------------ queries
    def fuses_input_dropout(self, x: Any) -> bool:
        """Whether :meth:`pre` applies an input dropout of ``x`` itself (else the caller
        drops ``x`` first)."""
        return False

    def edge_reads(self) -> tuple[set, set] | None:
        """``(src_keys, dst_keys)``: the terms the edge stage reads per side (only those
        are staged), or ``None``: all of them."""
        return None

    def edge_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the edge stage may read (the streaming runtime differentiates
        each recomputed tile with respect to them); by default the whole layer's."""
        return list(self.layer.parameters())

    def post_reads_x(self) -> bool:
        """Whether :meth:`post` reads the layer input ``x``."""
        return True

    def edge_chunks(self, tile: TileView, terms: Any, edata: Any) -> Any:
        """How the edge stage runs ``tile`` (whole-graph, with ``pre``'s ``terms``) in chunks
        of edges (a :class:`~ngra.compiler.chunked.Chunks`), or ``None``: all at once."""
        return None

    @property
    def linear_edge(self) -> bool:
        """Whether the edge stage's kernels feed a linear accumulator unchanged, so a
        recomputed tile needs their autograd graph, not their values
        (:func:`ngra.kernels.backward_only`)."""
        return False

    def runs_attention_aggregate(self) -> bool:
        """Whether the whole-graph tile runs :func:`~ngra.kernels.attention_aggregate`
        (the exchange cost model counts its extra backward walk)."""
        return False

    def tile_grads(self, staged: StagedTile, final: Any, grad: torch.Tensor) -> list | None:
        """Gradients of one tile's share of the output without recomputing its forward,
        ``[(staged rows, their gradient), ...]``, or ``None``: no direct rule (the
        runtime recomputes the tile under autograd)."""
        return None

    @contextlib.contextmanager
    def judged_on(self, indptr: torch.Tensor) -> Iterator[None]:
        """Inside the block, the edge stage's kernels make their graph-dependent choices
        as on the graph of ``indptr`` (``[N + 1]`` CSC offsets), not on the tile they run
        on: a memory budget prices a layer on a sample of its graph."""
        yield
