"""Dropout with a counter-based mask: the same distribution as ``F.dropout``, drawn in parallel.

Each element is kept with probability ``1 - p`` (to within ``2**-32``) and scaled
by ``1 / (1 - p)``; the mask is a hash of the element's index and two seeds that
come from torch's default generator, so ``torch.manual_seed`` and RNG-state
replay (the streaming executor's recomputing backward) reproduce it, on any
number of threads. It is not bit-identical to ``F.dropout``'s stream.

Because the mask is a function of the seeds, no mask is stored: backward is the
same kernel applied to the incoming gradient.

Where the seeds are drawn follows the kernel that reads them (:func:`seed_device`): the
cpu (numba) and ref kernels take two Python ints from torch's CPU generator; the gpu
backend's kernels take two int64 tensors drawn on the data's device, from that device's
generator (the CPU one for CPU tensors under Triton's interpreter: the same numbers). A
device draw needs no host round trip, and a captured CUDA graph
(:mod:`ngra.runtime.cuda_graph`) replays it as a fresh draw each time, where host ints
would be frozen into the graph; :func:`host_seed_draws` lets a caller see whether a step
drew any host seeds.

Inside ``with dropout_rows(ids):`` a tensor with one row per id draws row ``r``'s
elements from index ``ids[r] * row_size + column`` instead of its flat position: a
process holding some rows of a larger tensor (multi-device training: ``ids`` are the
rows' global vertex ids) draws exactly the mask the whole tensor would get, whatever
rows it holds.

:class:`EdgeDropout` is the same generator for per-(edge, head) weights inside
:func:`~ngra.kernels.softmax_aggregate` and :func:`~ngra.kernels.attention_aggregate`
(attention dropout): there the draw's index is the edge's *counter* times ``H`` plus the
head, so a weight's mask depends on which edge it belongs to, not on where the edge sits
in a tile or a CSC array (or on which rank holds it).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from ngra.kernels.checks import check_feat
from ngra.kernels.registry import (backend_for, current_backend, lookup, thread_setting,
                                   use_backend)

__all__ = ["EdgeDropout", "Seed", "check_attention_p", "check_edge_dropout", "check_p",
           "draw_seeds", "dropout", "dropout_rows", "host_seed_draws", "row_base", "seed_device"]

_rows = threading.local()
_watch = threading.local()

#: A 32-bit seed: a Python int (host kernels) or a 0-dim int64 tensor on the data's device
#: (the gpu backend's kernels; see :func:`seed_device`).
Seed = int | torch.Tensor


def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True) -> torch.Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    Args:
        x: float32/float64 tensor of any shape.
        p: drop probability in ``[0, 1]``. (default: ``0.5``)
        training: identity when ``False``. (default: ``True``)

    Returns:
        A tensor shaped like ``x`` (``x`` itself when not training or ``p == 0``).
    """
    check_p(p)
    x = check_feat(x, "x")
    if not training or p == 0:
        return x
    if p == 1:
        return x * 0
    return _Dropout.apply(x, float(p))


@contextlib.contextmanager
def dropout_rows(ids: torch.Tensor | None) -> Iterator[None]:
    """Draw the masks of ``[len(ids), ...]`` tensors by global row id in the block.

    Args:
        ids: ``[R]`` int64 global row ids of the rows this process holds (``None``:
            flat positions, the default). Tensors with another row count keep flat
            positions.
    """
    if ids is not None:
        ids = torch.as_tensor(ids).to(torch.int64)
        if ids.dim() != 1:
            raise ValueError(f"dropout_rows: ids must be 1-D [rows]; got shape {list(ids.shape)}.")
    with thread_setting(_rows, "ids", ids):
        yield


def row_base(x: torch.Tensor) -> torch.Tensor | None:
    """``[R]`` flat index of each row's first element under :func:`dropout_rows`
    (``ids * row_size``), or ``None`` when ``x`` draws by flat position."""
    ids = getattr(_rows, "ids", None)
    if ids is None or x.dim() == 0 or x.shape[0] != ids.shape[0]:
        return None
    row = x.numel() // x.shape[0] if x.shape[0] else 0
    return (ids.to(x.device) * row).contiguous()


def check_p(p: float) -> None:
    """Raise ``ValueError`` unless ``p`` is a drop probability in ``[0, 1]``."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"dropout probability must be a number in [0, 1]; got {p!r}.")


def draw_seeds(p: float, device: torch.device | None = None) -> tuple[Seed, Seed, int, float]:
    """``(s1, s2, thr, scale)`` for the ``dropout`` kernels: two seeds, the keep threshold
    and ``1 / (1 - p)``, for ``0 < p < 1``.

    The seeds are Python ints from torch's CPU generator when ``device`` is ``None``, else
    0-dim int64 tensors drawn on ``device`` by its generator (:func:`seed_device` says
    which a kernel takes). Element ``i`` of a flattened tensor draws from
    ``(i + s1) mod 2**32``: a block that starts at flat index ``k`` gets the whole
    tensor's mask with ``s1 + k``.
    """
    if device is None:
        s1, s2 = (int(s) for s in torch.randint(0, 2**32, (2,), dtype=torch.int64))
        drawn = getattr(_watch, "draws", None)
        if drawn is not None:
            drawn.append(p)
    else:
        seeds = torch.randint(0, 2**32, (2,), dtype=torch.int64, device=device)
        s1, s2 = seeds[0], seeds[1]
    return s1, s2, min(round(p * 2**32), 2**32), 1.0 / (1.0 - p)


def seed_device(device: torch.device, op: str = "dropout") -> torch.device | None:
    """Where :func:`draw_seeds` draws the seeds of ``op``'s kernel on ``device`` tensors:
    ``device`` itself when the kernel is the gpu backend's (it reads seeds from device
    memory), ``None`` (host ints) for the cpu and ref kernels."""
    return device if backend_for(op, device) == "gpu" else None


@contextlib.contextmanager
def host_seed_draws() -> Iterator[list[float]]:
    """Inside the block, the list it yields collects the ``p`` of every seed pair this
    thread draws on the host (:func:`draw_seeds` without a device): dropout that a
    captured CUDA graph would freeze to one mask."""
    drawn: list[float] = []
    with thread_setting(_watch, "draws", drawn):
        yield drawn


def check_attention_p(p: float, who: str = "attention dropout") -> float:
    """``p`` as a float; ``ValueError`` unless it is a drop probability in ``[0, 1)`` (at
    ``p = 1`` every weight would be dropped and the rest scaled by infinity)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise ValueError(f"{who} probability must be a number in [0, 1); got {p!r}.")
    return float(p)


@dataclass(frozen=True)
class EdgeDropout:
    """Dropout of the normalized attention weights of a softmax aggregation.

    Weight ``(j, h)`` (edge ``j`` of the kernel's CSC edges, head ``h`` of ``H``) is kept
    when the :func:`dropout` kernels' 32-bit draw of the flat index
    ``counter[j] * H + h`` with seeds ``(s1, s2)`` is ``>= thr`` (probability ``1 - p``)
    and is then scaled by ``1 / (1 - p)``: the mask :func:`dropout` would give an
    ``[E, H]`` tensor whose row ``counter[j]`` holds edge ``j``'s weights. Kernels hash
    it where they use a weight, in forward and again in backward; no mask is stored.

    ``counter`` is the hook that makes the masks independent of how edges are laid
    out: the runtime passes each edge's id in the graph's *original* edge order
    (``Graph.perm``, in CSC order; :func:`ngra.runtime.executor.default_edge_counter`;
    ``None`` is the identity, edge ``j``'s counter ``j`` itself, for a graph whose CSC
    order is the caller's edge order: no ``[E]`` array is made, the kernels use the
    position and a backward walk by source reads its ``rev_perm``), restricted
    to a tile's edges by :meth:`take`, so every tile grid and every CSC order draws the
    same masks. A distributed runtime passes the global edge ids of a rank's local
    edges instead, and every rank then draws the masks of one global graph.

    A backward that walks the edges by source (the reverse CSR, ``rev``) reads the
    counters in that order, ``counter[rev_perm]``: gathered there, that is one random
    read per edge inside the walk (on R-MAT it made the cpu backward's source pass
    1.6x slower). :meth:`reverse_counter` gives them in one contiguous array instead,
    kept in :attr:`reverse` by whoever made it for a ``rev_perm`` (the runtime caches it
    per graph), else gathered once per call.

    Attributes:
        p: drop probability in ``(0, 1)``.
        counter: ``[E]`` int32 or int64 counter of each edge, in the kernel's CSC order,
            kept in the dtype it came in (a cast would be a fresh ``[E]`` array each call;
            the hash reads the index modulo ``2**32``, the same in either width); ``None``
            for the identity.
        s1, s2: the two 32-bit seeds (:func:`draw_seeds`): ints, or 0-dim int64 tensors on
            the counters' device for the gpu backend's kernels.
        reverse: ``(rev_perm, counter[rev_perm])`` for a reverse CSR, or ``None``.
        num_edges: ``E``, given with the identity counter (else ``counter``'s length).
    """

    p: float
    counter: torch.Tensor | None
    s1: Seed
    s2: Seed
    reverse: tuple[torch.Tensor, torch.Tensor] | None = None
    num_edges: int | None = None

    @classmethod
    def draw(cls, p: float, counter: torch.Tensor | None,
             reverse: tuple[torch.Tensor, torch.Tensor] | None = None,
             num_edges: int | None = None,
             device: torch.device | None = None) -> EdgeDropout | None:
        """Seeds from torch's default generator (``None`` when ``p == 0``: no dropout).

        Args:
            p: drop probability in ``[0, 1)``.
            counter: ``[E]`` int32/int64 edge counters (e.g. ``Graph.perm``), or ``None``
                for the identity (then ``num_edges`` gives ``E``).
            reverse: ``(rev_perm, counter[rev_perm])`` (see the class docstring), or ``None``.
            device: where the aggregation runs (default: the counter's device, the CPU
                for the identity); its backend decides where the seeds are drawn
                (:func:`seed_device`).
        """
        p = check_attention_p(p)
        if counter is None:
            if isinstance(num_edges, bool) or not isinstance(num_edges, int) or num_edges < 0:
                raise TypeError(f"the identity edge counter needs num_edges, an int >= 0; got "
                                f"{num_edges!r}.")
        elif not isinstance(counter, torch.Tensor) or counter.dim() != 1 or \
                counter.dtype not in (torch.int32, torch.int64):
            got = (f"{counter.dtype} tensor of shape {list(counter.shape)}"
                   if isinstance(counter, torch.Tensor) else type(counter).__name__)
            raise TypeError(f"the edge counter must be a 1-D int32/int64 tensor [E]; got {got}.")
        if p == 0:
            return None
        if device is None:
            device = torch.device("cpu") if counter is None else counter.device
        s1, s2, _, _ = draw_seeds(p, seed_device(device, "softmax_aggregate_fwd"))
        return cls(p, counter, s1, s2, None if counter is None else reverse,
                   num_edges if counter is None else None)

    @property
    def thr(self) -> int:
        """The keep threshold of a 32-bit draw."""
        return min(round(self.p * 2**32), 2**32)

    @property
    def scale(self) -> float:
        return 1.0 / (1.0 - self.p)

    @property
    def size(self) -> int:
        """``E``: the edges this dropout covers."""
        return self.num_edges if self.counter is None else self.counter.numel()

    def counters(self, device: torch.device | None = None) -> torch.Tensor:
        """``[E]``: :attr:`counter`, or the identity made as an array (for the reference
        and the generic executor; kernels read the identity without one)."""
        if self.counter is None:
            return torch.arange(self.num_edges, device=device)
        return self.counter

    def take(self, edge_ids: torch.Tensor | None) -> EdgeDropout:
        """The same dropout on a subset of the edges (``edge_ids``: their positions in
        :attr:`counter`, e.g. a tile's; ``None``: every edge). The identity's counters
        of those edges are ``edge_ids`` themselves."""
        if edge_ids is None:
            return self
        if self.counter is None:
            return EdgeDropout(self.p, edge_ids, self.s1, self.s2)
        return EdgeDropout(self.p, self.counter.index_select(
            0, edge_ids.to(self.counter.device).long()), self.s1, self.s2)

    def reverse_counter(self, rev_perm: torch.Tensor) -> torch.Tensor:
        """``[E]``: the counters in the order of a reverse CSR whose CSC positions are
        ``rev_perm``, ``counter[rev_perm]`` (:attr:`reverse`'s when made for this very
        ``rev_perm`` tensor, else gathered now; the identity's are ``rev_perm`` itself)."""
        if self.counter is None:
            return rev_perm
        if self.reverse is not None and self.reverse[0] is rev_perm:
            return self.reverse[1]
        return self.counter.index_select(0, rev_perm.long())

    def factors(self, heads: int, dtype: torch.dtype,
                device: torch.device | None = None) -> torch.Tensor:
        """``[E, heads]`` of ``dtype``: ``1 / (1 - p)`` where weight ``(j, h)`` is kept,
        else 0 (materialized: for the generic executor and tests; kernels hash in place)."""
        from ngra.kernels.ref.dropout import edge_keep_scale

        return edge_keep_scale(self, heads, dtype, device)


def check_edge_dropout(drop: object, num_edges: int, device: torch.device
                       ) -> EdgeDropout | None:
    """``drop`` (an :class:`EdgeDropout` or ``None``), after checking that it holds one
    counter per edge, on the graph's device."""
    if drop is None:
        return None
    if not isinstance(drop, EdgeDropout):
        raise TypeError(f"dropout must be an ngra.kernels.EdgeDropout or None; got "
                        f"{type(drop).__name__}. Make one with EdgeDropout.draw(p, counter).")
    if drop.size != num_edges:
        raise ValueError(f"dropout.counter must hold one counter per edge ([{num_edges}]); "
                         f"got {drop.size}.")
    if drop.counter is not None and drop.counter.device != device:
        raise ValueError(f"dropout.counter is on {drop.counter.device}, the graph on {device}.")
    return drop


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        ctx.backend = current_backend()
        ctx.seeds = draw_seeds(p, seed_device(x.device))
        ctx.base = row_base(x)
        return lookup("dropout", x.device)(x.contiguous(), *ctx.seeds, ctx.base)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        # d out / d x is the same mask and scale: the forward kernel applied to grad
        with use_backend(ctx.backend):
            return lookup("dropout", grad.device)(grad.contiguous(), *ctx.seeds, ctx.base), None
