"""Halo exchange: one ``all_to_all`` of exactly the rows each rank reads, and its reverse.

Rank ``r`` owns ``D`` rows and reads ``H`` halo rows owned by other ranks (see
:mod:`ngra.partition.book`). Forward packs the owned rows each peer reads (``send_idx``,
grouped by peer) of every exchanged term into one ``[S, W]`` buffer (``W``: the terms'
widths side by side), and one ``all_to_all_single`` with per-peer split sizes returns the
``[H, W]`` halo block; each term comes out as ``[D + H, ...]``: owned rows, then halo rows.
Backward is the same exchange reversed: the halo rows' gradients go back to their owners,
which add them into the owned rows they came from (``index_add_``).

Terms of different dtypes travel in one exchange per dtype; terms that are not floating
point travel without a backward.

:func:`start_exchange` and :func:`start_reverse` are the same two exchanges started
asynchronously (gloo's work queue moves the bytes while the caller computes): the
overlapped halo (:mod:`ngra.distributed.overlap`) runs its inner edges meanwhile and
waits only for what is left. Each exchange can report to an :class:`ExchangeRecord`
(bytes sent, seconds blocked waiting) for the run's summary.

With ``HaloPlan.bits = 8`` (``--halo-bits 8``, off by default) floating-point rows
travel quantized, both ways (the rows forward, their gradients backward): each packed
row as int8 values with one float32 scale (``max |row| / 127``, rounded to nearest,
:func:`quantize_rows`), dequantized on arrival; a row of ``W`` floats costs ``W + 4``
bytes instead of ``4 W``. Owned rows are never quantized: only what crosses the link.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["HALO_BITS", "ExchangeRecord", "HaloPlan", "PendingRows", "Traffic",
           "dequantize_rows", "exchange_rows", "quantize_rows", "start_exchange",
           "start_reverse"]

#: Quantized widths a halo can travel at (``--halo-bits``; ``None``: exact).
HALO_BITS = (8,)


@dataclass
class Traffic:
    """Bytes this rank handed to the network, by kind (``halo``, ``ring``, ``allreduce``)."""

    sent: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, nbytes: int) -> None:
        self.sent[kind] = self.sent.get(kind, 0) + int(nbytes)

    def take(self) -> dict[str, int]:
        """The counts so far, and start again from zero."""
        out, self.sent = self.sent, {}
        return out


@dataclass
class ExchangeRecord:
    """One layer call's exchange on this rank: bytes it sent and seconds its compute
    thread was blocked waiting for the exchange (the whole transfer when it blocks; what
    the transfer took beyond the overlapped compute otherwise), forward and backward."""

    forward_bytes: int = 0
    backward_bytes: int = 0
    forward_wait_s: float = 0.0
    backward_wait_s: float = 0.0

    def add(self, phase: str, nbytes: int, wait_s: float) -> None:
        if phase == "forward":
            self.forward_bytes += int(nbytes)
            self.forward_wait_s += wait_s
        else:
            self.backward_bytes += int(nbytes)
            self.backward_wait_s += wait_s

    @property
    def bytes(self) -> int:
        return self.forward_bytes + self.backward_bytes

    @property
    def wait_s(self) -> float:
        return self.forward_wait_s + self.backward_wait_s


@dataclass
class HaloPlan:
    """Who sends which rows to whom (one rank's side; see the module docstring).

    Attributes:
        num_own: ``D``. num_halo: ``H``.
        send_idx: ``[S]`` int64 owned rows to send, grouped by receiving rank.
        send_counts, recv_counts: ``[K]`` rows sent to / received from each rank.
        group: the process group of the exchange. traffic: where bytes are counted.
        bits: ``8``: floating-point rows travel quantized (module docs); ``None``: exact.
    """

    num_own: int
    num_halo: int
    send_idx: torch.Tensor
    send_counts: list[int]
    recv_counts: list[int]
    group: Any = None
    traffic: Traffic = field(default_factory=Traffic)
    bits: int | None = None

    @property
    def num_send(self) -> int:
        return int(self.send_idx.numel())

    def to(self, device: torch.device) -> HaloPlan:
        if self.send_idx.device == device:
            return self
        return HaloPlan(self.num_own, self.num_halo, self.send_idx.to(device), self.send_counts,
                        self.recv_counts, self.group, self.traffic, self.bits)


def _width(t: torch.Tensor) -> int:
    return math.prod(t.shape[1:])


def _pack(rows: list[torch.Tensor], idx: torch.Tensor | None, n: int) -> torch.Tensor:
    """``[n, W]``: each tensor's rows ``idx`` (all rows when ``None``) side by side."""
    widths = [_width(t) for t in rows]
    if len(rows) == 1:
        flat = rows[0].reshape(rows[0].shape[0], widths[0])
        return (flat if idx is None else flat.index_select(0, idx)).contiguous()
    out = rows[0].new_empty(n, sum(widths))
    off = 0
    for t, w in zip(rows, widths):
        flat = t.reshape(t.shape[0], w)
        out[:, off:off + w] = flat if idx is None else flat.index_select(0, idx)
        off += w
    return out


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """``[n, W]`` floating point as ``[n, W + 4]`` uint8: each row's int8 values
    (``round(x / scale)``, ``scale = max |row| / 127``), then its float32 scale's bytes."""
    n, w = x.shape
    out = torch.empty((n, w + 4), dtype=torch.uint8, device=x.device)
    if n == 0:
        return out
    scale = (x.detach().abs().amax(dim=1, keepdim=True).to(torch.float32) / 127.0
             if w else x.new_zeros((n, 1), dtype=torch.float32))
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (x.detach().to(torch.float32) / safe).round_().clamp_(-127, 127).to(torch.int8)
    out[:, :w] = q.view(torch.uint8)
    out[:, w:] = scale.view(torch.uint8)
    return out


def dequantize_rows(buf: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`quantize_rows`: ``[n, W + 4]`` uint8 as ``[n, W]`` ``dtype``."""
    n, w = buf.shape[0], buf.shape[1] - 4
    if n == 0:
        return buf.new_empty((0, w), dtype=dtype)
    q = buf[:, :w].contiguous().view(torch.int8)
    scale = buf[:, w:].contiguous().view(torch.float32)
    return (q.to(torch.float32) * scale).to(dtype)


def _quantized(plan: HaloPlan, send: torch.Tensor) -> bool:
    return plan.bits is not None and send.is_floating_point()


def _all_to_all(plan: HaloPlan, send: torch.Tensor, out_rows: int, out_counts: list[int],
                in_counts: list[int], record: ExchangeRecord | None = None,
                phase: str = "forward") -> torch.Tensor:
    dtype, quantized = send.dtype, _quantized(plan, send)
    if quantized:
        send = quantize_rows(send)
    recv = send.new_empty((out_rows, send.shape[1]))
    t0 = time.perf_counter()
    dist.all_to_all_single(recv, send, output_split_sizes=out_counts,
                           input_split_sizes=in_counts, group=plan.group)
    nbytes = send.numel() * send.element_size()
    plan.traffic.add("halo", nbytes)
    if record is not None:
        record.add(phase, nbytes, time.perf_counter() - t0)
    return dequantize_rows(recv, dtype) if quantized else recv


def _exchange(plan: HaloPlan, own: list[torch.Tensor],
              record: ExchangeRecord | None = None) -> list[torch.Tensor]:
    send = _pack(own, plan.send_idx, plan.num_send)
    recv = _all_to_all(plan, send, plan.num_halo, plan.recv_counts, plan.send_counts, record)
    outs, off = [], 0
    for t in own:
        w = _width(t)
        halo = recv[:, off:off + w].reshape((plan.num_halo,) + tuple(t.shape[1:]))
        outs.append(torch.cat([t, halo]))
        off += w
    return outs


class _HaloExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, plan: HaloPlan, record: ExchangeRecord | None,
                *own: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.plan, ctx.record = plan, record
        ctx.like = [(t.shape, t.dtype) for t in own]
        return tuple(_exchange(plan, list(own), record))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        plan, d = ctx.plan, ctx.plan.num_own
        device = next((g.device for g in grads if g is not None), plan.send_idx.device)
        full = [g if g is not None else torch.zeros((d + plan.num_halo,) + tuple(s[1:]),
                                                    dtype=dt, device=device)
                for g, (s, dt) in zip(grads, ctx.like)]
        g_halo = _pack([g[d:] for g in full], None, plan.num_halo)
        g_send = _all_to_all(plan, g_halo, plan.num_send, plan.send_counts, plan.recv_counts,
                             ctx.record, "backward")
        outs, off = [], 0
        for g in full:
            w = _width(g)
            own = g[:d].clone()
            own.reshape(d, w).index_add_(0, plan.send_idx, g_send[:, off:off + w])
            outs.append(own)
            off += w
        return (None, None, *outs)


def exchange_rows(plan: HaloPlan, own: list[torch.Tensor], *,
                  record: ExchangeRecord | None = None) -> list[torch.Tensor]:
    """Each ``[D, ...]`` tensor of ``own`` as ``[D + H, ...]``: owned rows, then halo rows.

    Differentiable in the floating-point tensors (backward: the reverse exchange). Every
    rank of the group must call it with the same number of tensors of the same dtypes
    and trailing shapes. ``record``: where the bytes and the blocked seconds are added.
    """
    plan = plan.to(own[0].device) if own else plan
    out: list[torch.Tensor | None] = [None] * len(own)
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(own):
        groups.setdefault((t.dtype, t.is_floating_point()), []).append(i)
    for (_, floating), idx in groups.items():
        ts = [own[i].contiguous() for i in idx]
        if floating and torch.is_grad_enabled() and any(t.requires_grad for t in ts):
            res = _HaloExchange.apply(plan, record, *ts)
        else:
            with torch.no_grad():
                res = _exchange(plan, ts, record)
        for i, r in zip(idx, res):
            out[i] = r
    return out  # type: ignore[return-value]


class PendingRows:
    """An exchange under way (:func:`start_exchange`, :func:`start_reverse`): :meth:`wait`
    blocks until it is done and returns the rows received, one tensor per one sent."""

    def __init__(self, works: list[Any],
                 parts: list[tuple[torch.Tensor, list[int], torch.dtype | None]],
                 like: list[torch.Tensor], rows: int, nbytes: int,
                 record: ExchangeRecord | None, phase: str) -> None:
        self._works, self._parts, self._like, self._rows = works, parts, like, rows
        self.nbytes, self._record, self._phase = nbytes, record, phase

    def wait(self) -> list[torch.Tensor]:
        """``[rows, ...]`` per tensor sent, shaped like it past the first dimension."""
        t0 = time.perf_counter()
        for w in self._works:
            w.wait()
        if self._record is not None:
            self._record.add(self._phase, self.nbytes, time.perf_counter() - t0)
        out: list[torch.Tensor | None] = [None] * len(self._like)
        for recv, idx, dtype in self._parts:
            if dtype is not None:  # quantized on the way
                recv = dequantize_rows(recv, dtype)
            off = 0
            for i in idx:
                t = self._like[i]
                w = _width(t)
                out[i] = recv[:, off:off + w].reshape((self._rows,) + tuple(t.shape[1:]))
                off += w
        return out  # type: ignore[return-value]


def _start(plan: HaloPlan, ts: list[torch.Tensor], idx: torch.Tensor | None, n_send: int,
           n_recv: int, recv_counts: list[int], send_counts: list[int],
           record: ExchangeRecord | None, phase: str) -> PendingRows:
    groups: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(ts):
        groups.setdefault(t.dtype, []).append(i)
    works, parts, nbytes = [], [], 0
    for dtype, members in groups.items():
        send = _pack([ts[i].detach() for i in members], idx, n_send)
        quantized = _quantized(plan, send)
        if quantized:
            send = quantize_rows(send)
        recv = send.new_empty((n_recv, send.shape[1]))
        works.append(dist.all_to_all_single(recv, send, output_split_sizes=recv_counts,
                                            input_split_sizes=send_counts, group=plan.group,
                                            async_op=True))
        nbytes += send.numel() * send.element_size()
        parts.append((recv, members, dtype if quantized else None))
    plan.traffic.add("halo", nbytes)
    return PendingRows(works, parts, ts, n_recv, nbytes, record, phase)


def start_exchange(plan: HaloPlan, own: list[torch.Tensor], *,
                   record: ExchangeRecord | None = None) -> PendingRows:
    """Start sending the rows of each ``[D, ...]`` tensor of ``own`` that the peers read;
    the result's ``wait()`` gives each tensor's ``[H, ...]`` halo rows (no owned rows, no
    autograd: the caller differentiates, see :func:`start_reverse`). Collective, like
    :func:`exchange_rows`."""
    plan = plan.to(own[0].device) if own else plan
    return _start(plan, own, plan.send_idx, plan.num_send, plan.num_halo, plan.recv_counts,
                  plan.send_counts, record, "forward")


def start_reverse(plan: HaloPlan, halo: list[torch.Tensor], *,
                  record: ExchangeRecord | None = None) -> PendingRows:
    """Start returning each ``[H, ...]`` tensor of ``halo`` (the halo rows' gradients) to
    the ranks that own those rows; the result's ``wait()`` gives ``[S, ...]`` per tensor,
    row ``i`` to be added into owned row ``plan.send_idx[i]``. Collective."""
    plan = plan.to(halo[0].device) if halo else plan
    return _start(plan, halo, None, plan.num_halo, plan.num_send, plan.send_counts,
                  plan.recv_counts, record, "backward")
