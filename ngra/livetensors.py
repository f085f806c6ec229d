"""Live tensor bytes of a step, storage by storage: the device peak measured on any device.

``torch.cuda.max_memory_allocated`` is the figure that matters on a GPU, but it exists only
there, and it says how much, not what. :class:`LiveTensors` counts the same thing on any
device, the CPU included (the gpu backend's Triton kernels run on CPU tensors in Triton's
interpreter), and says what it is made of:

* a :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees every aten op below
  autograd, forward and backward and the optimizer alike; each output's untyped storage
  not seen before is a new allocation, recorded with its size, shape, dtype, the op and
  the innermost frame outside torch that asked for it;
* a ``weakref.finalize`` on that storage object fires when its last reference (tensor,
  view, autograd's saved variable) is gone: torch keeps one Python object per live
  storage (PyObject preservation), so the finalizer follows the storage, not a wrapper;
* what exists before the step (graph arrays, features, parameters, optimizer state) is
  counted from the objects given to :meth:`LiveTensors.add`, walked through their
  attributes, containers and closures (a step function's closure reaches the model, the
  optimizer and the data it trains on).

The peak is the largest sum of live bytes after any op, and the storages live at that
moment are kept (:attr:`LiveTensors.at_peak`).

Under Triton's interpreter every kernel launch leaves a reference cycle (its argument
copy-in and copy-back helpers are recursive closures over a dict of the arguments'
storages), so each storage a kernel touched would stay alive until the next garbage
collection: an interpreter artifact a GPU never sees. While counting, each interpreted
launch is followed by ``gc.collect()``, so storages die when their last real reference
does; a cycle in the measured code itself is still seen for what it costs. What it cannot see: scratch memory an op
allocates and frees inside itself (a CUDA sort's workspace), allocator rounding and
caching, and memory outside torch (numpy buffers, Triton's interpreter state). So it is
a lower bound of ``max_memory_allocated`` that matches it up to those op-internal
scratch buffers.
"""

from __future__ import annotations

import gc
import os
import sys
import types
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["LeanDispatchMode", "LiveStorage", "LiveTensors", "step_peak"]

_TORCH_DIR = os.path.dirname(torch.__file__)
#: frames in installed packages (torch, triton's interpreter, numpy) are never the site
_PACKAGES = f"{os.sep}site-packages{os.sep}"


@dataclass(frozen=True)
class LiveStorage:
    """One storage counted by :class:`LiveTensors`.

    Attributes:
        nbytes: its size.
        shape, dtype: of the first tensor seen on it.
        op: the aten op that allocated it, or ``"before"`` (alive before the step).
        site: ``file:line function`` of the innermost frame outside torch when it was
            allocated (``""`` for storages alive before).
    """

    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    op: str
    site: str

    def __str__(self) -> str:
        shape = "x".join(map(str, self.shape)) or "scalar"
        where = f" at {self.site}" if self.site else ""
        return f"{self.nbytes / 2**20:10.3f} MiB  [{shape}] {self.dtype}  {self.op}{where}"


class LeanDispatchMode(TorchDispatchMode):
    """A dispatch mode that does not import ``torch._dynamo``: torch wraps a mode's
    ``__torch_dispatch__`` in ``torch._disable_dynamo`` unless the class's
    ``_should_skip_dynamo`` says no, and the wrapper's first call imports ``torch._dynamo``
    (with sympy: 130 MB of the process's peak, which a peak measurement would count). ngra's
    modes only count and sample; nothing they see is compiled."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class LiveTensors(LeanDispatchMode):
    """Count live tensor storages on ``device`` while inside the ``with`` block.

    Args:
        device: the device type counted (``"cpu"``, ``"cuda"``).
    Attributes:
        current_bytes: bytes live now. peak_bytes: the most live at once so far.
        at_peak: the storages live at the peak, largest first.
    """

    def __init__(self, device: str | torch.device = "cpu") -> None:
        super().__init__()
        self.device = torch.device(device).type
        self.current_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, LiveStorage] = {}
        self._peak_live: list[LiveStorage] = []

    @property
    def at_peak(self) -> list[LiveStorage]:
        return sorted(self._peak_live, key=lambda s: -s.nbytes)

    @property
    def resident_bytes(self) -> int:
        """Bytes of the storages alive now that were counted by :meth:`add`."""
        return sum(s.nbytes for s in self._live.values() if s.op == "before")

    def add(self, *roots: Any) -> int:
        """Count the tensors reachable from ``roots`` as live (those not counted already);
        returns the bytes added."""
        added = 0
        for t in _reachable_tensors(roots):
            added += self._track(t, "before", "")
        self._mark_peak()
        return added

    def peak_split(self, num_nodes: int, num_edges: int) -> dict[str, int]:
        """The peak's bytes by what they grow with: ``"edge"`` (storages of ``num_edges``
        rows), ``"vertex"`` (``num_nodes`` or ``num_nodes + 1`` rows, or a flat multiple
        of ``num_nodes`` elements) and ``"other"`` (parameters, optimizer state); scaling
        each by its graph size predicts the peak on a larger graph."""
        out = {"vertex": 0, "edge": 0, "other": 0}
        for s in self._peak_live:
            rows = s.shape[0] if s.shape else 0
            numel = s.nbytes // max(s.dtype.itemsize, 1)
            if num_edges and rows == num_edges:
                out["edge"] += s.nbytes
            elif num_nodes and (rows in (num_nodes, num_nodes + 1)
                                or (len(s.shape) == 1 and numel % num_nodes == 0)):
                out["vertex"] += s.nbytes
            else:
                out["other"] += s.nbytes
        return out

    def table(self, top: int = 12) -> str:
        """The ``top`` largest storages at the peak, one a line, and the rest summed."""
        rows = self.at_peak
        lines = [f"peak {self.peak_bytes / 2**20:.3f} MiB in {len(rows)} storages"]
        lines += [str(s) for s in rows[:top]]
        rest = sum(s.nbytes for s in rows[top:])
        if rest:
            lines.append(f"{rest / 2**20:10.3f} MiB  in {len(rows) - top} smaller storages")
        return "\n".join(lines)

    def __enter__(self) -> LiveTensors:
        self._unpatch = _collect_after_interpreted_launches()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._unpatch()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten(out)
        site = None
        for t in flat:
            if isinstance(t, torch.Tensor):
                if site is None:
                    site = _caller()
                self._track(t, str(func.overloadpacket.__name__), site)
        self._mark_peak()
        return out

    def _track(self, t: torch.Tensor, op: str, site: str) -> int:
        if t.device.type != self.device or t.is_meta:
            return 0
        storage = t.untyped_storage()
        key = id(storage)
        nbytes = storage.nbytes()
        if key in self._live or nbytes == 0:
            return 0
        self._live[key] = LiveStorage(nbytes, tuple(t.shape), t.dtype, op, site)
        self.current_bytes += nbytes
        weakref.finalize(storage, self._freed, key).atexit = False
        return nbytes

    def _freed(self, key: int) -> None:
        rec = self._live.pop(key, None)
        if rec is not None:
            self.current_bytes -= rec.nbytes

    def _mark_peak(self) -> None:
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes = self.current_bytes
            self._peak_live = list(self._live.values())


def step_peak(step: Callable[[], Any], *roots: Any, device: str | torch.device = "cpu",
              runs: int = 1) -> LiveTensors:
    """Peak live tensor bytes on ``device`` over ``runs`` calls of ``step()``, counting
    what ``step`` and ``roots`` reach before it as live from the start.

    ``step``'s closure is walked too, so ``step_peak(step)`` alone counts the model,
    optimizer state, graph and features a training-step closure holds. The first run
    includes one-time work (the reverse CSR, optimizer state), as a benchmark's peak
    over its warm-up does.

    Returns:
        the :class:`LiveTensors` (``peak_bytes``, ``resident_bytes``, ``at_peak``,
        ``table()``).
    """
    gc.collect()
    mode = LiveTensors(device)
    mode.add(step, *roots)
    with mode:
        for _ in range(runs):
            step()
    return mode


def _collect_after_interpreted_launches() -> Callable[[], None]:
    """Make each launch in Triton's interpreter (when it is loaded) collect the cycles it
    leaves; returns the undo."""
    interp = sys.modules.get("triton.runtime.interpreter")
    executor = getattr(interp, "GridExecutor", None)
    if executor is None:
        return lambda: None
    launch = executor.__call__
    # what exists now is not garbage of a launch: frozen, a collection only scans what
    # was made since (a whole-heap one took ~0.2 s a launch in a test process)
    gc.collect()
    gc.freeze()

    def collecting(self, *args, **kwargs):
        try:
            return launch(self, *args, **kwargs)
        finally:
            gc.collect()

    executor.__call__ = collecting

    def undo() -> None:
        executor.__call__ = launch
        gc.unfreeze()

    return undo


# ------------------------------------------------------------------ reachability
def _reachable_tensors(roots: tuple[Any, ...]) -> Iterator[torch.Tensor]:
    """Tensors reachable from ``roots`` through attributes, containers and closures, never
    through modules, classes or a function's globals (which would reach everything)."""
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, str, bytes, int, float)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            yield obj
            if obj.grad is not None:
                todo.append(obj.grad)
            continue
        if isinstance(obj, types.FunctionType):
            todo.extend(c.cell_contents for c in obj.__closure__ or () if _filled(c))
            todo.extend(obj.__defaults__ or ())
            todo.extend((obj.__kwdefaults__ or {}).values())
            continue
        if isinstance(obj, types.MethodType):
            todo.extend((obj.__self__, obj.__func__))
            continue
        if isinstance(obj, (types.CodeType, types.FrameType)):
            continue
        todo.extend(gc.get_referents(obj))


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a closure variable not assigned yet
        return False
    return True


def _caller() -> str:
    """``file:line function`` of the innermost frame outside installed packages (torch,
    triton) and this module."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not (name.startswith(_TORCH_DIR) or _PACKAGES in name or name == __file__):
            return f"{_short(name)}:{f.f_lineno} {f.f_code.co_name}"
        f = f.f_back
    return ""


def _short(path: str) -> str:
    parts = path.replace(os.sep, "/").split("/")
    return "/".join(parts[-2:])
