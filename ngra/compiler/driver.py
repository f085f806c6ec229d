"""``compile_layer``: the executor's entry point, with a per-layer plan cache.

Plans are cached per layer instance and input signature: the non-row shapes,
dtypes, devices and dict keys of the vertex and edge data, the gather, the
training flag, the layer's plain attributes (numbers, strings: values baked into
the trace) and its parameter shapes. A new signature compiles a new plan.
Parameters themselves are read when the plan runs, never snapshotted.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ngra.graph import EdgeFactors
from ngra.compiler.compiled import CompiledPlan
from ngra.compiler.generic import FallbackPlan
from ngra.compiler.lower import lower
from ngra.compiler.passes import PassNote
from ngra.compiler.pipeline import compile_program
from ngra.compiler.plan import Plan

__all__ = ["compile_layer", "disabled", "is_enabled", "set_enabled", "clear_cache", "signature"]

log = logging.getLogger(__name__)

_MAX_PLANS = 8  # per layer
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_compiling = threading.RLock()  # serializes compiles (tracing is not thread-safe)
_enabled = True


def is_enabled() -> bool:
    """Whether layers are compiled (``False``: every layer runs the generic executor)."""
    return _enabled


def set_enabled(flag: bool) -> None:
    """Turn compilation on or off globally (benchmarks: "ngra generic" vs "ngra fused")."""
    global _enabled
    _enabled = bool(flag)


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run every SAGA layer on the generic UDF executor inside the block.

    Example::

        with ngra.compiler.disabled():
            out_generic = layer(graph, x)
    """
    global _enabled
    prev = _enabled
    _enabled = False
    try:
        yield
    finally:
        _enabled = prev


def clear_cache(layer: Any = None) -> None:
    """Forget compiled plans (of ``layer``, or of every layer)."""
    with _lock:
        if layer is None:
            _CACHE.clear()
        else:
            _CACHE.pop(layer, None)


class _Fallback:
    __slots__ = ("reason", "notes")

    def __init__(self, reason: str, notes: list[PassNote]) -> None:
        self.reason, self.notes = reason, notes


def compile_layer(layer: Any, graph: Any, x: Any, edata: Any) -> Plan:
    """The plan for ``layer`` on inputs like ``x`` / ``edata`` (edge data in CSC order).

    Returns a :class:`~ngra.compiler.compiled.CompiledPlan`, or a
    :class:`~ngra.compiler.generic.FallbackPlan` (the generic executor) with the reason.
    A cached plan is shared by every call with this signature, from any thread: plans
    keep no per-call state (:mod:`ngra.compiler.plan`).
    """
    if not _enabled:
        return FallbackPlan(layer, "compilation disabled (ngra.compiler.disabled())")
    if isinstance(edata, EdgeFactors):
        # traced as the [E] weight it stands for; the plan applies the factors at run time
        edata = edata.src
    key = signature(layer, x, edata)
    with _lock:
        plans = _CACHE.get(layer)
        entry = plans.get(key) if plans is not None else None
        if entry is not None:
            plans.move_to_end(key)
    if entry is None:
        # one compile at a time: torch.fx tracing is not thread-safe (a second thread's
        # trace sees the first one's Proxies); a thread that waited finds the plan cached
        with _compiling:
            with _lock:
                plans = _CACHE.get(layer)
                entry = plans.get(key) if plans is not None else None
            if entry is None:
                entry = _compile(layer, x, edata)
                with _lock:
                    plans = _CACHE.setdefault(layer, OrderedDict())
                    plans[key] = entry
                    while len(plans) > _MAX_PLANS:
                        plans.popitem(last=False)
    if isinstance(entry, _Fallback):
        return FallbackPlan(layer, entry.reason, entry.notes)
    return entry


def _compile(layer: Any, x: Any, edata: Any) -> CompiledPlan | _Fallback:
    name = type(layer).__name__
    result = compile_program(layer, x, edata)
    if result.program is None:
        log.info("%s runs on the generic executor: %s", name, result.reason)
        return _Fallback(result.reason, result.notes)
    plan = lower(layer, result.program, result.notes)
    log.info("%s compiled: %s", name, ", ".join(plan.edge_kinds))
    return plan


# ---------------------------------------------------------------------------- signature
def _tensor_sig(t: Any) -> Any:
    if t is None:
        return None
    if isinstance(t, Mapping):
        return ("dict", tuple((k, _tensor_sig(v)) for k, v in t.items()))
    if isinstance(t, torch.Tensor):
        return (tuple(t.shape[1:]), t.dtype, t.device.type)
    return ("other", type(t).__name__)


_SIMPLE = (bool, int, float, str, type(None))


def _attr_sig(layer: Any) -> tuple:
    items = []
    for k, v in vars(layer).items():
        simple_tuple = isinstance(v, tuple) and all(isinstance(i, _SIMPLE) for i in v)
        if isinstance(v, _SIMPLE) or simple_tuple:
            items.append((k, v))
    return tuple(items)


def signature(layer: Any, x: Any, edata: Any) -> tuple:
    """The cache key of a compiled plan (see the module docstring)."""
    params = tuple((n, tuple(p.shape), p.dtype) for n, p in layer.named_parameters())
    gather = layer.gather
    gather = tuple(gather.items()) if isinstance(gather, dict) else gather  # hashable
    return (type(layer), gather, layer.training, _tensor_sig(x), _tensor_sig(edata),
            _attr_sig(layer), params)
