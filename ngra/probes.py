"""Stage probes: wall-clock time per runtime stage, free when nobody listens.

The runtime wraps each stage of a plan in ``with stage(name) as s:``. Without an
active :class:`Recorder` that returns one shared do-nothing object, keeps no
state and reads no clock. Inside ``with Recorder() as rec:`` every stage is
timed; stages nest (``edge`` holds ``scatter``, ``apply_edge`` and ``gather`` in
the generic plan) and repeated entries of the same path add up::

    with Recorder() as rec:
        model(graph, x)
    rec.inclusive()          # {("edge",): 0.012, ("edge", "gather"): 0.004, ...}
    rec.exclusive_by_name()  # {"edge": 0.001, "gather": 0.004, ...}, children removed

Backward timing (``Recorder(backward=True)``): ``s.outputs(t)`` and
``s.inputs(t)`` put identity autograd markers on a stage's result and inputs.
When the backward pass reaches a marker it records ``(time, stage path)``: an
output marker of stage ``S`` fires when the gradient of ``S``'s result is
complete, i.e. when ``S``'s backward starts, so the time until the next marker
is charged to ``S``; an input marker (path ``None``) closes the stage, and the
time after it is left unattributed. This is an approximation: the autograd
engine runs ready nodes in creation order, so stages whose backward
interleaves (branches of the graph) are charged to whichever marker fired
last; see :meth:`Recorder.backward`.

One recorder is active per process at a time; entering a second one suspends
the first until it exits.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["Recorder", "stage", "annotate", "active"]

_ACTIVE: Recorder | None = None


class _NullStage:
    """What :func:`stage` returns when no recorder is active: does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NullStage:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def outputs(self, x: Any) -> Any:
        return x

    def inputs(self, x: Any) -> Any:
        return x


_NULL = _NullStage()


def stage(name: str) -> Any:
    """Context manager timing stage ``name`` when a recorder is active.

    Returns the shared no-op object otherwise (no allocation, no clock read).
    The object entered has ``outputs(x)`` / ``inputs(x)``, identity functions
    that place backward markers when the recorder asks for backward timing.
    """
    rec = _ACTIVE
    if rec is None:
        return _NULL
    return _Stage(rec, name)


def annotate(key: str, value: Any) -> None:
    """Note ``value`` under ``key`` on the active recorder (e.g. the plan kind)."""
    rec = _ACTIVE
    if rec is not None:
        rec.notes[key].append(value)


def active() -> Recorder | None:
    """The active recorder, or ``None``."""
    return _ACTIVE


class _Stage:
    __slots__ = ("rec", "name", "path", "t0")

    def __init__(self, rec: Recorder, name: str) -> None:
        self.rec, self.name = rec, name

    def __enter__(self) -> _Stage:
        rec = self.rec
        stack = rec._stack
        self.path = stack[-1] + (self.name,) if stack else (self.name,)
        stack.append(self.path)
        rec._sync()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        rec = self.rec
        rec._sync()
        dt = time.perf_counter() - self.t0
        rec._stack.pop()
        slot = rec._times[self.path]
        slot[0] += dt
        slot[1] += 1

    def outputs(self, x: Any) -> Any:
        return self.rec._mark(x, self.path)

    def inputs(self, x: Any) -> Any:
        return self.rec._mark(x, None)


class Recorder:
    """Collects stage times while active (a context manager; re-entrant across uses).

    Args:
        backward: place backward markers (see the module docstring) when grad
            is enabled (default: False).
        sync: call ``torch.cuda.synchronize()`` at stage boundaries so CUDA
            time lands in the right stage (default: when CUDA is available).
    """

    def __init__(self, backward: bool = False, sync: bool | None = None) -> None:
        self.markers = backward
        self.sync = torch.cuda.is_available() if sync is None else sync
        self._times: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0, 0])
        self._stack: list[tuple[str, ...]] = []
        self.events: list[tuple[float, tuple[str, ...] | None]] = []
        self.notes: dict[str, list[Any]] = defaultdict(list)
        self._prev: Recorder | None = None

    # ------------------------------------------------------------ activation
    def __enter__(self) -> Recorder:
        global _ACTIVE
        self._prev, _ACTIVE = _ACTIVE, self
        return self

    def __exit__(self, *exc: Any) -> None:
        global _ACTIVE
        _ACTIVE, self._prev = self._prev, None

    def reset(self) -> None:
        """Forget every time, event and note (keeps the settings)."""
        self._times.clear()
        self._stack.clear()
        self.events.clear()
        self.notes.clear()

    # ------------------------------------------------------------- results
    def inclusive(self) -> dict[tuple[str, ...], float]:
        """Seconds per stage path, children included."""
        return {p: v[0] for p, v in self._times.items()}

    def counts(self) -> dict[tuple[str, ...], int]:
        """How often each stage path was entered."""
        return {p: int(v[1]) for p, v in self._times.items()}

    def exclusive(self) -> dict[tuple[str, ...], float]:
        """Seconds per stage path, time spent in nested stages removed."""
        out = self.inclusive()
        for path, t in self.inclusive().items():
            if len(path) > 1:
                out[path[:-1]] = out.get(path[:-1], 0.0) - t
        return out

    def exclusive_by_name(self) -> dict[str, float]:
        """Exclusive seconds summed over paths ending in the same stage name.

        The values sum to the total time spent inside top-level stages.
        """
        out: dict[str, float] = defaultdict(float)
        for path, t in self.exclusive().items():
            out[path[-1]] += t
        return dict(out)

    def backward(self, start: float, end: float) -> dict[tuple[str, ...] | None, float]:
        """Backward seconds per stage path between ``start`` and ``end``
        (``time.perf_counter()`` values around ``loss.backward()``).

        Each interval between consecutive marker events is charged to the
        earlier event's stage; before the first event and after an input
        marker the time goes to ``None`` (unattributed). The values sum to
        ``end - start``.
        """
        events = sorted((e for e in self.events if start <= e[0] <= end),
                        key=lambda e: e[0])
        out: dict[tuple[str, ...] | None, float] = defaultdict(float)
        t_prev, label = start, None
        for t, lab in events:
            out[label] += t - t_prev
            t_prev, label = t, lab
        out[label] += end - t_prev
        return dict(out)

    def backward_by_name(self, start: float, end: float) -> dict[str | None, float]:
        """:meth:`backward` summed over paths ending in the same stage name."""
        out: dict[str | None, float] = defaultdict(float)
        for path, t in self.backward(start, end).items():
            out[None if path is None else path[-1]] += t
        return dict(out)

    # ------------------------------------------------------------ internals
    def _sync(self) -> None:
        if self.sync:
            torch.cuda.synchronize()

    def _mark(self, x: Any, label: tuple[str, ...] | None) -> Any:
        if not (self.markers and torch.is_grad_enabled()):
            return x
        if isinstance(x, torch.Tensor):
            if x.requires_grad and x.is_floating_point():
                return _Marker.apply(x, self, label)
            return x
        if isinstance(x, Mapping):
            return {k: self._mark(v, label) for k, v in x.items()}
        if isinstance(x, tuple):
            return tuple(self._mark(v, label) for v in x)
        if isinstance(x, list):
            return [self._mark(v, label) for v in x]
        return x


class _Marker(torch.autograd.Function):
    """Identity whose backward records when the gradient arrived."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rec: Recorder,
                label: tuple[str, ...] | None) -> torch.Tensor:
        ctx.rec, ctx.label = rec, label
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        rec = ctx.rec
        rec._sync()
        rec.events.append((time.perf_counter(), ctx.label))
        return grad, None, None
