"""The generic plan: runs any SAGA program with edge tensors materialized.

This is the semantics every compiled plan must reproduce, and the fallback for
programs the compiler cannot fuse: Scatter gathers, from the tile's staged
vertex rows (:mod:`ngra.runtime.staging`), the rows each edge reads,
``apply_edge`` runs on the tile's edges, and the accumulator reduces the
result per destination. On the whole-graph tile ``apply_edge`` runs on a chunk of
edges at a time (:mod:`ngra.compiler.chunked`: no ``[E, F]`` tensor outlives a chunk,
backward recomputes each chunk), unless the edges fit one chunk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ngra import probes
from ngra.compiler import chunked
from ngra.compiler.describe import generic_lines
from ngra.compiler.gather import make_accumulator
from ngra.compiler.passes import PassNote
from ngra.compiler.plan import Plan, Pre
from ngra.compiler.tile import TileView
from ngra.edge import Edge
from ngra.graph import EdgeFactors


__all__ = ["FallbackPlan", "GenericPlan", "check_vertex_output"]


class GenericPlan(Plan):
    """Edge stage = ``apply_edge`` on materialized per-edge rows."""

    kind = "generic"
    edge_kinds = ("generic",)

    def __init__(self, layer: Any, reason: str = "generic executor requested") -> None:
        self.layer = layer
        self.accumulator = make_accumulator(layer.gather)
        self.reason = reason

    def pre(self, x: Any, dropout: float = 0.0) -> Pre:
        """``x`` itself: the UDFs read the (already dropped) vertex data."""
        if dropout:
            raise ValueError(f"{self.layer_name}: the generic plan does not fuse an input "
                             "dropout; apply the dropout to x before pre.")
        return Pre(x)

    def edge(self, tile: TileView, src: Any, dst: Any, edata: Any, drop: Any = None,
             carry: Any = None) -> Any:
        """The tile's partial state from its staged source / destination rows and edge data
        (``drop``: a softmax gather's attention dropout on the tile's edges, or ``None``)."""
        chunks = self.edge_chunks(tile, src, edata)
        if chunks is not None:
            return chunked.run_chunked(chunks, tile, self.accumulator, self._chunk_messages,
                                       src, edata, list(self.layer.parameters()), drop)
        edge_view = _ProbedEdge if probes.active() else Edge
        if isinstance(edata, EdgeFactors):  # the UDF reads one weight per edge
            edata = edata.per_edge(tile.src_idx, tile.dst_idx)
        with probes.stage("apply_edge") as s:
            msg = s.outputs(self.layer.apply_edge(
                edge_view(src, dst, tile.src_idx, tile.dst_idx, edata)))
        _check_messages(self.layer, msg, tile.num_edges)
        with probes.stage("gather") as s:
            return s.outputs(self.accumulator.partial(tile.indptr, msg, drop))

    def edge_chunks(self, tile: TileView, terms: Any, edata: Any) -> chunked.Chunks | None:
        """How the whole-graph tile's edges run in chunks, or ``None``: all at once."""
        if not tile.whole or (isinstance(edata, EdgeFactors)
                              and (edata.src.requires_grad or edata.dst.requires_grad)):
            return None
        return chunked.chunks_for(tile.indptr, tile.num_edges, chunked.row_bytes(terms, edata))

    def _chunk_messages(self, rows: chunked.Rows) -> Any:
        msg = self.layer.apply_edge(chunked.ChunkEdge(rows))
        _check_messages(self.layer, msg, rows.src_idx.numel())
        return msg

    def post(self, x: Any, acc: Any, graph: Any = None, carry: Any = None) -> Any:
        out = self.layer.apply_vertex(x, acc)
        check_vertex_output(self.layer_name, out, acc)
        return out

    def describe(self) -> list[str]:
        return generic_lines(self, self.notes)


class FallbackPlan(GenericPlan):
    """The generic UDF executor, with the compiler's notes on why nothing was fused."""

    def __init__(self, layer: Any, reason: str, notes: Sequence[PassNote] | None = None) -> None:
        super().__init__(layer, reason)
        self.notes = list(notes or [])


class _ProbedEdge(Edge):
    """An :class:`Edge` whose lazy row gathers are timed as the ``scatter`` stage
    (they run inside ``apply_edge``, whose exclusive time excludes them)."""

    __slots__ = ()

    @property
    def src(self) -> Any:
        with probes.stage("scatter") as s:
            return s.outputs(Edge.src.fget(self))

    @property
    def dst(self) -> Any:
        with probes.stage("scatter") as s:
            return s.outputs(Edge.dst.fget(self))


def _check_messages(layer: Any, msg: Any, num_edges: int) -> None:
    name = type(layer).__name__
    parts = msg if isinstance(msg, tuple) else (msg,)
    if isinstance(msg, dict):
        parts = tuple(msg.values())
    for m in parts:
        if not isinstance(m, torch.Tensor):
            raise TypeError(
                f"{name}.apply_edge must return a tensor (or a dict of tensors, or "
                f"(score, value) for softmax); got {type(m).__name__}."
            )
        if m.dim() == 0 or m.shape[0] != num_edges:
            raise ValueError(
                f"{name}.apply_edge must return one row per edge ([{num_edges}, ...]); "
                f"got shape {list(m.shape)}."
            )


def check_vertex_output(name: str, out: Any, acc: Any) -> None:
    """Raise a ``ValueError`` unless ``apply_vertex``'s result ``out`` is a tensor, or a dict
    of tensors, with one row per vertex: as many rows as the accumulator ``acc`` it was
    given (the call's destination vertices: all of them, or a streamed column's). Shapes
    only, no device sync: a wrong row count would otherwise broadcast silently or crash
    far downstream."""
    first = next(iter(acc.values()), None) if isinstance(acc, Mapping) else acc
    rows = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() else None
    n = "N" if rows is None else rows
    want = (f"{name}.apply_vertex must return one row per vertex ([{n}, ...], as many rows "
            "as acc), a tensor or a dict of such tensors")
    parts = out.items() if isinstance(out, Mapping) else ((None, out),)
    for k, t in parts:
        field = "" if k is None else f"field {k!r} "
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{want}; got {field}{type(t).__name__}.")
        if t.dim() == 0 or (rows is not None and t.shape[0] != rows):
            raise ValueError(
                f"{want}; got {field}shape {list(t.shape)}. Dim 0 is the vertices: keep it "
                "whole (reduce, slice or transpose only the feature dims)."
            )
