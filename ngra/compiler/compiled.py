"""A compiled plan: the stages of a lowered program (:func:`ngra.compiler.lower.lower`).

:class:`CompiledPlan` implements :class:`~ngra.compiler.plan.Plan`:

* ``pre`` runs the program's pre stage (hoisted terms, a transform moved before
  propagation), a dict ``term key -> [N, ...]``; an input dropout runs inside the Linears
  of ``x`` (:func:`~ngra.kernels.dropout_linear`), which also make the vertex stage's
  Linears of ``x`` that share a weight with pre's; an ``x`` memory-mapped from disk is read
  a block of rows at a time;
* ``edge`` runs the lowered edge stage on a staged tile
  (:class:`~ngra.compiler.edge_stage.EdgeStage`);
* ``post`` applies the Linear the sink pass moved past the gather (it reads the graph's
  in-degrees), then ApplyVertex (the UDF, or its rewritten IR after a reorder).

A softmax whose scores are rowdots of its own value (``SoftmaxMatch.weights``, GAT) runs
on the whole-graph tile as :func:`~ngra.kernels.attention_aggregate`. When pre made that
value from the plain ``x`` and parameters by closed ops, pre also hands on (weakly: the
value and ``x`` must not live longer for it) how to make it again, replaying its input
dropout's masks; the edge stage hands that :class:`~ngra.kernels.Recompute` to the kernel,
which then saves no value for backward.

What one call's ``pre`` hands its ``edge`` and ``post`` travels in the returned
:class:`Carry`; the plan itself is never written after lowering, so one plan serves
overlapping calls.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from ngra import kernels
from ngra.compiler.describe import compiled_lines
from ngra.compiler.edge_stage import EdgeStage, StagedTile
from ngra.compiler.generic import check_vertex_output
from ngra.compiler.interp import Resolver, apply_sink, evaluate, run_stage
from ngra.compiler.ir import Node, Op, Program
from ngra.compiler.passes import PassNote
from ngra.compiler.passes.fuse import SoftmaxMatch
from ngra.compiler.plan import Plan, Pre
from ngra.compiler.tile import TileView
from ngra.kernels.fused_edge import partials_judged_on
from ngra.mapped import is_mapped, release_mapped

__all__ = ["Carry", "CompiledPlan", "Linears", "PRE_BLOCK_BYTES", "RECOMPUTE_VALUE_BYTES"]

#: Bytes of a memory-mapped input per block of a streamed ``pre`` (see ``_pre_rows``).
PRE_BLOCK_BYTES = 1 << 24
#: A softmax value term (GAT's ``dropout(x) W``) at least this large is made again from
#: ``x`` in backward instead of saved; a smaller one is saved: on a small graph the saved
#: bytes are few and the GEMM again is a sixth of a Cora GAT step (17.2 -> 14.7 ms).
RECOMPUTE_VALUE_BYTES = 1 << 24

#: ``(linear, weight, bias or None)`` node ids of a stage's Linears of ``x``.
Linears = list[tuple[int, int, int | None]]


class Carry(NamedTuple):
    """What one call's :meth:`CompiledPlan.pre` hands to its edge stage and ``post``.

    Attributes:
        vertex_linears: ``({vertex-stage Linear node: its output}, whether post may
            overwrite them)``: the vertex stage's Linears of ``x`` (of ``dropout(x)``),
            made by pre with its own; or ``None``.
        recompute: ``(weak ref to pre's softmax value term, weak ref to x, Recompute.fn,
            parameters)``: how attention_aggregate can make the value again; or ``None``.
    """

    vertex_linears: tuple[dict[int, Any], bool] | None
    recompute: tuple | None


class CompiledPlan(Plan):
    """A plan whose edge stage runs fused kernels (see the module docstring).

    Args:
        layer: the SAGA layer (held weakly, through the :class:`~ngra.compiler.interp.Resolver`).
        program: the lowered program.
        notes: the passes' notes.
        dropout_linears: pre's Linears that read ``x`` alone, into which an input dropout
            fuses (empty: it does not fuse), ``dropout_note`` saying why (not).
        vertex_dropout_linears: the vertex stage's Linears of ``x``.
        shared_linears: a vertex-stage Linear of ``x`` has a pre Linear's weight: pre makes
            both at once.
        value_recipe: how the softmax value is made from ``x`` (``lower._value_recipe``),
            or ``None``.
    """

    kind = "compiled"

    def __init__(self, layer: Any, program: Program, notes: Sequence[PassNote],
                 dropout_linears: Linears, vertex_dropout_linears: Linears, dropout_note: str,
                 shared_linears: bool, value_recipe: tuple | None) -> None:
        self.program = program
        self.notes = list(notes)
        self.resolver = Resolver(layer)
        self.edges = EdgeStage(program, self.resolver)
        self.accumulator = self.edges.accumulator
        self.gather = program.gather
        self.edge_kinds = tuple(m.kind for m in program.lowering.values())
        self.dropout_linears = dropout_linears
        self.vertex_dropout_linears = vertex_dropout_linears
        self.dropout_note = dropout_note
        self._shared_linears = shared_linears
        self._value_recipe = value_recipe

    @property
    def layer(self) -> Any:
        return self.resolver.layer

    # ------------------------------------------------------------------ queries
    def edge_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the edge stage reads (the streaming runtime differentiates
        each recomputed tile with respect to them)."""
        return self.edges.parameters()

    def edge_reads(self) -> tuple[set, set]:
        """``(src_keys, dst_keys)``: the terms the edge stage reads from sources / destinations."""
        return self.edges.reads()

    def edge_chunks(self, tile: TileView, terms: Any, edata: Any) -> Any:
        return self.edges.chunks(tile, terms, terms, edata)

    def post_reads_x(self) -> bool:
        """Whether ``post`` reads ``x`` (apply_vertex as written always may)."""
        vertex = self.program.vertex
        return vertex is None or any(n.op == Op.VERTEX for n in vertex.nodes.values())

    @property
    def linear_edge(self) -> bool:
        """The kernels' outputs feed a linear accumulator unchanged."""
        return self.accumulator.linear

    def runs_attention_aggregate(self) -> bool:
        """Whether a whole-graph tile whose sources are its destinations runs
        :func:`~ngra.kernels.attention_aggregate` (a softmax gather whose scores are
        rowdots of its own value, GAT): its backward walks the edges one more time than
        ``softmax_aggregate``'s, which the exchange cost model counts."""
        m = self.program.lowering.get(None)
        return isinstance(m, SoftmaxMatch) and m.weights is not None

    def fuses_input_dropout(self, x: Any) -> bool:
        """Whether :meth:`pre` can apply an input dropout inside the Linears that read ``x``
        (a plain ``[N, F]`` tensor: :func:`~ngra.kernels.dropout_linear` works on rows)."""
        return (bool(self.dropout_linears or self.vertex_dropout_linears)
                and isinstance(x, torch.Tensor) and x.dim() == 2)

    @contextlib.contextmanager
    def judged_on(self, indptr: torch.Tensor) -> Iterator[None]:
        """Fused edge kernels judge whether their dst partials pay on ``indptr``
        (:func:`~ngra.kernels.fused_edge.partials_judged_on`)."""
        with partials_judged_on(indptr):
            yield

    # ------------------------------------------------------------------ stages
    def pre(self, x: Any, dropout: float = 0.0) -> Pre:
        """The vertex-side terms; with ``dropout > 0`` (only where :meth:`fuses_input_dropout`)
        of ``dropout(x)``, computed by :func:`ngra.kernels.dropout_linear`: one mask, no
        dropped copy of ``x``. The carry (a :class:`Carry`, or ``None``) holds the vertex
        stage's Linears of ``x`` made here with pre's, and how the softmax value can be made
        again in backward."""
        def vertex(n: Node) -> Any:
            k = n.attrs["key"]
            return x if k is None else x[k]

        preset: dict[int, Any] = {}
        vertex_linears = None
        if dropout and not self.fuses_input_dropout(x):
            raise ValueError(f"{self.layer_name}: {self.dropout_note}; apply the dropout "
                             "to x before pre.")
        streams = not torch.is_grad_enabled() and _mapped_input(x)
        # training on an x mapped from disk: its Linears read it a block at a time
        mapped_grad = (torch.is_grad_enabled() and _mapped_input(x)
                       and self.fuses_input_dropout(x))
        if dropout or mapped_grad or (self._shared_linears and isinstance(x, torch.Tensor)
                                      and not streams):
            preset, vertex_linears, outs = self._x_linears(x, dropout, vertex)
        if not dropout and streams:
            terms = self._pre_rows(x)
        else:
            terms = run_stage(self.program.pre, vertex, self.resolver, preset)
        recompute = None
        if self._value_recipe is not None and isinstance(x, torch.Tensor) \
                and _nbytes(terms[self._value_recipe[0]]) >= RECOMPUTE_VALUE_BYTES:
            masks = kernels.dropout_masks(outs[0]) if dropout else None
            recompute = self._recompute_value(terms, x, dropout, masks)
        if vertex_linears is None and recompute is None:
            return Pre(terms)
        return Pre(terms, Carry(vertex_linears, recompute))

    def _x_linears(self, x: torch.Tensor, dropout: float, vertex: Any) -> tuple:
        """Every Linear of ``x`` (of ``dropout(x)``) in pre and in the vertex stage, each
        distinct weight once (GIN's reordered self term shares pre's), in one
        :func:`~ngra.kernels.dropout_linear` call: ``(pre's preset, (vertex stage's preset,
        whether post may overwrite it), outputs)``."""
        stages = ((self.program.pre, self.dropout_linears),
                  (self.program.vertex, self.vertex_dropout_linears))
        slots: list[int] = []  # the unique (weight, bias) each Linear reads
        weights: list = []
        biases: list = []
        for stage, lins in stages:
            args = [a for _, w, b in lins for a in (w, b) if a is not None]
            env = evaluate(stage, args, vertex, self.resolver)
            for _, w, b in lins:
                wb = (env[w], None if b is None else env[b])
                i = next((i for i, (u, v) in enumerate(zip(weights, biases))
                          if u is wb[0] and v is wb[1]), len(weights))
                if i == len(weights):
                    weights.append(wb[0])
                    biases.append(wb[1])
                slots.append(i)
        outs = (kernels.dropout_linear(x, weights, biases, dropout)
                if dropout or _mapped_input(x)  # a mapped x streams (dropout or not)
                else [F.linear(x, w, b) for w, b in zip(weights, biases)])
        cut = len(self.dropout_linears)
        preset = {lin: outs[i] for (lin, _, _), i in zip(self.dropout_linears, slots)}
        mine = {lin: outs[i] for (lin, _, _), i in zip(self.vertex_dropout_linears, slots[cut:])}
        alone = all(slots.count(i) == 1 for i in slots[cut:])
        return preset, (mine, alone), outs

    def _pre_rows(self, x: torch.Tensor) -> dict:
        """``pre`` a block of rows at a time (it is row-wise), for an ``x`` memory-mapped
        from the on-disk store: each block's pages are dropped once read, so ``x``
        streams from disk instead of becoming resident."""
        rows = max(1, PRE_BLOCK_BYTES // max(x[:1].numel() * x.element_size(), 1))
        pre = self.program.pre
        # terms that are x itself stay x (mapped), as the whole-array stage returns them
        terms: dict = {k: x for k, r in pre.outputs.items() if pre.nodes[r.id].op == Op.VERTEX}
        for r0 in range(0, x.shape[0], rows):
            block = x[r0:r0 + rows]
            part = run_stage(pre, lambda n: block, self.resolver)
            release_mapped(x, r0, r0 + block.shape[0])
            for k, v in part.items():
                if terms.get(k) is x:
                    continue
                if k not in terms:
                    terms[k] = v.new_empty((x.shape[0],) + tuple(v.shape[1:]))
                terms[k][r0:r0 + block.shape[0]] = v
        return terms

    def _recompute_value(self, terms: dict, x: torch.Tensor, dropout: float,
                         masks: Any) -> tuple | None:
        """How attention_aggregate can make the softmax value term again from ``x`` and
        the parameters (a Recompute that replays the input dropout's ``masks``), with
        pre's value term it stands for."""
        key, root, params, all_dropout = self._value_recipe
        if dropout and (not all_dropout or masks is None):
            return None  # the value would need its own draw of the one dropout mask
        pre, resolver, lins = self.program.pre, self.resolver, self.dropout_linears

        def fn(x_: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
            def vertex(_n: Node) -> torch.Tensor:
                return x_

            preset = dict(zip(params, ps))
            if dropout:  # as in pre: one mask for every Linear of x (all are the value's)
                wb = [a for _, w, b in lins for a in (w, b) if a is not None]
                env = evaluate(pre, wb, vertex, resolver, preset)
                outs = kernels.dropout_linear(
                    x_, [env[w] for _, w, _ in lins],
                    [None if b is None else env[b] for _, _, b in lins], dropout, masks=masks)
                preset.update((lin, o) for (lin, _, _), o in zip(lins, outs))
            return evaluate(pre, [root], vertex, resolver, preset)[root]

        env = evaluate(pre, params, lambda _n: x, resolver)
        # weak: the plan outlives the step, and x (an activation, for a second layer) must
        # not stay alive, nor look shared to in-place backward kernels, through it
        return (weakref.ref(terms[key]), weakref.ref(x), fn, [env[i] for i in params])
    def edge(self, tile: TileView, src: Any, dst: Any, edata: Any, drop: Any = None,
             carry: Carry | None = None) -> Any:
        return self.edges.run(tile, src, dst, edata, drop,
                              carry.recompute if carry is not None else None)

    def post(self, x: Any, acc: Any, graph: Any = None, carry: Carry | None = None) -> Any:
        if self.program.sink is not None:
            if graph is None:
                raise ValueError(f"{self.layer_name}: this plan applies a Linear after the "
                                 "gather and needs the graph's in-degrees (post(x, acc, graph)).")
            acc = apply_sink(self.program.sink, self.gather, acc, graph.in_degrees(),
                             self.resolver)
        # pre's dropout_linear made the Linears of x (of dropout(x)): the vertex IR runs
        # with them (the traced UDF, when not rewritten: the interpreter computes the same)
        linears, owned = (carry.vertex_linears if carry is not None else None) or (None, False)
        if not self.program.vertex_rewritten and not linears:
            out = self.resolver.layer.apply_vertex(x, acc)
        else:
            def inputs(n: Node) -> Any:
                k = n.attrs["key"]
                if n.op == Op.ACC:
                    return acc if k is None else acc[k]
                return x if k is None else x[k]

            out = run_stage(self.program.vertex, inputs, self.resolver, linears, owned=owned)
        check_vertex_output(self.layer_name, out, acc)
        return out

    def tile_grads(self, staged: StagedTile, final: Any, grad: torch.Tensor) -> list | None:
        return self.edges.tile_grads(staged, final, grad)

    def describe(self) -> list[str]:
        return compiled_lines(self)


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _mapped_input(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] > 0 and is_mapped(x)
