"""The link model: alpha-beta costs of each collective, measured once per machine.

One calibrated model of the link serves both the distributed exchange's choice
between halo and ring (:mod:`ngra.distributed.cost`) and the dense-layer planner.
Each operation ``op`` costs ``alpha + beta * x`` seconds, with ``x`` in bytes:

* ``p2p``: one ring step, every rank sending ``n`` bytes to the next and receiving
  ``n`` from the previous (async send/recv): ``x = n``;
* ``all_to_all``: ``all_to_all_single`` in which every rank sends ``n`` bytes in all
  (``n / p`` to each rank): ``x = n``;
* ``all_reduce``: the ring algorithm's ``2(p-1)`` steps of ``n / p`` bytes:
  ``t = 2(p-1) alpha + 2(p-1)/p n beta``, i.e. ``x = 2(p-1)/p n`` and ``alpha`` per step;
* ``all_gather``: ``p - 1`` steps of ``n / p`` bytes for an ``n``-byte result;
* ``broadcast``: ``x = n``.

Besides the link, the model holds a rank's compute rates: ``gemm_flops`` (float32
matrix products), ``gather_bytes`` (random row gathers, the bound of a sparse
aggregation), ``stream_bytes`` (element-wise ops) and ``gemm``, GEMM rates by shape
(:class:`GemmTable`: about 40 shapes of rows x in x out, interpolated: a thin or
cache-sized product runs at another rate than a large square one). They are
timed on every rank at once, one short operation a timing: ranks that share a core run
such a burst one after the other, so these are the rates of a rank alone.

Two more numbers let the planner predict what torch's parallel modules do on this
machine: ``shared``, how much slower a rank computes when all ranks compute at once
than alone, over runs long enough for the scheduler to share the cores (ranks that
share a host's cores: a run's compute costs the rates above times ``shared``, and a
pipeline's idle stages leave their cores to the busy ones), and ``tp_layer``, what a
DTensor (tensor-parallel) Linear costs beyond its GEMMs and its collective (dispatch,
layouts), per layer.

A collective among ``p`` ranks of a larger world (the data- or tensor-parallel group
of a planner's mesh) is measured too: ``groups[p]`` holds the fits of every op run in
all ``world_size / p`` disjoint groups of ``p`` consecutive ranks at once, as those
groups run in a plan. Without them, the world's fits stand in.

:func:`link_model` is collective: rank 0 reads the cached calibration of this host,
backend, device and world size (``$NGRA_CALIBRATION``, else ``~/.ngra/calibration``),
or every rank measures (:func:`measure`, about a second) and rank 0 writes it; every rank
gets the same model. :func:`calibrate` does the same from one process by starting the
ranks itself (``ngra plan --calibrate``).
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import socket
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ngra.calibration import calibration_file, save_calibration

__all__ = ["AlphaBeta", "GemmTable", "LinkModel", "OPS", "calibrate", "calibration_path",
           "link_model", "load_link", "measure", "save_link"]

log = logging.getLogger(__name__)

OPS = ("p2p", "all_to_all", "all_reduce", "all_gather", "broadcast")
SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 23)  # bytes each rank sends
VERSION = 4
GEMM_REPEATS = 3


@dataclass(frozen=True)
class AlphaBeta:
    """``alpha + beta * x`` seconds for ``x`` bytes (``alpha`` s, ``beta`` s/byte)."""

    alpha: float
    beta: float

    def __call__(self, x: float) -> float:
        return self.alpha + self.beta * float(x)

    @property
    def bandwidth(self) -> float:
        """Bytes per second (``1 / beta``; ``inf`` for a free link)."""
        return float("inf") if self.beta <= 0 else 1.0 / self.beta

    @staticmethod
    def fit(xs: list[float], ts: list[float]) -> AlphaBeta:
        """Least squares ``t = alpha + beta x`` with both terms kept non-negative."""
        n = len(xs)
        mx, mt = sum(xs) / n, sum(ts) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        beta = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sxx if sxx else 0.0
        alpha = mt - beta * mx
        if beta < 0:
            return AlphaBeta(max(mt, 0.0), 0.0)
        if alpha < 0:
            sx2 = sum(x * x for x in xs)
            return AlphaBeta(0.0, sum(x * t for x, t in zip(xs, ts)) / sx2 if sx2 else 0.0)
        return AlphaBeta(alpha, beta)


@dataclass(frozen=True)
class GemmTable:
    """Seconds of an ``[m, k] x [k, n]`` float32 product, from measured shapes.

    ``samples`` are ``(m, k, n, seconds)``; a shape's FLOP rate is the inverse-distance
    weighted mean of the log rates of its four nearest samples in ``(log m, log k,
    log n)``. A rate, not a formula: small products that stay in cache run several
    times faster per FLOP than large ones here, which no ``c + flops / F + bytes / W``
    fit of a dozen shapes followed.
    """

    samples: tuple[tuple[float, float, float, float], ...]
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __call__(self, m: float, k: float, n: float) -> float:
        if min(m, k, n) <= 0:
            return 0.0
        key = (m, k, n)
        if key not in self._cache:
            self._cache[key] = 2.0 * m * k * n / self.rate(m, k, n)
        return self._cache[key]

    def rate(self, m: float, k: float, n: float) -> float:
        """FLOP/s of an ``[m, k] x [k, n]`` product."""
        at = (math.log2(m), math.log2(k), math.log2(n))
        near = sorted(
            (sum((a - math.log2(b)) ** 2 for a, b in zip(at, smp[:3])),
             math.log(2.0 * smp[0] * smp[1] * smp[2] / smp[3]))
            for smp in self.samples)[:4]
        weights = [1.0 / (d + 0.05) for d, _ in near]
        return math.exp(sum(w * r for w, (_, r) in zip(weights, near)) / sum(weights))


def gemm_shapes(max_flops: float = 5e8) -> list[tuple[int, int, int]]:
    """The shapes :func:`measure` times: rows x in x out over the widths a planner sees,
    the rows halved until a product is at most ``max_flops``."""
    out: list[tuple[int, int, int]] = []
    for m in (64, 512, 4096):
        for k in (16, 128, 1024, 4096):
            for n in (16, 128, 1024, 4096):
                rows = m
                while rows > 16 and 2 * rows * k * n > max_flops:
                    rows //= 2
                if (rows, k, n) not in out:
                    out.append((rows, k, n))
    return out


@dataclass(frozen=True)
class LinkModel:
    """Measured costs of one machine's link (see the module docstring).

    Attributes:
        backend, device, world_size, host: what was measured.
        ops: ``op -> AlphaBeta`` for each of :data:`OPS` (``alpha`` per step for the
            ring collectives).
        gemm_flops: float32 GEMM rate per rank, FLOP/s (one square-ish shape).
        gather_bytes: random row-gather rate per rank, bytes/s.
        measured: when (ISO time); samples: the raw ``op -> [[bytes, seconds], ...]``.
        gemm: GEMM time by shape (:class:`GemmTable`), or ``None`` (then ``gemm_flops``).
        stream_bytes: element-wise (read + write) rate per rank, bytes/s (0: unknown,
            then ``gather_bytes``).
        groups: ``p -> op -> AlphaBeta`` for groups of ``p < world_size`` ranks.
        shared: a rank's GEMM time when every rank computes over its time when it
            computes alone (1: ranks have their own devices; about ``world_size / cores``
            where ranks share a host's cores).
        tp_layer: what a tensor-parallel Linear of torch's DTensor costs beyond its local
            GEMMs and its all-reduce, per layer, on its output's bytes (``None``: not
            measured).
    """

    backend: str
    device: str
    world_size: int
    host: str
    ops: dict[str, AlphaBeta]
    gemm_flops: float
    gather_bytes: float
    measured: str = ""
    samples: dict[str, list] = field(default_factory=dict, compare=False)
    gemm: GemmTable | None = None
    stream_bytes: float = 0.0
    groups: dict[int, dict[str, AlphaBeta]] = field(default_factory=dict)
    shared: float = 1.0
    tp_layer: AlphaBeta | None = None

    # ------------------------------------------------------------ collective costs
    def op(self, name: str, p: int | None = None) -> AlphaBeta:
        """The fit of collective ``name`` among ``p`` ranks (default: the whole world)."""
        if p is not None and p != self.world_size and name in self.groups.get(p, {}):
            return self.groups[p][name]
        return self.ops[name]

    def p2p(self, nbytes: float, p: int | None = None) -> float:
        """One ring step in which every rank sends ``nbytes``."""
        p = self.world_size if p is None else p
        return 0.0 if p < 2 else self.op("p2p", p)(nbytes)

    def all_to_all(self, nbytes: float, p: int | None = None) -> float:
        """``all_to_all_single`` in which the busiest rank sends ``nbytes`` in all."""
        p = self.world_size if p is None else p
        return 0.0 if p < 2 else self.op("all_to_all", p)(nbytes)

    def all_reduce(self, nbytes: float, p: int | None = None) -> float:
        """Ring all-reduce of ``nbytes``: ``2(p-1) alpha + 2(p-1)/p n beta``."""
        p = self.world_size if p is None else p
        if p < 2:
            return 0.0
        ab = self.op("all_reduce", p)
        return 2 * (p - 1) * ab.alpha + 2 * (p - 1) / p * nbytes * ab.beta

    def all_gather(self, nbytes: float, p: int | None = None) -> float:
        """All-gather of an ``nbytes`` result: ``(p-1) alpha + (p-1)/p n beta``."""
        p = self.world_size if p is None else p
        if p < 2:
            return 0.0
        ab = self.op("all_gather", p)
        return (p - 1) * ab.alpha + (p - 1) / p * nbytes * ab.beta

    def broadcast(self, nbytes: float, p: int | None = None) -> float:
        p = self.world_size if p is None else p
        return 0.0 if p < 2 else self.op("broadcast", p)(nbytes)

    # ------------------------------------------------------------ compute costs
    def gemm_time(self, flops: float) -> float:
        return float(flops) / self.gemm_flops

    def matmul_time(self, m: float, k: float, n: float) -> float:
        """Seconds of an ``[m, k] x [k, n]`` float32 product on one rank (by shape)."""
        if self.gemm is None:
            return 0.0 if min(m, k, n) <= 0 else self.gemm_time(2.0 * m * k * n)
        return self.gemm(m, k, n)

    def gather_time(self, nbytes: float) -> float:
        return float(nbytes) / self.gather_bytes

    def stream_time(self, nbytes: float) -> float:
        """Seconds of element-wise work that reads and writes ``nbytes`` in all."""
        return float(nbytes) / (self.stream_bytes or self.gather_bytes)

    # ------------------------------------------------------------ files
    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["groups"] = {str(p): v for p, v in d["groups"].items()}
        d["gemm"] = None if self.gemm is None else {"samples": [list(x) for x in
                                                                self.gemm.samples]}
        d["version"] = VERSION
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> LinkModel:
        if d.get("version") != VERSION:
            raise ValueError(f"calibration version {d.get('version')!r}, expected {VERSION}")
        ops = {k: AlphaBeta(float(v["alpha"]), float(v["beta"])) for k, v in d["ops"].items()}
        missing = [op for op in OPS if op not in ops]
        if missing:
            raise ValueError(f"calibration lacks {missing}")
        gemm = d.get("gemm")
        groups = {int(p): {k: AlphaBeta(float(v["alpha"]), float(v["beta"]))
                           for k, v in fits.items()}
                  for p, fits in d.get("groups", {}).items()}
        return cls(str(d["backend"]), str(d["device"]), int(d["world_size"]), str(d["host"]),
                   ops, float(d["gemm_flops"]), float(d["gather_bytes"]),
                   str(d.get("measured", "")), dict(d.get("samples", {})),
                   None if gemm is None else GemmTable(tuple(tuple(float(v) for v in smp)
                                                             for smp in gemm["samples"])),
                   float(d.get("stream_bytes", 0.0)), groups, float(d.get("shared", 1.0)),
                   None if d.get("tp_layer") is None else AlphaBeta(**d["tp_layer"]))

    def describe(self) -> str:
        parts = [f"{op} {ab.alpha * 1e6:.0f} us + {ab.bandwidth / 1e9:.2f} GB/s"
                 for op, ab in self.ops.items()]
        text = (f"link ({self.backend}, {self.device}, {self.world_size} ranks, {self.host}): "
                + "; ".join(parts) + f"; GEMM {self.gemm_flops / 1e9:.1f} GFLOP/s, gather "
                f"{self.gather_bytes / 1e9:.1f} GB/s per rank")
        if self.gemm is not None:
            rates = [2 * m * k * n / t for m, k, n, t in self.gemm.samples]
            text += (f"; GEMM by shape {min(rates) / 1e9:.0f}-{max(rates) / 1e9:.0f} GFLOP/s "
                     f"({len(rates)} shapes)")
        if self.stream_bytes:
            text += f"; element-wise {self.stream_bytes / 1e9:.1f} GB/s"
        if self.shared != 1.0:
            text += f"; all ranks computing at once: {self.shared:.2f}x a rank alone"
        if self.tp_layer is not None:
            text += (f"; DTensor Linear {self.tp_layer.alpha * 1e6:.0f} us + "
                     f"{self.tp_layer.bandwidth / 1e9:.2f} GB/s")
        return text


def calibration_path(backend: str, device: str, world_size: int) -> Path:
    """Where this host's calibration for ``backend``/``device``/``world_size`` is cached."""
    return calibration_file("link", backend, device, f"w{world_size}")


def load_link(path: Path) -> LinkModel | None:
    """The calibration at ``path``, or ``None`` when missing or unreadable (logged)."""
    if not path.is_file():
        return None
    try:
        return LinkModel.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring calibration %s (%s); measuring again", path, exc)
        return None


def save_link(model: LinkModel, path: Path) -> None:
    """Write ``model`` to ``path`` whole or not at all (a full disk: ``DiskFullError``)."""
    save_calibration(path, model.to_json(), "the link calibration")


# ---------------------------------------------------------------- measuring
def _sync_time(fn: Any, repeats: int, device: torch.device) -> float:
    """Median seconds of ``fn()`` over ``repeats`` (one warm-up), the slowest rank's.

    The median, not the minimum: a run sees the link as it is, shared machine included."""
    import torch.distributed as dist

    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _op(name: str, nbytes: int, p: int, rank: int, device: torch.device, group: Any) -> Any:
    """``(run, bytes)``: one call of collective ``name`` on ``group`` (``rank``: the group
    rank; peers are named by group rank, so that subgroups work too)."""
    import torch.distributed as dist

    n = max(nbytes // 4 // p * p, p)  # float32 elements, a multiple of p
    buf = torch.ones(n, dtype=torch.float32, device=device)
    out = torch.empty_like(buf)
    if name == "p2p":
        def run() -> None:
            reqs = [dist.isend(buf, group=group, group_dst=(rank + 1) % p),
                    dist.irecv(out, group=group, group_src=(rank - 1) % p)]
            for r in reqs:
                r.wait()
    elif name == "all_to_all":
        def run() -> None:
            dist.all_to_all_single(out, buf, group=group)
    elif name == "all_reduce":
        def run() -> None:
            dist.all_reduce(buf, group=group)
    elif name == "all_gather":
        part = buf[: n // p]

        def run() -> None:
            dist.all_gather_single(out, part, group=group)
    else:
        def run() -> None:
            dist.broadcast(buf, group=group, group_src=0)
    return run, n * 4


def _x(name: str, nbytes: int, p: int) -> float:
    """The ``x`` of ``alpha + beta x`` for one measurement (see the module docstring)."""
    if name == "all_reduce":
        return 2 * (p - 1) / p * nbytes
    if name == "all_gather":
        return (p - 1) / p * nbytes
    return float(nbytes)


def _steps(name: str, p: int) -> int:
    return {"all_reduce": 2 * (p - 1), "all_gather": p - 1}.get(name, 1)


def _fit_ops(group: Any, sizes: tuple[int, ...], repeats: int, dev: torch.device,
             samples: dict[str, list], prefix: str = "") -> dict[str, AlphaBeta]:
    """Time every op of :data:`OPS` on ``group`` at ``sizes`` and fit ``alpha + beta x``."""
    import torch.distributed as dist

    p, rank = dist.get_world_size(group), dist.get_rank(group)
    ops = {}
    for name in OPS:
        pts = []
        for size in sizes:
            run, nbytes = _op(name, size, p, rank, dev, group)
            pts.append([nbytes, _sync_time(run, repeats, dev)])
        samples[prefix + name] = pts
        ab = AlphaBeta.fit([_x(name, n, p) for n, _ in pts], [t for _, t in pts])
        # the fit's intercept covers every step of a ring collective: alpha per step
        ops[name] = AlphaBeta(ab.alpha / _steps(name, p), ab.beta)
    return ops


def _measure_compute(repeats: int, dev: torch.device,
                     samples: dict[str, list]) -> dict[str, Any]:
    """GEMM rate and rates by shape, random-gather and element-wise rates (a rank's own:
    see the module docstring)."""
    a = torch.randn(1024, 512, device=dev)
    b = torch.randn(512, 256, device=dev)
    t_mm = _sync_time(lambda: torch.mm(a, b), repeats, dev)
    table = []
    for m, k, n in gemm_shapes():
        x, w = torch.randn(m, k, device=dev), torch.randn(k, n, device=dev)
        out = torch.empty(m, n, device=dev)
        t = _sync_time(lambda x=x, w=w, out=out: torch.mm(x, w, out=out),
                       min(repeats, GEMM_REPEATS), dev)
        table.append((float(m), float(k), float(n), max(t, 1e-9)))
    rows = torch.randn(1 << 16, 64, device=dev)
    idx = torch.randint(0, rows.shape[0], (1 << 18,), device=dev)
    got = torch.empty(idx.numel(), 64, device=dev)
    # into a reused buffer: a fresh 64 MiB result would time the kernel's first touch of
    # its pages (about 2 GB/s here), not the gather (DESIGN.md, environment facts)
    t_gather = _sync_time(lambda: torch.index_select(rows, 0, idx, out=got), repeats, dev)
    big = torch.randn(1 << 22, device=dev)
    res = torch.empty_like(big)
    t_stream = _sync_time(lambda: torch.mul(big, 2.0, out=res), repeats, dev)
    return {"gemm_flops": 2 * 1024 * 512 * 256 / max(t_mm, 1e-9),
            "gather_bytes": idx.numel() * 64 * 4 / max(t_gather, 1e-9),
            "gemm": GemmTable(tuple(table)),
            "stream_bytes": 2 * big.numel() * 4 / max(t_stream, 1e-9)}


def _solo_ratio(repeats: int, dev: torch.device) -> float:
    """A run of GEMMs' time with every rank computing over its time on rank 0 alone.

    Each timing is a run of :data:`SHARED_RUN` GEMMs, not one: a single GEMM is shorter
    than the scheduler's time slice, so ranks that share a core mostly run it one after
    the other and see less of each other than a training step does (4 ranks on 2
    cores measured 1.58x with one GEMM a timing, where their steps ran about 2x)."""
    import torch.distributed as dist

    a, b = torch.randn(1024, 1024, device=dev), torch.randn(1024, 512, device=dev)
    out = torch.empty(1024, 512, device=dev)

    def run() -> None:
        for _ in range(SHARED_RUN):
            torch.mm(a, b, out=out)

    together = _sync_time(run, repeats, dev)
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        if dist.get_rank() == 0:
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    ratio = torch.tensor([together / statistics.median(times[1:]) if times else 1.0],
                         dtype=torch.float64, device=dev)
    dist.broadcast(ratio, 0)
    return max(1.0, float(ratio.item()))


#: GEMMs (1024 x 1024 x 512) in one timing of :func:`_solo_ratio`: about 0.1 s alone here
SHARED_RUN = 16


#: (rows, width) of the column -> row Linear pairs the DTensor cost is measured on
TP_SIZES = ((256, 256), (1024, 512), (2048, 1024))


def _tp_layer(ops: dict[str, AlphaBeta], repeats: int, device: str) -> AlphaBeta:
    """Fit DTensor's cost per tensor-parallel Linear beyond its local GEMMs and all-reduce:
    a ``ColwiseParallel`` -> ``RowwiseParallel`` pair on all ranks, forward and backward,
    against plain Linears of the local shapes plus the ring all-reduce of the output."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, parallelize_module,
    )

    p = dist.get_world_size()
    dev = torch.device(device if device != "cuda" else f"cuda:{torch.cuda.current_device()}")
    mesh = init_device_mesh(dev.type, (p,))
    ar = ops["all_reduce"]
    xs, ys = [], []
    for rows, w in TP_SIZES:
        x = torch.randn(rows, w, device=dev)

        def step(m: nn.Module, x: torch.Tensor = x) -> None:
            m.zero_grad(set_to_none=True)
            m(x).sum().backward()

        tp = nn.Sequential(nn.Linear(w, w), nn.Linear(w, w)).to(dev)
        parallelize_module(tp, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
        local = nn.Sequential(nn.Linear(w, w // p), nn.Linear(w // p, w)).to(dev)
        t_tp = _sync_time(lambda: step(tp), repeats, dev)
        t_local = _sync_time(lambda: step(local), repeats, dev)
        nbytes = rows * w * 4
        reduce = 2 * (p - 1) * ar.alpha + 2 * (p - 1) / p * nbytes * ar.beta
        xs.append(float(nbytes))
        ys.append(max(0.0, (t_tp - t_local - reduce) / 2))
    return AlphaBeta.fit(xs, ys)


def measure(group: Any = None, sizes: tuple[int, ...] = SIZES, repeats: int = 5,
            device: str = "cpu") -> LinkModel:
    """Measure the link and the compute rates (collective: every rank of ``group`` calls).

    Besides the whole group, every divisor ``p`` of its size (``2 <= p < size``) is
    measured in disjoint groups of ``p`` consecutive ranks running at once
    (``LinkModel.groups``; only for the default group, whose subgroups every rank
    can make)."""
    import torch.distributed as dist

    p = dist.get_world_size(group)
    dev = torch.device(device if device != "cuda" else f"cuda:{torch.cuda.current_device()}")
    samples: dict[str, list] = {}
    ops = (_fit_ops(group, sizes, repeats, dev, samples) if p > 1
           else {name: AlphaBeta(0.0, 0.0) for name in OPS})
    groups = {}
    if group is None:
        for q in range(2, p):
            if p % q == 0:
                sub, subgroups = dist.new_subgroups(group_size=q)
                groups[q] = _fit_ops(sub, sizes, repeats, dev, samples, prefix=f"p{q}:")
                for g in subgroups:
                    dist.destroy_process_group(g)
    compute = _measure_compute(repeats, dev, samples)
    if group is None and p > 1:
        compute["shared"] = _solo_ratio(repeats, dev)
        compute["tp_layer"] = _tp_layer(ops, min(repeats, GEMM_REPEATS), device)
    backend = dist.get_backend(group)
    return LinkModel(str(backend), dev.type, p, socket.gethostname(), ops,
                     measured=datetime.datetime.now().isoformat(timespec="seconds"),
                     samples=samples, groups=groups, **compute)


def link_model(group: Any = None, *, refresh: bool = False, device: str = "cpu") -> LinkModel:
    """This machine's link model for the ranks of ``group`` (collective; cached per host)."""
    import torch.distributed as dist

    backend = str(dist.get_backend(group))
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    path = calibration_path(backend, device, p)
    box: list[Any] = [None]
    if rank == 0 and not refresh:
        box[0] = load_link(path)
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group else 0,
                               group=group)
    if box[0] is not None:
        return box[0]
    log.info("measuring the %s link of %d ranks (once per machine)", backend, p)
    model = measure(group, device=device)
    if rank == 0:
        try:
            save_link(model, path)
        except OSError as exc:
            log.warning("could not cache the calibration at %s: %s", path, exc)
    return model


def _calibrate_rank(device: str, refresh: bool) -> dict[str, Any]:
    return link_model(refresh=refresh, device=device).to_json()


def calibrate(world_size: int, *, device: str = "cpu", refresh: bool = True) -> LinkModel:
    """Measure (or with ``refresh=False`` read) the link of ``world_size`` ranks on this
    machine by starting them (:func:`ngra.distributed.launch`); cached for later runs.
    One rank measures only the compute rates (its collectives cost nothing)."""
    from ngra.distributed.launch import launch

    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1; got {world_size!r}.")
    out = launch(_calibrate_rank, world_size, device, refresh, device=device, threads=1)
    return LinkModel.from_json(out[0])
