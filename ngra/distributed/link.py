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

Besides the link, the model holds two compute rates measured the same way (all ranks
at once, as in a run): ``gemm_flops`` (float32 matrix products) and ``gather_bytes``
(random row gathers, the bound of a sparse aggregation).

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
import os
import socket
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["AlphaBeta", "LinkModel", "OPS", "calibrate", "calibration_path", "link_model",
           "load_link", "measure", "save_link"]

log = logging.getLogger(__name__)

OPS = ("p2p", "all_to_all", "all_reduce", "all_gather", "broadcast")
SIZES = (1 << 12, 1 << 16, 1 << 20, 1 << 23)  # bytes each rank sends
CALIBRATION_ENV = "NGRA_CALIBRATION"
VERSION = 1


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
class LinkModel:
    """Measured costs of one machine's link (see the module docstring).

    Attributes:
        backend, device, world_size, host: what was measured.
        ops: ``op -> AlphaBeta`` for each of :data:`OPS` (``alpha`` per step for the
            ring collectives).
        gemm_flops: float32 GEMM rate per rank, FLOP/s.
        gather_bytes: random row-gather rate per rank, bytes/s.
        measured: when (ISO time); samples: the raw ``op -> [[bytes, seconds], ...]``.
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

    # ------------------------------------------------------------ collective costs
    def p2p(self, nbytes: float) -> float:
        """One ring step in which every rank sends ``nbytes``."""
        return 0.0 if self.world_size < 2 else self.ops["p2p"](nbytes)

    def all_to_all(self, nbytes: float) -> float:
        """``all_to_all_single`` in which the busiest rank sends ``nbytes`` in all."""
        return 0.0 if self.world_size < 2 else self.ops["all_to_all"](nbytes)

    def all_reduce(self, nbytes: float, p: int | None = None) -> float:
        """Ring all-reduce of ``nbytes``: ``2(p-1) alpha + 2(p-1)/p n beta``."""
        p = self.world_size if p is None else p
        if p < 2:
            return 0.0
        ab = self.ops["all_reduce"]
        return 2 * (p - 1) * ab.alpha + 2 * (p - 1) / p * nbytes * ab.beta

    def all_gather(self, nbytes: float, p: int | None = None) -> float:
        """All-gather of an ``nbytes`` result: ``(p-1) alpha + (p-1)/p n beta``."""
        p = self.world_size if p is None else p
        if p < 2:
            return 0.0
        ab = self.ops["all_gather"]
        return (p - 1) * ab.alpha + (p - 1) / p * nbytes * ab.beta

    def broadcast(self, nbytes: float) -> float:
        return 0.0 if self.world_size < 2 else self.ops["broadcast"](nbytes)

    def gemm_time(self, flops: float) -> float:
        return float(flops) / self.gemm_flops

    def gather_time(self, nbytes: float) -> float:
        return float(nbytes) / self.gather_bytes

    # ------------------------------------------------------------ files
    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
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
        return cls(str(d["backend"]), str(d["device"]), int(d["world_size"]), str(d["host"]),
                   ops, float(d["gemm_flops"]), float(d["gather_bytes"]),
                   str(d.get("measured", "")), dict(d.get("samples", {})))

    def describe(self) -> str:
        parts = [f"{op} {ab.alpha * 1e6:.0f} us + {ab.bandwidth / 1e9:.2f} GB/s"
                 for op, ab in self.ops.items()]
        return (f"link ({self.backend}, {self.device}, {self.world_size} ranks, {self.host}): "
                + "; ".join(parts) + f"; GEMM {self.gemm_flops / 1e9:.1f} GFLOP/s, gather "
                f"{self.gather_bytes / 1e9:.1f} GB/s per rank")


def calibration_path(backend: str, device: str, world_size: int) -> Path:
    """Where this host's calibration for ``backend``/``device``/``world_size`` is cached."""
    root = Path(os.environ.get(CALIBRATION_ENV) or "~/.ngra/calibration").expanduser()
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())
    return root / f"link-{host}-{backend}-{device}-w{world_size}.json"


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
    """Write ``model`` to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(model.to_json(), indent=1) + "\n")
    os.replace(tmp, path)


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
    import torch.distributed as dist

    n = max(nbytes // 4 // p * p, p)  # float32 elements, a multiple of p
    buf = torch.ones(n, dtype=torch.float32, device=device)
    out = torch.empty_like(buf)
    if name == "p2p":
        def run() -> None:
            reqs = [dist.isend(buf, (rank + 1) % p, group=group),
                    dist.irecv(out, (rank - 1) % p, group=group)]
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
            dist.broadcast(buf, 0, group=group)
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


def measure(group: Any = None, sizes: tuple[int, ...] = SIZES, repeats: int = 5,
            device: str = "cpu") -> LinkModel:
    """Measure the link and the compute rates (collective: every rank of ``group`` calls)."""
    import torch.distributed as dist

    p, rank = dist.get_world_size(group), dist.get_rank(group)
    dev = torch.device(device if device != "cuda" else f"cuda:{torch.cuda.current_device()}")
    samples: dict[str, list] = {}
    ops = {}
    for name in OPS:
        pts = []
        for size in sizes:
            run, nbytes = _op(name, size, p, rank, dev, group)
            pts.append([nbytes, _sync_time(run, repeats, dev)])
        samples[name] = pts
        steps = _steps(name, p)
        ab = AlphaBeta.fit([_x(name, n, p) for n, _ in pts], [t for _, t in pts])
        # the fit's intercept covers every step of a ring collective: alpha per step
        ops[name] = AlphaBeta(ab.alpha / steps, ab.beta)
    a = torch.randn(1024, 512, device=dev)
    b = torch.randn(512, 256, device=dev)
    t_mm = _sync_time(lambda: torch.mm(a, b), repeats, dev)
    rows = torch.randn(1 << 16, 64, device=dev)
    idx = torch.randint(0, rows.shape[0], (1 << 18,), device=dev)
    got = torch.empty(idx.numel(), 64, device=dev)
    # into a reused buffer: a fresh 64 MiB result would time the kernel's first touch of
    # its pages (about 2 GB/s here), not the gather (DESIGN.md, environment facts)
    t_gather = _sync_time(lambda: torch.index_select(rows, 0, idx, out=got), repeats, dev)
    backend = dist.get_backend(group)
    return LinkModel(str(backend), dev.type, p, socket.gethostname(), ops,
                     gemm_flops=2 * 1024 * 512 * 256 / max(t_mm, 1e-9),
                     gather_bytes=idx.numel() * 64 * 4 / max(t_gather, 1e-9),
                     measured=datetime.datetime.now().isoformat(timespec="seconds"),
                     samples=samples)


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
    machine by starting them (:func:`ngra.distributed.launch`); cached for later runs."""
    from ngra.distributed.launch import launch

    if world_size < 2:
        raise ValueError(f"a link needs at least 2 ranks; got world_size={world_size}.")
    out = launch(_calibrate_rank, world_size, device, refresh, device=device, threads=1)
    return LinkModel.from_json(out[0])
