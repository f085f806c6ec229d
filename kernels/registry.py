"""One registry for every sparse kernel: implementations keyed by ``(op, backend)``.

Backends: ``"ref"`` (plain torch, the specification), ``"cpu"`` (numba), ``"gpu"``
(torch/triton on CUDA). Backend modules register themselves on import; a backend
whose dependencies are missing is skipped with a log line, never an import error.
Callers ask :func:`lookup` for ``(op, device)`` and never branch on backends.

The choice for a device is ``"auto"`` unless overridden with :func:`use_backend`
(a context manager) or the ``NGRA_KERNEL_BACKEND`` environment variable (read at each call,
:mod:`ngra.settings`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ngra.settings import get

__all__ = ["BACKENDS", "available", "backend_for", "backward_only", "current_backend",
           "forward_skipped", "lookup", "register", "use_backend"]

log = logging.getLogger(__name__)

BACKENDS = ("ref", "cpu", "gpu")
_MODULES = {"ref": "ngra.kernels.ref", "cpu": "ngra.kernels.cpu", "gpu": "ngra.kernels.gpu"}
_IMPLS: dict[tuple[str, str], Callable] = {}
_loaded: dict[str, bool] = {}
_why: dict[str, str] = {}  # backend -> why it failed to load
_state = threading.local()


def register(op: str, backend: str) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn`` as the ``backend`` implementation of ``op``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}.")

    def deco(fn: Callable) -> Callable:
        _IMPLS[(op, backend)] = fn
        return fn

    return deco


def _load(backend: str) -> bool:
    if backend not in _loaded:
        try:
            importlib.import_module(_MODULES[backend])
            _loaded[backend] = True
        except ImportError as exc:  # an optional backend must never break import
            log.info("kernel backend %r unavailable: %s", backend, exc)
            _loaded[backend] = False
            _why[backend] = str(exc)
    return _loaded[backend]


def _requested() -> str:
    return getattr(_state, "backend", None) or str(get("NGRA_KERNEL_BACKEND"))


def current_backend() -> str:
    """The backend requested here and now (``"auto"`` unless overridden).

    Autograd Functions record it in forward and restore it in backward, so a
    backward pass runs on the backend its forward ran on even when
    ``loss.backward()`` is called outside the :func:`use_backend` block.
    """
    return _requested()


def lookup(op: str, device: torch.device | str = "cpu") -> Callable:
    """The implementation of ``op`` for tensors on ``device``.

    ``auto`` picks ``gpu`` on CUDA and ``cpu`` (numba) elsewhere, falling back to
    ``ref`` when the preferred backend is missing or lacks ``op``.
    """
    return _IMPLS[(op, backend_for(op, device))]


def backend_for(op: str, device: torch.device | str = "cpu") -> str:
    """The backend whose ``op`` :func:`lookup` returns for ``device`` here and now."""
    device = torch.device(device)
    req = _requested()
    if req == "auto":
        order = ["gpu", "ref"] if device.type == "cuda" else ["cpu", "ref"]
    else:
        order = [req]
    for backend in order:
        if _load(backend) and (op, backend) in _IMPLS:
            return backend
    known = sorted({o for o, _ in _IMPLS})
    why = "".join(f" Backend {b!r} is unavailable: {_why[b]}" for b in order if b in _why)
    raise NotImplementedError(
        f"no kernel for op {op!r} on backend(s) {order} (device {device}); known ops: {known}."
        + why
    )


def available(op: str) -> list[str]:
    """Backends that implement ``op`` on this machine."""
    return [b for b in BACKENDS if _load(b) and (op, b) in _IMPLS]


@contextlib.contextmanager
def thread_setting(state: threading.local, name: str, value: Any) -> Iterator[None]:
    """``state.<name> = value`` in this thread inside the block, the previous value (or
    none) restored after it."""
    missing = object()
    prev = getattr(state, name, missing)
    setattr(state, name, value)
    try:
        yield
    finally:
        if prev is missing:
            delattr(state, name)
        else:
            setattr(state, name, prev)


@contextlib.contextmanager
def use_backend(backend: str) -> Iterator[None]:
    """Force a backend (``"ref"``, ``"cpu"``, ``"gpu"`` or ``"auto"``) inside the block."""
    if backend not in BACKENDS + ("auto",):
        raise ValueError(f"backend must be one of {BACKENDS + ('auto',)}; got {backend!r}.")
    with thread_setting(_state, "backend", backend):
        yield


@contextlib.contextmanager
def backward_only() -> Iterator[None]:
    """Inside the block, ``sum``/``mean`` g-SpMM and fused edge kernels skip their forward.

    They return zeros shaped like their output (a broadcast view, no memory) and keep
    what their backward reads, so gradients through them are exact while the
    values are not. For a caller that differentiates a result *linear* in those
    outputs and needs nothing else from them: the chunked executor's per-tile
    backward, which would otherwise run each tile's kernel forward a second time
    only to rebuild the autograd graph.
    """
    with thread_setting(_state, "backward_only", True):
        yield


def forward_skipped(reduce: str) -> bool:
    """Whether a kernel with this reducer skips its forward here (see :func:`backward_only`)."""
    return reduce in ("sum", "mean") and getattr(_state, "backward_only", False)
