"""Host <-> device copies on side streams, counted, and the pinned copy bandwidth.

:class:`Link` is what out-of-device-memory streaming (:mod:`ngra.runtime.offload`) moves
data with. It owns two CUDA streams besides the compute stream: host-to-device copies
run on one and device-to-host copies on the other, so a chunk arrives while the previous
one computes and a finished column's output leaves while the next column computes.

* :meth:`Link.h2d` copies page-locked host rows to the device on the copy stream and
  returns a :class:`Fetched` (the device tensors and the copy's event); the consumer
  calls :meth:`Fetched.ready` before its first kernel, which makes the compute stream
  wait for that copy alone and tells the caching allocator that the compute stream uses
  the memory (``record_stream``), so a buffer is handed out again only once every kernel
  that read it is done. The allocator's stream-aware pools are the reused device
  buffers: after the first epoch no copy allocates from the driver.
* :meth:`Link.d2h` writes a device tensor into page-locked host memory on the other
  stream once the compute stream has produced it; :meth:`Link.drain` waits for every
  such copy before the host reads what they wrote.

Every copy adds its bytes to the link's :class:`TransferCounts` and to the process-wide
counts (:func:`transfer_counts`), which training reports per epoch beside the time the
same bytes take at the pinned copy bandwidth (:func:`copy_bandwidth`, measured once per
device and cached beside the link calibration of :mod:`ngra.distributed.link`).

The CPU stand-in: a link whose device is the CPU runs the same code with copies between
CPU tensors (real copies, so a schedule that reads a buffer before it is written, or
writes one still in use, shows up as a wrong result), and streams and events as no-ops.
Tests run the whole streaming schedule that way.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ngra.calibration import calibration_file, save_calibration
from ngra.mapped import is_mapped

__all__ = ["Bandwidth", "Fetched", "Link", "TransferCounts", "copy_bandwidth", "pinned",
           "pinned_empty", "transfer_counts"]

log = logging.getLogger(__name__)


@dataclass
class TransferCounts:
    """Bytes and copies moved each way."""

    h2d_bytes: int = 0
    d2h_bytes: int = 0
    h2d_copies: int = 0
    d2h_copies: int = 0

    def add(self, other: TransferCounts) -> None:
        self.h2d_bytes += other.h2d_bytes
        self.d2h_bytes += other.d2h_bytes
        self.h2d_copies += other.h2d_copies
        self.d2h_copies += other.d2h_copies

    def since(self, start: TransferCounts) -> TransferCounts:
        """What was moved after ``start`` (a copy of these counts taken earlier)."""
        return TransferCounts(self.h2d_bytes - start.h2d_bytes, self.d2h_bytes - start.d2h_bytes,
                              self.h2d_copies - start.h2d_copies,
                              self.d2h_copies - start.d2h_copies)

    def copy(self) -> TransferCounts:
        return TransferCounts(self.h2d_bytes, self.d2h_bytes, self.h2d_copies, self.d2h_copies)

    @staticmethod
    def median(runs: list[TransferCounts]) -> TransferCounts:
        """Each field's median over ``runs`` (the epochs of a timed run)."""
        return TransferCounts(*(int(statistics.median(getattr(r, f) for r in runs)) for f in
                                ("h2d_bytes", "d2h_bytes", "h2d_copies", "d2h_copies")))


_TOTAL = TransferCounts()


def transfer_counts() -> TransferCounts:
    """This process's bytes moved by every :class:`Link` so far (take a :meth:`copy
    <TransferCounts.copy>` before an epoch and :meth:`~TransferCounts.since` after it)."""
    return _TOTAL


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
                 ) -> torch.Tensor:
    """An uninitialized host tensor in page-locked memory when ``device`` is a CUDA device
    (the source or target of an asynchronous copy), in ordinary memory for the stand-in."""
    return torch.empty(shape, dtype=dtype, pin_memory=device.type == "cuda")


# keyed by identity: a WeakKeyDictionary compares tensor keys with ==, elementwise, and
# fails ("Boolean value of Tensor ... is ambiguous") on a hash collision
_PINNED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def pinned(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` in page-locked memory (for a CUDA ``device``): ``t`` itself when it is pinned
    already, else a pinned copy made once and kept while ``t`` lives unmodified (a
    dataset's features are copied once per run, not once per epoch). An array mapped from
    disk (``--storage disk``) stays mapped: its chunks are copied from the mapping as they
    are needed (synchronous copies, but no host copy of the whole array)."""

    if device.type != "cuda" or t.is_pinned() or is_mapped(t):
        return t
    hit = _PINNED.get(t)
    if hit is not None and hit[0] == t._version:
        return hit[1]
    copy = t.detach().pin_memory()
    try:
        _PINNED[t] = (t._version, copy)
    except TypeError:  # not weak-referenceable: pin every time
        pass
    return copy


class Fetched:
    """Device tensors whose host-to-device copy was queued on a link's copy stream.

    Attributes:
        tensors: the device tensors, in the order asked for.
    """

    __slots__ = ("_event", "_link", "tensors")

    def __init__(self, link: Link, tensors: list[torch.Tensor], event: Any) -> None:
        self._link, self.tensors, self._event = link, tensors, event

    def ready(self) -> list[torch.Tensor]:
        """The tensors, once the compute stream has been made to wait for their copy."""
        if self._event is not None:
            stream = torch.cuda.current_stream(self._link.device)
            stream.wait_event(self._event)
            for t in self.tensors:
                t.record_stream(stream)
            self._event = None
        return self.tensors


_STREAMS: dict[torch.device, tuple[Any, Any]] = {}


def _side_streams(device: torch.device) -> tuple[Any, Any]:
    """The copy streams of ``device`` (one per direction, made once per process)."""
    if device not in _STREAMS:
        _STREAMS[device] = (torch.cuda.Stream(device), torch.cuda.Stream(device))
    return _STREAMS[device]


class Link:
    """Host <-> ``device`` copies on two side streams, counted (see the module docstring).

    Args:
        device: the compute device: a CUDA device, or the CPU (the stand-in).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.counts = TransferCounts()
        self._up, self._down = _side_streams(self.device) if self.cuda else (None, None)

    def h2d(self, *hosts: torch.Tensor) -> Fetched:
        """Queue ``hosts`` (host tensors; page-locked on a CUDA link) to the device."""
        out = []
        if self.cuda:
            with torch.cuda.stream(self._up):
                for h in hosts:
                    out.append(h.to(self.device, non_blocking=True))
            event = self._up.record_event()
        else:
            out, event = [h.clone() for h in hosts], None
        for h in hosts:
            self.counts.h2d_bytes += _nbytes(h)
            _TOTAL.h2d_bytes += _nbytes(h)
        self.counts.h2d_copies += len(hosts)
        _TOTAL.h2d_copies += len(hosts)
        return Fetched(self, out, event)

    def d2h(self, dev: torch.Tensor, host: torch.Tensor) -> None:
        """Copy ``dev`` into ``host`` (page-locked on a CUDA link) once the compute stream
        has made it; the host may read ``host`` after :meth:`drain`."""
        if self.cuda:
            self._down.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._down):
                host.copy_(dev, non_blocking=True)
            dev.record_stream(self._down)
        else:
            host.copy_(dev)
        n = _nbytes(dev)
        self.counts.d2h_bytes += n
        _TOTAL.d2h_bytes += n
        self.counts.d2h_copies += 1
        _TOTAL.d2h_copies += 1

    def fence(self) -> None:
        """Order later host-to-device copies after every queued device-to-host copy (a
        chunk written to host memory is then read back whole), without a host wait."""
        if self.cuda:
            self._up.wait_stream(self._down)

    def drain(self) -> None:
        """Wait until every queued device-to-host copy has landed in host memory."""
        if self.cuda:
            self._down.synchronize()

    def compute_done(self) -> None:
        """Wait for the compute stream (the end of a layer's backward on the device)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()


# ------------------------------------------------------------------ copy bandwidth
@dataclass(frozen=True)
class Bandwidth:
    """Measured page-locked copy bandwidth of one device, bytes per second each way."""

    h2d: float
    d2h: float
    device: str = ""
    measured: dict[str, Any] = field(default_factory=dict)

    def seconds(self, counts: TransferCounts) -> float:
        """The transfer bound of ``counts``: each direction at its own bandwidth, the two
        directions overlapping (PCIe and NVLink-C2C are full duplex), so the longer one."""
        return max(counts.h2d_bytes / self.h2d, counts.d2h_bytes / self.d2h)


def _calibration_file(device: torch.device) -> Path:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return calibration_file("copy", name)


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 28, repeats: int = 5
                   ) -> Bandwidth:
    """The page-locked copy bandwidth of ``device`` each way (median of ``repeats`` copies
    of ``nbytes``), measured once and cached beside the link calibration
    (``$NGRA_CALIBRATION``, else ``~/.ngra/calibration``). On the CPU stand-in: a host
    memory copy's rate, which has no meaning for a GPU (the bound is then only a count)."""
    device = torch.device(device)
    path = _calibration_file(device)
    try:
        d = json.loads(path.read_text())
        return Bandwidth(float(d["h2d"]), float(d["d2h"]), d.get("device", ""), d)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    n = nbytes // 4
    host = pinned_empty((n,), torch.float32, device).fill_(1.0)
    dev = torch.empty(n, dtype=torch.float32, device=device)

    def timed(fn: Any) -> float:
        fn()
        ts = []
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    t_up = timed(lambda: dev.copy_(host, non_blocking=True))
    t_down = timed(lambda: host.copy_(dev, non_blocking=True))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bw = Bandwidth(nbytes / t_up, nbytes / t_down, name)
    try:
        save_calibration(path, {"h2d": bw.h2d, "d2h": bw.d2h, "device": name,
                                "bytes": nbytes, "repeats": repeats}, "the copy bandwidth")
    except OSError as exc:
        log.warning("could not cache the copy bandwidth at %s (%s)", path, exc)
    log.info("copy bandwidth of %s: host->device %.1f GB/s, device->host %.1f GB/s", name,
             bw.h2d / 1e9, bw.d2h / 1e9)
    return bw
