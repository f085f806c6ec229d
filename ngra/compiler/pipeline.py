"""The compiler pipeline: trace -> analyze -> split -> hoist -> sink -> reorder -> contract -> fuse
-> lower.

The IR is verified after tracing and after every pass. Each pass is one file in
:mod:`ngra.compiler.passes`; this is the only place that orders them.

A pass that raises is a compiler bug: the layer runs on the generic plan (same results),
with the error logged and named in ``ngra.explain``. Inside :func:`strict` (the test
suite's default) the error propagates instead, so a broken pass cannot hide behind the
fallback; so does ``NGRA_STRICT_PASSES=1`` (:mod:`ngra.settings`). A pass that does not
apply declines with a note; it never raises.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ngra.compiler.analysis import Samples, annotate
from ngra.compiler.interp import Resolver
from ngra.compiler.ir import Op, Program, verify
from ngra.compiler.passes import PassNote, contract, fuse, hoist, reorder, sink, split
from ngra.compiler.passes.fuse import InterpMatch
from ngra.compiler.trace import TraceFailure, trace_program, trace_vertex
from ngra.settings import get

__all__ = ["PASSES", "Compiled", "compile_program", "is_strict", "strict"]

log = logging.getLogger(__name__)

_strict = False

PASSES: tuple[tuple[str, Callable[[Program], PassNote]], ...] = (
    ("split", split.run),
    ("hoist", hoist.run),
    ("sink", sink.run),
    ("reorder", reorder.run),
    ("contract", contract.run),
    ("fuse", fuse.run),
)


def is_strict() -> bool:
    """Whether a failing pass raises (inside :func:`strict`, or with
    ``NGRA_STRICT_PASSES=1``) instead of falling back."""
    return _strict or bool(get("NGRA_STRICT_PASSES"))


@contextlib.contextmanager
def strict(flag: bool = True) -> Iterator[None]:
    """Inside the block, a pass that raises fails the compilation (the exception
    propagates) instead of sending the layer to the generic plan. Process-wide.

    Example::

        with ngra.compiler.strict():
            out = layer(graph, x)  # a compiler bug raises here
    """
    global _strict
    prev, _strict = _strict, bool(flag)
    try:
        yield
    finally:
        _strict = prev


@dataclass
class Compiled:
    """The pipeline's result: a program to lower, or the reason to run the generic plan."""

    program: Program | None
    notes: list[PassNote] = field(default_factory=list)
    reason: str = ""


def _run_device(layer: Any) -> torch.device | None:
    """Where the plan's stages will run: the device of ``layer``'s parameters when they
    share one (device streaming keeps the data in host memory and runs every stage
    there), else ``None`` (wherever the data is)."""
    devices = {p.device for p in layer.parameters()}
    return next(iter(devices)) if len(devices) == 1 else None


def compile_program(layer: Any, x: Any, edata: Any) -> Compiled:
    """Run the pipeline on ``layer`` for inputs shaped like ``x`` / ``edata`` (CSC order)."""
    notes: list[PassNote] = []
    name = type(layer).__name__
    try:
        program = trace_program(layer, x, edata)
    except TraceFailure as exc:
        notes.append(PassNote("trace", False, str(exc)))
        return Compiled(None, notes, str(exc))
    vertex_note = ""
    try:
        trace_vertex(program, layer, x)
    except TraceFailure as exc:
        vertex_note = f"; {exc} (apply_vertex runs as written)"
    resolver = Resolver(layer)
    samples = Samples(x, edata, _run_device(layer))
    annotate(program, samples, resolver)
    verify(program, annotated=True)
    n_edge = len(program.edge.nodes)
    n_opaque = sum(n.op == Op.OPAQUE for n in program.edge.nodes.values())
    summary = f"apply_edge: {n_edge} IR nodes ({n_opaque} opaque)"
    if program.vertex is not None:
        summary += f"; apply_vertex: {len(program.vertex.nodes)} IR nodes"
    notes.append(PassNote("trace", True, summary + vertex_note))

    blocker = program.as_written.get("edge")
    if blocker:
        return Compiled(None, notes, blocker)

    for pass_name, fn in PASSES:
        try:
            notes.append(fn(program))
            annotate(program, samples, resolver)
            verify(program, annotated=True)
        except Exception as exc:  # noqa: BLE001 - a pass bug must never change results
            if is_strict():
                raise
            log.error("compiler pass %s failed on %s: %s: %s", pass_name, name,
                      type(exc).__name__, exc)
            return Compiled(None, notes, f"internal compiler error in pass {pass_name}: "
                                         f"{type(exc).__name__}: {exc}")

    changed = any(n.fired for n in notes if n.name in ("split", "hoist", "sink", "reorder",
                                                     "contract"))
    if not changed and all(isinstance(m, InterpMatch) for m in program.lowering.values()):
        reason = "; ".join(m.reason for m in program.lowering.values())
        return Compiled(None, notes, f"nothing to fuse or hoist: {reason}")
    return Compiled(program, notes)
