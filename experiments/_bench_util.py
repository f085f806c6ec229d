"""Helpers shared by the benchmarks in ``experiments/``.

* :func:`pin_environment` fixes thread counts and the allocator setting *before*
  any library reads them (re-executing the script once if needed), so that every
  framework in a run works under the same conditions.
* :func:`time_fn`: warm-up, then repeated wall-clock timing; report medians.
* :func:`run_capped`: a command in a fresh process, killed over a time or RSS cap, its
  ``RESULT {json}`` line parsed.
* :class:`PeakRSS` / :func:`peak_rss_in_child`: peak resident memory of one call,
  measured in a fresh child process (so earlier cases and allocator caches do not
  hide or inflate it).
* :func:`measure_bandwidth`: this machine's streaming copy/read bandwidth.
* :func:`markdown_table` / :func:`write_csv`: result tables.

Nothing here knows about graphs or GNNs; keep it that way so any benchmark can use it.
"""

from __future__ import annotations

import csv
import gc
import json
import math
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ngra.memstat import malloc_trim, peak_rss_bytes, reset_peak_rss, rss_bytes

__all__ = [
    "gpu_or_dry_run",
    "PeakRSS",
    "Timing",
    "fmt_bytes",
    "fmt_ratio",
    "fmt_seconds",
    "machine_info",
    "malloc_trim",
    "markdown_table",
    "measure_bandwidth",
    "peak_rss_in_child",
    "pin_environment",
    "rss_bytes",
    "run_capped",
    "run_in_child",
    "time_fn",
    "write_csv",
]


# --------------------------------------------------------------------------- environment
def pin_environment(threads: int, thp: bool, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Make the thread counts and torch's huge-page setting take effect for this run.

    Sets ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``NUMBA_NUM_THREADS`` and
    ``THP_MEM_ALLOC_ENABLE`` (torch's CPU allocator: 2 MiB-aligned, huge-page
    backed allocations, which make first touch of large tensors cheaper). They are
    read when the libraries load, so if the current process was started with other
    values it is re-executed once with the new environment (child processes
    inherit it). Call it first thing in ``main()``. Returns the pinned variables.
    """
    want = {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "NUMBA_NUM_THREADS": str(threads),
        "THP_MEM_ALLOC_ENABLE": "1" if thp else "0",
        **(extra or {}),
    }
    if any(os.environ.get(k) != v for k, v in want.items()):
        if os.environ.get("_BENCH_REEXEC") == "1":
            raise RuntimeError(f"environment still differs after re-exec: {want}")
        env = {**os.environ, **want, "_BENCH_REEXEC": "1"}
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    import torch  # after the environment is final

    torch.set_num_threads(threads)
    return want


# -------------------------------------------------------------------------------- timing
@dataclass
class Timing:
    """Wall-clock seconds of repeated runs (warm-up excluded)."""

    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def min(self) -> float:
        return min(self.times) if self.times else float("nan")

    @property
    def max(self) -> float:
        return max(self.times) if self.times else float("nan")

    def __str__(self) -> str:
        return f"median {fmt_seconds(self.median)} (min {fmt_seconds(self.min)}, n={len(self.times)})"


def time_fn(
    fn: Callable[[], Any],
    *,
    warmup: int = 1,
    repeat: int = 5,
    max_seconds: float | None = None,
    sync: Callable[[], None] | None = None,
) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeat`` timed ones.

    Garbage collection runs once before the timed runs and is disabled during
    them, so a collection triggered by an earlier case does not land in this one
    (a full collection can take a second with torch, DGL and PyG loaded; call
    ``gc.freeze()`` after the imports to make it cheap). With
    ``max_seconds``, stops early (after at least 3 timed runs) once the timed runs
    exceed that budget. ``sync`` (e.g. ``torch.cuda.synchronize``) runs before
    each clock read.
    """
    for _ in range(warmup):
        fn()
    timing = Timing()
    spent = 0.0
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(repeat):
            if sync:
                sync()
            t0 = time.perf_counter()
            fn()
            if sync:
                sync()
            dt = time.perf_counter() - t0
            timing.times.append(dt)
            spent += dt
            if max_seconds is not None and i >= 2 and spent > max_seconds:
                break
    finally:
        if was_enabled:
            gc.enable()
    return timing


# -------------------------------------------------------------------------------- memory
_malloc_trim = malloc_trim  # older name, kept for callers


class PeakRSS:
    """Peak resident memory *above the starting level* inside a ``with`` block.

    Linux: resets the kernel's high-water mark (``/proc/self/clear_refs``, value 5)
    and reads ``VmHWM`` at exit, which catches even sub-millisecond peaks.
    Elsewhere (or where clear_refs is not writable): samples RSS with psutil every
    millisecond, which can miss short peaks; ``method`` says which was used.
    Counts every allocation of the process (torch, numba, DGL's own allocator),
    unlike torch's allocation tracking.
    """

    def __init__(self) -> None:
        self.baseline = 0
        self.peak = 0
        self.method = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def delta(self) -> int:
        """Peak bytes above the level at block entry."""
        return max(0, self.peak - self.baseline)

    def __enter__(self) -> PeakRSS:  # noqa: PYI034
        if reset_peak_rss():
            self.baseline = rss_bytes()
            self.method = "VmHWM (clear_refs reset)"
        else:
            self.baseline = rss_bytes()
            self.method = "psutil RSS sampling (1 ms)"
            self.peak = self.baseline
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        import psutil

        proc = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, proc.memory_info().rss)
            time.sleep(0.001)

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, rss_bytes())
        else:
            self.peak = peak_rss_bytes()


def _child_main(conn, fn, args, kwargs) -> None:
    try:
        conn.send(("ok", fn(*args, **kwargs)))
    except BaseException as exc:  # noqa: BLE001  (report everything, even MemoryError)
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def run_in_child(fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` in a freshly *spawned* Python process; return its result.

    ``fn`` must be importable (a module-level function) and its result picklable.
    A fresh interpreter (not ``fork``) means no thread pools or allocator state
    inherited from this process. Raises RuntimeError with the child's traceback on
    failure, or on timeout / a crash (e.g. killed by the OOM killer).
    """
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(child, fn, args, kwargs), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(timeout):
            raise RuntimeError(f"child process timed out after {timeout} s")
        status, payload = parent.recv()
    except EOFError:
        proc.join(5)
        raise RuntimeError(f"child process died (exit code {proc.exitcode})") from None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
    if status != "ok":
        raise RuntimeError(f"child process failed: {payload}")
    return payload


def _vm_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_capped(cmd: Sequence[str], time_cap: float, mem_cap_mb: float,
               env: Mapping[str, str] | None = None, cwd: str | None = None
               ) -> tuple[dict[str, Any] | None, str, float]:
    """Run ``cmd`` in a fresh process, killed over ``time_cap`` seconds or ``mem_cap_mb``
    of RSS (sampled every 50 ms). Returns ``(result, status, peak RSS MB)``: ``result``
    is the JSON after the last ``RESULT `` line of its stdout (``None`` if killed or
    failed), ``status`` ``"ok"``, ``"skipped (...)"`` with the cap, or ``"failed (...)"``
    with the last line of its stderr."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=None if env is None else dict(env), cwd=cwd)
    t0, peak, killed = time.monotonic(), 0.0, ""
    while proc.poll() is None:
        peak = max(peak, _vm_rss_mb(proc.pid))
        if peak > mem_cap_mb:
            killed = f"skipped (RSS > {mem_cap_mb / 1024:.0f} GB cap)"
        elif time.monotonic() - t0 > time_cap:
            killed = f"skipped (over the {time_cap:.0f} s cap)"
        if killed:
            proc.kill()
            break
        time.sleep(0.05)
    out, err = proc.communicate()
    if killed:
        return None, killed, peak
    for line in reversed(out.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):]), "ok", peak
    tail = (err.strip().splitlines() or ["no output"])[-1][:160]
    return None, f"failed ({tail})", peak


def _peak_child(setup: Callable[..., Callable[[], Any]], args: tuple, warmup: int) -> dict[str, Any]:
    run = setup(*args)
    for _ in range(warmup):
        run()
    with PeakRSS() as mem:
        run()
    return {"peak_bytes": mem.delta, "baseline_bytes": mem.baseline, "method": mem.method}


def peak_rss_in_child(
    setup: Callable[..., Callable[[], Any]], *args: Any, warmup: int = 1, timeout: float | None = 600
) -> dict[str, Any]:
    """Peak memory of one call, measured in a fresh process.

    In the child, ``run = setup(*args)`` builds the inputs (not counted), ``run()``
    is called ``warmup`` times (JIT compilation, lazily built graph formats), then
    once more inside :class:`PeakRSS`. Returns ``{"peak_bytes": bytes above the
    post-setup level, "baseline_bytes", "method"}``.
    """
    return run_in_child(_peak_child, setup, args, warmup, timeout=timeout)


# ----------------------------------------------------------------------------- bandwidth
def measure_bandwidth(nbytes: int = 1 << 30, repeat: int = 7) -> dict[str, float]:
    """Streaming bandwidth of this machine with torch's current thread count.

    ``copy``: ``dst.copy_(src)`` on ``nbytes`` buffers, counted as read + write
    (``2 * nbytes`` per copy; write-allocate traffic not counted). ``read``:
    ``src.sum()``. Buffers are touched before timing. Returns GB/s (1e9 bytes),
    medians over ``repeat`` runs.
    """
    import torch

    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.zeros(n, dtype=torch.float32)
    t_copy = time_fn(lambda: dst.copy_(src), warmup=2, repeat=repeat)
    t_read = time_fn(lambda: src.sum(), warmup=2, repeat=repeat)
    return {
        "copy_gbps": 2 * n * 4 / t_copy.median / 1e9,
        "read_gbps": n * 4 / t_read.median / 1e9,
        "bytes": float(n * 4),
    }


# --------------------------------------------------------------------------------- info
def gpu_or_dry_run(dry_run: bool, graphs: Mapping[str, str], chosen: str, dry_graph: str,
                   out: Path | None, results: Path, name: str, epochs: int) -> tuple:
    """The GPU benchmarks' set-up: ``(device, {graph: spec}, epochs, report path)``. A dry
    run takes the CPU, the tiny ``dry_graph``, one epoch and a temporary report (never the
    committed results); else CUDA (or exit saying it is missing), the ``chosen`` graphs
    (comma-separated names of ``graphs``) and ``results / name``."""
    import tempfile

    import torch

    if dry_run:
        path = out or Path(tempfile.mkdtemp(prefix="ngra-gpu-")) / name
        return torch.device("cpu"), {"dry": dry_graph}, 1, path
    if not torch.cuda.is_available():
        raise SystemExit(f"{name}'s benchmark needs a CUDA device (or --dry-run on CPU).")
    return (torch.device("cuda"), {k: graphs[k] for k in chosen.split(",")}, epochs,
            out or results / name)


def machine_info() -> dict[str, str]:
    """CPU, core count, library versions and the pinned environment, for result headers."""
    info = {
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    for key in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "THP_MEM_ALLOC_ENABLE"):
        info[key] = os.environ.get(key, "(unset)")
    for mod in ("torch", "numba", "dgl", "torch_geometric"):
        m = sys.modules.get(mod)
        if m is not None:
            info[mod] = getattr(m, "__version__", "?")
    try:
        info["git"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, check=False,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip() or "(no commit)"
    except (OSError, subprocess.SubprocessError):
        info["git"] = "?"
    try:
        info["load_avg_1m"] = f"{os.getloadavg()[0]:.1f}"
    except OSError:
        pass
    return info


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


# -------------------------------------------------------------------------------- tables
def _missing(x: float | None) -> bool:
    return x is None or math.isnan(x)


def fmt_seconds(s: float | None) -> str:
    if _missing(s):
        return "—"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def fmt_bytes(b: float | None) -> str:
    if _missing(b):
        return "—"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= size:
            return f"{b / size:.2f} {unit}"
    return f"{b:.0f} B"


def fmt_ratio(r: float | None) -> str:
    return "—" if _missing(r) else f"{r:.2f}x"


def markdown_table(
    rows: Iterable[Mapping[str, Any]], columns: Sequence[tuple[str, str]]
) -> str:
    """A GitHub-markdown table; ``columns`` are ``(key, header)``; missing cells print "—"."""
    lines = [
        "| " + " | ".join(h for _, h in columns) + " |",
        "|" + "|".join("---" for _ in columns) + "|",
    ]
    for row in rows:
        cells = [row.get(k) for k, _ in columns]
        lines.append("| " + " | ".join("—" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


def write_csv(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> None:
    """Rows (dicts) to CSV; the header is the union of keys in first-seen order."""
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: str | os.PathLike[str], numbers: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Rows of a CSV that :func:`write_csv` wrote; the ``numbers`` columns as floats (an
    empty cell as ``None``)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in numbers:
            r[k] = float(r[k]) if r.get(k) not in (None, "") else None
    return rows


def merge_rows(old: Sequence[dict], new: Sequence[dict], key: Sequence[str]) -> list[dict]:
    """``old`` rows whose ``key`` columns ``new`` did not measure again, then ``new``: a
    rerun of some cases replaces their rows and keeps the others (``--merge``)."""
    fresh = {tuple(r[k] for k in key) for r in new}
    return [r for r in old if tuple(r[k] for k in key) not in fresh] + list(new)
