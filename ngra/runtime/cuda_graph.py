"""The steady-state training step replayed from a CUDA graph.

Full-graph training repeats one step with the same shapes every epoch: zero the
gradients, forward, loss, backward, optimizer step. On a small graph that step is bound
by the host (Python, the dispatcher, one launch per kernel), not by the GPU. A
:class:`GraphedStep` runs the step eagerly for a few warm-up calls on a side stream
(Triton compiles and autotunes, lazy caches fill, the optimizer makes its state), then
captures one call with ``torch.cuda.graph`` and afterwards replays it: one launch for
the whole step. What the step returns (the loss, finiteness flags) is the graph's static
output, overwritten by each replay; the caller reads it before the next call.

A graph replays exactly the kernels, arguments and addresses it recorded, so a step is
captured only where that is the same computation every time. :func:`capture_refusal`
says why a setup cannot be (not CUDA; a streaming placement or a memory budget, whose
tile grids stage host data and are chosen at run time; an optimizer without
``capturable=True``, whose step count lives on the host). The last warm-up call is
watched as well, and capture is refused when it synchronized with the host (``.item()``,
boolean-mask indexing, a pageable host-to-device copy: ``torch.cuda`` sync debug mode)
or drew ngra dropout seeds on the host (:func:`ngra.kernels.dropout.host_seed_draws`:
a graph would replay one mask forever; the gpu backend draws them on the device, where
the CUDA generator's graph-safe state gives each replay fresh ones). A capture that
fails anyway is logged and the step keeps running eagerly; the graph and its memory
pool are dropped, and since the step sets the gradients to ``None`` first and nothing
captured has run, the next eager step starts from the same state.

Constraints on the step itself, which the caller keeps: it calls
``optimizer.zero_grad(set_to_none=True)`` first (so backward writes fresh gradients in
the graph's pool rather than accumulating into tensors made outside it); nothing
outside the step replaces a tensor it reads (``load_state_dict`` copies into the
parameters in place, which is fine; a new optimizer state is not); hyper-parameters
read as Python numbers (the learning rate) are frozen at capture.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch

from ngra.kernels.dropout import host_seed_draws
from ngra.runtime.placement import Placement

__all__ = ["CAPTURED", "GraphedStep", "MODES", "capture_refusal", "host_syncs", "optimizer_refusal"]

log = logging.getLogger(__name__)

#: ``--cuda-graphs``: capture where safe, insist, never.
MODES = ("auto", "on", "off")
#: :attr:`GraphedStep.status` once the step replays from a graph.
CAPTURED = "captured"


def optimizer_refusal(optimizer: torch.optim.Optimizer) -> str | None:
    """Why ``optimizer``'s step cannot be captured, or ``None``: every parameter group
    must have ``capturable=True`` (Adam and its kin keep the step count on the device
    then; without it they read it on the host)."""
    name = type(optimizer).__name__
    if not all("capturable" in g for g in optimizer.param_groups):
        return f"optimizer {name} has no capturable mode"
    if not all(g["capturable"] for g in optimizer.param_groups):
        return f"optimizer {name} was built without capturable=True"
    return None


def capture_refusal(device: torch.device, placement: Placement | None = None,
                    optimizer: torch.optim.Optimizer | None = None) -> str | None:
    """Why a training step on ``device`` with ``placement`` and ``optimizer`` cannot be
    captured, or ``None`` when it may be (the warm-up's checks still apply)."""
    if device.type != "cuda":
        return f"not a CUDA device ({device})"
    if placement is not None and not placement.resident:
        return ("streaming placement: host data is staged to the device tile by tile, "
                "on a grid chosen at run time")
    if placement is not None and placement.budget is not None:
        return (f"a memory budget ({placement.budget / 2**20:,.0f} MiB) chooses the tile "
                "grid at run time")
    return None if optimizer is None else optimizer_refusal(optimizer)


#: torch's notice when sync debug mode is first turned on in a process (torch 2.11: "...
#: is a prototype feature and does not yet detect all synchronizing operations"): not a
#: synchronization of the step
_SYNC_MODE_NOTICE = "synchronization debug mode is a prototype feature"


def host_syncs(caught: list[warnings.WarningMessage]) -> list[str]:
    """The first lines of the warnings that sync debug mode raised for a host
    synchronization (its own one-time notice aside)."""
    lines = [str(w.message).splitlines()[0] if str(w.message) else "" for w in caught]
    return [ln for ln in lines
            if "synchroniz" in ln.lower() and not ln.lower().startswith(_SYNC_MODE_NOTICE)]


class GraphedStep:
    """One training step, run eagerly for ``warmup`` calls, then replayed from a CUDA graph.

    Args:
        step: runs one whole step (``optimizer.zero_grad(set_to_none=True)``, forward,
            loss, backward, ``optimizer.step()``) and returns a tensor the caller reads
            after the call (e.g. the loss); no host reads inside.
        device: the CUDA device the step runs on.
        warmup: eager calls before capture (at least 1: Triton compiles and autotunes
            there, never inside a capture). (default: ``2``)
        refusal: a reason known beforehand (:func:`capture_refusal`): every call then
            runs eagerly and :attr:`status` is that reason. (default: ``None``)
        strict: raise instead of running eagerly when the warm-up or the capture
            refuses (``--cuda-graphs on``). (default: ``False``)

    Attributes:
        status: ``"captured"``, ``"pending"`` (still warming up) or why the step runs
            eagerly.
    """

    def __init__(self, step: Callable[[], torch.Tensor], device: torch.device,
                 warmup: int = 2, refusal: str | None = None, strict: bool = False) -> None:
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 eager call (Triton compiles there); "
                             f"got {warmup}.")
        self._step, self.device, self.warmup, self.strict = step, device, warmup, strict
        self._graph: torch.cuda.CUDAGraph | None = None
        self._out: torch.Tensor | None = None
        self._side: torch.cuda.Stream | None = None
        self._calls = 0
        self.status = "pending" if refusal is None else refusal

    def __call__(self) -> torch.Tensor:
        if self._graph is not None:
            self._graph.replay()
            return self._out
        if self.status != "pending":
            return self._step()
        self._calls += 1
        if self._calls < self.warmup:
            return self._side_stream(self._step)
        if self._calls == self.warmup:
            return self._watched_warmup()
        return self._capture()

    def describe(self) -> str:
        """:attr:`status`, with the warm-up count while pending."""
        if self.status == "pending":
            return (f"not captured: the run ended within its {self.warmup} eager warm-up "
                    "steps")
        return self.status

    def _side_stream(self, fn: Callable[[], Any]) -> Any:
        # warm-up off the default stream, as torch.cuda.graph's documentation asks: lazy
        # initializations (cuBLAS workspaces, autograd's stream bookkeeping) then happen
        # where the capture will run
        # (one stream for every warm-up call: blocks the allocator caches per stream are
        # then reused by the next call instead of stranded with a discarded stream)
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        self._side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._side):
            out = fn()
        torch.cuda.current_stream(self.device).wait_stream(self._side)
        return out

    def _watched_warmup(self) -> torch.Tensor:
        """The last warm-up call, watched for host synchronizations and host-drawn
        dropout seeds; either refuses capture."""
        before = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught, host_seed_draws() as drawn:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                out = self._side_stream(self._step)
            finally:
                torch.cuda.set_sync_debug_mode(before)
        syncs = host_syncs(caught)
        if syncs:
            self._refuse(f"the step synchronizes with the host ({len(syncs)} time(s) in "
                         f"its last warm-up call; first: {syncs[0]})")
        elif drawn:
            self._refuse(f"ngra dropout drew its seeds on the host ({len(drawn)} draw(s), "
                         "p = " + ", ".join(f"{p:g}" for p in sorted(set(drawn)))
                         + "): a graph would replay one mask; the gpu kernel backend draws "
                         "them on the device")
        return out

    def _capture(self) -> torch.Tensor:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.device(self.device), torch.cuda.graph(graph):
                out = self._step()
        except RuntimeError as err:
            # nothing captured ran, and the step begins by dropping the gradients, so
            # the eager step below starts from the state the warm-up left
            graph = None  # drop the failed capture before freeing the cache
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            self._refuse(f"capture failed: {type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}")
            return self._step()
        self._graph, self._out, self.status = graph, out, CAPTURED
        log.info("training step captured in a CUDA graph after %d eager warm-up step(s)",
                 self.warmup)
        graph.replay()  # capture records without running: this call's step runs now
        return out

    def _refuse(self, reason: str) -> None:
        self.status = reason
        if self.strict:
            raise RuntimeError(f"--cuda-graphs on: the training step cannot be captured: "
                               f"{reason}. Use --cuda-graphs auto to run it eagerly.")
        log.warning("training step runs eagerly, not from a CUDA graph: %s", reason)
