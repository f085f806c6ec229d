"""Argument validation and shape normalization shared by every op.

Every public op validates its arguments here *before* any kernel runs: a numba
kernel handed an out-of-range index corrupts memory instead of raising. The
checks are cheap (a constant number of vectorized passes per call) and every
message says what was expected, what arrived and, where it helps, how to fix it.
The two O(E) scans (offsets monotone, indices in range) are remembered per
tensor: a tensor validated once is not scanned again while its identity and
version counter are unchanged (in-place torch ops bump the version; writes
through a numpy view do not, so do not mutate graph tensors that way).

Shape normalization maps the public feature shapes onto the ``[rows, H, D]``
layout the kernels use: ``H`` groups that a narrower operand broadcasts over
(attention heads) and ``D`` the contiguous inner dimension.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Hashable, Sequence

import torch
from ngra import mapped  # by module: tests watch its release_mapped
from ngra.mapped import is_mapped

__all__ = [
    "FLOAT_DTYPES",
    "INDEX_DTYPES",
    "REDUCES",
    "check_choice",
    "check_csc",
    "check_feat",
    "check_indptr",
    "check_range",
    "check_rev",
    "check_same_device",
    "kernel_offsets",
    "sddmm_layout",
    "spmm_layout",
    "tensor_version",
    "vouch",
]

INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float64)
REDUCES = ("sum", "mean", "max", "min")


def check_choice(value: object, name: str, choices: Sequence[str]) -> str:
    """``value`` must be one of ``choices`` (strings)."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}; got {value!r}.")
    return value


def _check_index(t: object, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32/int64; got {type(t).__name__}.")
    if t.dtype not in INDEX_DTYPES:
        raise TypeError(
            f"{name} must hold integer ids of dtype int32 or int64; got {t.dtype}. "
            f"Convert with {name}.long()."
        )
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D; got shape {list(t.shape)}.")
    return t


def check_indptr(indptr: object, num_edges: int, name: str = "indptr") -> int:
    """Validate CSC/CSR offsets; returns the number of segments.

    ``indptr`` [S + 1] must be a 1-D int32/int64 tensor that starts at 0, never
    decreases and ends at ``num_edges``.
    """
    indptr = _check_index(indptr, name)
    if indptr.numel() == 0:
        raise ValueError(
            f"{name} must have num_segments + 1 >= 1 entries (it starts with 0); "
            "got an empty tensor."
        )
    if _validated.seen(indptr, ("indptr", num_edges)):
        return indptr.numel() - 1
    first, last = _endpoints(indptr)
    if first != 0:
        raise ValueError(f"{name}[0] must be 0; got {first}.")
    if last != num_edges:
        raise ValueError(f"{name}[-1] must equal the number of edges ({num_edges}); got {last}.")
    k = _first_decrease(indptr)
    if k >= 0:
        raise ValueError(
            f"{name} must be non-decreasing (offsets); {name}[{k + 1}] = "
            f"{int(indptr[k + 1])} < {name}[{k}] = {int(indptr[k])}."
        )
    _validated.add(indptr, ("indptr", num_edges))
    return indptr.numel() - 1


def check_range(indices: torch.Tensor, upper: int, name: str, what: str) -> None:
    """Every entry of ``indices`` must lie in ``[0, upper)``."""
    if indices.numel() == 0 or _validated.seen(indices, ("range", upper)):
        return
    lo, hi = _min_max(indices)
    if lo < 0 or hi >= upper:
        raise ValueError(f"{name} must lie in [0, {upper}) ({what}); found {lo if lo < 0 else hi}.")
    _validated.add(indices, ("range", upper))


def vouch(t: torch.Tensor, check: Hashable) -> None:
    """Record that ``t`` passes ``check`` without scanning it: ``("indptr", num_edges)``
    (offsets from 0 to ``num_edges``, non-decreasing) or ``("range", upper)`` (entries in
    ``[0, upper)``). For a copy of arrays that were validated where they came from (the
    device streaming runtime's tiles, copied from a validated graph): a device scan would
    wait for the copy and stall the stream."""
    _validated.add(t, check)


def storage_uses(t: torch.Tensor) -> int:
    """How many references hold ``t``'s storage (one per tensor that shares it, plus the
    storage object this call makes): equal to a calibrated count when nothing else does."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def sole_owner_uses(saved: str) -> int:
    """The :func:`storage_uses` that a tensor an autograd Function saved shows in its
    backward when nothing else holds its memory, measured on a throwaway graph so that
    in-place checks follow torch's bookkeeping instead of assuming it.

    ``saved="output"``: the Function's own output (its consumers' backward done, the
    caller's reference dropped; torch 2.13: 3). ``saved="alias"``: a detached alias of
    its input (the input and its base dropped; torch 2.13: 2). -1 where this torch has
    no storage use count (callers then never write in place).
    """
    seen: list[int] = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            if saved == "output":
                y = x * 1.0
                ctx.save_for_backward(y)
                return y
            ctx.save_for_backward(x.detach())
            return x.sum(-1)

        @staticmethod
        def backward(ctx, grad):
            (t,) = ctx.saved_tensors
            seen.append(storage_uses(t))
            return grad if saved == "output" else grad.unsqueeze(-1).expand(t.shape)

    try:
        if saved == "output":
            y = Probe.apply(torch.zeros(2, requires_grad=True))
            loss = (y * 2.0).sum()
            del y
        else:
            v = (torch.ones(4, 2, requires_grad=True) * 1.0).view(2, 2, 2)
            loss = Probe.apply(v).sum()
            del v
        loss.backward()
    except (AttributeError, RuntimeError):  # a torch without the storage use count
        return -1
    return seen[0]


def tensor_version(t: torch.Tensor) -> int | None:
    """``t``'s in-place version counter (``None`` for inference-mode tensors)."""
    try:
        return t._version
    except RuntimeError:
        return None


class _ValidatedCache:
    """The last few (tensor, check) pairs that passed, keyed by identity and version."""

    def __init__(self, size: int = 32) -> None:
        self._entries: list[tuple[weakref.ref, int, Hashable]] = []
        self._size = size
        self._lock = threading.Lock()

    def seen(self, t: torch.Tensor, check: Hashable) -> bool:
        version = tensor_version(t)
        with self._lock:
            return version is not None and any(
                ref() is t and v == version and c == check for ref, v, c in self._entries
            )

    def add(self, t: torch.Tensor, check: Hashable) -> None:
        version = tensor_version(t)
        if version is None:
            return
        with self._lock:
            live = [e for e in self._entries if e[0]() is not None]
            self._entries = [(weakref.ref(t), version, check)] + live[: self._size - 1]


_validated = _ValidatedCache()


# The scans below run once per new tensor. On CPU they use numpy: single-threaded
# and vectorized, so they never wait on an OpenMP barrier (a torch reduction over
# 1M indices took ~20 ms on a busy 2-core machine, numpy ~2 ms).
def _endpoints(t: torch.Tensor) -> tuple[int, int]:
    if t.device.type == "cpu":
        a = t.numpy()
        return int(a[0]), int(a[-1])
    first, last = torch.stack([t[0], t[-1]]).tolist()
    return first, last


def _first_decrease(t: torch.Tensor) -> int:
    """First ``k`` with ``t[k + 1] < t[k]``, or -1."""
    if t.numel() < 2:
        return -1
    if t.device.type == "cpu":
        a = t.numpy()
        for lo, hi in _host_blocks(a, overlap=1):
            bad = a[lo + 1:hi] < a[lo:hi - 1]
            if bad.any():
                return lo + int(bad.argmax())
        return -1
    bad = t[1:] < t[:-1]
    return int(bad.nonzero()[0, 0]) if bool(bad.any()) else -1


def _min_max(t: torch.Tensor) -> tuple[int, int]:
    if t.device.type == "cpu":
        a = t.numpy()
        parts = [(int(a[lo:hi].min()), int(a[lo:hi].max())) for lo, hi in _host_blocks(a)]
        return min(p[0] for p in parts), max(p[1] for p in parts)
    lo, hi = torch.aminmax(t)
    return int(lo), int(hi)


#: Elements a block when a check reads an array memory-mapped from disk.
_CHECK_BLOCK = 1 << 24


def _host_blocks(a, overlap: int = 0):
    """``(lo, hi)`` ranges covering a 1-D host array: the whole array in memory; blocks of
    :data:`_CHECK_BLOCK` elements (each ``overlap`` more) for one memory-mapped from disk,
    each block's pages dropped once checked, so a check never makes it resident."""

    n = a.shape[0]
    if not is_mapped(a):
        yield 0, n
        return
    for lo in range(0, max(n - overlap, 1), _CHECK_BLOCK):
        hi = min(lo + _CHECK_BLOCK + overlap, n)
        yield lo, hi
        mapped.release_mapped(a, lo, hi)


def check_csc(
    indptr: object,
    indices: object,
    num_src: int | None = None,
    *,
    names: tuple[str, str] = ("indptr", "indices"),
) -> int:
    """Validate a compressed sparse structure; returns the number of destinations.

    ``indptr`` as in :func:`check_indptr` with ``len(indices)`` edges; when
    ``num_src`` is given every entry of ``indices`` must lie in ``[0, num_src)``.
    Both must be 1-D int32/int64 tensors on one device.
    """
    p_name, i_name = names
    indices = _check_index(indices, i_name)
    if isinstance(indptr, torch.Tensor) and indptr.device != indices.device:
        raise ValueError(
            f"{p_name} and {i_name} must be on one device; got {indptr.device} and {indices.device}."
        )
    num_dst = check_indptr(indptr, indices.numel(), p_name)
    if num_src is not None:
        check_range(indices, num_src, i_name, "num_src = rows of the source features")
    return num_dst


def kernel_offsets(indptr: torch.Tensor) -> torch.Tensor:
    """Offsets as kernels take them: int32 or int64 as given on the host (numba compiles
    both, and a graph keeps int32 offsets while ``E < 2**31``, see :mod:`ngra.idtype`);
    int64 on other devices, whose kernels index with int64."""
    if indptr.device.type != "cpu" and indptr.dtype != torch.int64:
        indptr = indptr.to(torch.int64)
    return indptr.contiguous()


def check_rev(
    rev: object, num_src: int, num_dst: int, num_edges: int, device: torch.device
) -> object:
    """Validate the reverse (CSR over sources) structure ``(indptr, indices, perm)``.

    ``perm`` is checked for range only, not for being a permutation: pass what
    :meth:`ngra.Graph.csr` or :func:`ngra.kernels.transpose_csc` returns. A
    :class:`ngra.graph.CSR` (whose arrays ngra built) comes back as it is, its lazily
    built ``perm`` untouched, so that backward passes that read no edge data never
    build it; a tuple comes back as a tuple.
    """
    if getattr(rev, "deferred", False):  # a graph's own reverse, made when first used
        return rev
    lazy = hasattr(rev, "indptr") and hasattr(rev, "indices") and hasattr(rev, "has_perm")
    if lazy:
        n = check_csc(rev.indptr, rev.indices, num_dst, names=("rev_indptr", "rev_indices"))
        if n != num_src or rev.indices.numel() != num_edges:
            raise ValueError(
                f"rev describes {n} sources and {rev.indices.numel()} edges; expected "
                f"{num_src} and {num_edges} (pass the CSR of this graph)."
            )
        for name, t in (("rev_indptr", rev.indptr), ("rev_indices", rev.indices)):
            if t.device != device:
                raise ValueError(f"{name} must be on {device} like the graph; got {t.device}.")
        return rev
    if hasattr(rev, "indptr") and hasattr(rev, "indices") and hasattr(rev, "perm"):
        rev = (rev.indptr, rev.indices, rev.perm)
    if not isinstance(rev, (tuple, list)) or len(rev) != 3:
        raise TypeError(
            "rev must be a tuple (rev_indptr, rev_indices, rev_perm) or an object with fields "
            f"indptr/indices/perm (ngra.Graph.csr()); got {type(rev).__name__}."
        )
    rindptr, rindices, rperm = rev
    n = check_csc(rindptr, rindices, num_dst, names=("rev_indptr", "rev_indices"))
    if n != num_src:
        raise ValueError(
            f"rev_indptr must have num_src + 1 = {num_src + 1} entries (one row per source); "
            f"got {n + 1}."
        )
    if rindices.numel() != num_edges:
        raise ValueError(
            f"rev_indices must have one entry per edge ({num_edges}); got {rindices.numel()}."
        )
    rperm = _check_index(rperm, "rev_perm")
    if rperm.numel() != num_edges:
        raise ValueError(
            f"rev_perm must have one entry per edge ({num_edges}); got {rperm.numel()}."
        )
    check_range(rperm, num_edges, "rev_perm", "positions of the edges in CSC order")
    for name, t in (("rev_indptr", rindptr), ("rev_indices", rindices), ("rev_perm", rperm)):
        if t.device != device:
            raise ValueError(f"{name} must be on {device} like the graph; got {t.device}.")
    return (
        kernel_offsets(rindptr),
        rindices.contiguous(),
        rperm.contiguous(),
    )


def check_feat(t: object, name: str, *, min_dim: int = 1) -> torch.Tensor:
    """A float32/float64 tensor with at least ``min_dim`` dimensions."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}.")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be float32 or float64; got {t.dtype}. Convert with {name}.float()."
        )
    if t.dim() < min_dim:
        want = "[rows]" if min_dim == 1 else "[rows, *F] (at least 2-D)"
        raise ValueError(f"{name} must have shape {want}; got {list(t.shape)}.")
    return t


def check_slope(negative_slope: object) -> float:
    """A LeakyReLU slope: a finite real number (not a bool)."""
    if not isinstance(negative_slope, (int, float)) or isinstance(negative_slope, bool):
        raise TypeError(f"negative_slope must be a float; got {type(negative_slope).__name__}.")
    if not math.isfinite(negative_slope):
        raise ValueError(f"negative_slope must be finite; got {negative_slope}.")
    return float(negative_slope)


def check_same_device(ref: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{name} must be on {ref.device} like the graph; got {t.device}.")


def _pad(shape: Sequence[int], n: int) -> tuple[int, ...]:
    return tuple(shape) + (1,) * (n - len(shape))


def spmm_layout(src_shape: Sequence[int], edge_shape: Sequence[int]) -> tuple[int, int, int]:
    """``(H, D, De)`` such that src is ``[N, H, D]`` and edge_feat ``[E, H, De]``.

    ``edge_shape`` (without the edge dim) must be either the whole feature shape
    of ``src`` (``De = D``) or a prefix of it followed only by 1s (``De = 1``: the
    edge value broadcasts over the trailing source dims), e.g. ``[E]``, ``[E, H]``
    or ``[E, H, 1]`` against ``[N, H, D]``. Raises ValueError otherwise.
    """
    f = tuple(src_shape)
    if len(edge_shape) > len(f):
        fe = tuple(edge_shape)
        if any(s != 1 for s in fe[len(f) :]):
            raise _spmm_shape_error(f, edge_shape)
        fe = fe[: len(f)]
    else:
        fe = _pad(edge_shape, len(f))
    if fe == f:
        return 1, math.prod(f), math.prod(f)
    k = 0
    while k < len(f) and fe[k] == f[k]:
        k += 1
    if any(s != 1 for s in fe[k:]):
        raise _spmm_shape_error(f, edge_shape)
    return math.prod(f[:k]), math.prod(f[k:]), 1


def _spmm_shape_error(f: tuple[int, ...], fe: Sequence[int]) -> ValueError:
    return ValueError(
        f"edge_feat of shape [E, {', '.join(map(str, fe))}] cannot broadcast over src_feat's "
        f"feature shape {list(f)}: expected [E], [E, *F[:k]] (a prefix of the feature shape, "
        "e.g. [E, H] with src_feat [N, H, D]) or [E, *F] (the same feature shape)."
    )


def sddmm_layout(
    lhs_shape: Sequence[int], rhs_shape: Sequence[int], op: str
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, int, int, int]] | None:
    """Plan the ``[rows, H, D]`` views of gsddmm's operands.

    Feature shapes are aligned on the left (the shorter one is padded with
    trailing 1s, like gspmm's edge features) and broadcast dim by dim. Returns
    ``(full, out_shape, (H, Dl, Dr, Do))``: ``full`` the broadcast feature shape,
    ``out_shape`` the public per-edge output shape (``dot`` drops the last dim),
    and the kernel layout, or ``None`` for the layout when the operands need
    expanding to ``full`` first (a broadcast that is not a trailing one).
    Raises ValueError when the shapes do not broadcast.
    """
    n = max(len(lhs_shape), len(rhs_shape))
    if op == "dot" and n == 0:
        raise ValueError(
            "gsddmm op='dot' reduces the last feature dim, but both operands are 1-D "
            "([rows]); give them a feature dim, or use op='mul'."
        )
    a, b = _pad(lhs_shape, n), _pad(rhs_shape, n)
    full = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ValueError(
                f"gsddmm operands' feature shapes {list(lhs_shape)} and {list(rhs_shape)} do not "
                "broadcast (aligned on the left, each dim must match or be 1)."
            )
        full.append(max(x, y) if x and y else 0)
    full_t = tuple(full)
    if op == "dot":
        out_shape = full_t[:-1]
        if a[:-1] != b[:-1]:
            return full_t, out_shape, None
        d = full_t[-1]
        return full_t, out_shape, (math.prod(full_t[:-1]), a[-1], b[-1], 1)
    out_shape = full_t
    if a == b:
        d = math.prod(full_t)
        return full_t, out_shape, (1, d, d, d)
    k = 0
    while a[k] == b[k]:
        k += 1
    if all(s == 1 for s in a[k:]):
        d = math.prod(b[k:])
        return full_t, out_shape, (math.prod(a[:k]), 1, d, d)
    if all(s == 1 for s in b[k:]):
        d = math.prod(a[k:])
        return full_t, out_shape, (math.prod(a[:k]), d, 1, d)
    return full_t, out_shape, None
