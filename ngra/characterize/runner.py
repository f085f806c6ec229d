"""The grid of characterization runs, in worker processes with time and memory caps.

Runs are grouped by (dataset, framework): one spawned worker process loads
the dataset and imports the framework once, then executes that group's runs
(models x modes) one after another, measuring each with a fresh peak-memory
baseline (:mod:`ngra.characterize.measure`). The parent watches every run:

* a run that exceeds ``timeout_s`` is killed with its worker and recorded as
  ``skipped`` ("timeout"); a fresh worker continues with the group's next run;
* each worker caps its data segment (``RLIMIT_DATA``) at its size after
  loading plus ``memory_cap_gb``: a run that would exceed it fails its
  allocation and is recorded as ``skipped`` ("out of memory") instead of
  pushing the machine into swap or the OOM killer;
* a worker that dies is recorded (exit code / signal) and replaced.

Inside the time cap each run fits its repeats to half the cap after its first
iteration (``budget_s``; see :func:`~ngra.characterize.measure.run_workload`).

With ``rounds`` > 1 a dataset's groups run that many times, the frameworks taking
turns (round 1: every framework's group, then round 2, ...), and each run reports the
round with the median time (:func:`median_round`). On a shared machine whose speed
drifts over minutes, this samples every framework across the same stretch of time
instead of one after another: cells within 10% changed winner between two grids
measured group after group.
``isolate=False`` runs everything in this process (no caps; for debugging).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ngra.characterize.measure import FRAMEWORKS, RunResult
from ngra.compat import import_pyg
from ngra.compat import import_dgl
from ngra.graph import Graph
from ngra.datasets import load

__all__ = ["CharacterizeConfig", "run_grid", "median_round", "MODES"]

log = logging.getLogger(__name__)

MODES = ("inference", "training")


@dataclass
class CharacterizeConfig:
    """One ``ngra characterize`` invocation; every CLI flag maps to one field.

    Attributes:
        models, datasets, frameworks, modes: the grid.
        out: output folder. repeats, warmup: iterations per run.
        hidden: hidden width (GAT: total over its 8 heads).
        data_root: dataset root (default: ``$NGRA_DATA``).
        threads: torch threads in workers (default: torch's default).
        timeout_s: hard time cap per run (seconds).
        memory_cap_gb: extra memory a run may allocate (``None``: no cap).
        isolate: run in worker processes (caps need it).
        progress: tqdm bar over the grid.
        remeasure_ceilings: measure bandwidth/FLOP ceilings (else reuse DIR's).
        plain: also time uninstrumented iterations (``repeats`` of them).
        append: keep DIR/runs.csv rows of runs this invocation does not repeat.
        rounds: times each dataset's groups run, frameworks taking turns (module docs).
    """

    models: list[str] = field(default_factory=lambda: ["gcn", "gat", "sage", "gin", "ggnn", "rgcn"])
    datasets: list[str] = field(default_factory=lambda: ["cora"])
    frameworks: list[str] = field(default_factory=lambda: ["ngra", "pyg", "dgl"])
    modes: list[str] = field(default_factory=lambda: ["inference"])
    out: str = "characterization"
    repeats: int = 5
    warmup: int = 2
    hidden: int = 64
    data_root: str | None = None
    threads: int | None = None
    timeout_s: float = 600.0
    memory_cap_gb: float | None = 8.0
    isolate: bool = True
    progress: bool = True
    remeasure_ceilings: bool = True
    plain: bool = True
    append: bool = False
    rounds: int = 1

    def check(self) -> None:
        from ngra.characterize.workloads import MODEL_NAMES

        for name, got, known in (("model", self.models, MODEL_NAMES),
                                 ("framework", self.frameworks, FRAMEWORKS),
                                 ("mode", self.modes, MODES)):
            bad = [g for g in got if g not in known]
            if bad or not got:
                raise ValueError(f"unknown {name}(s) {bad or got}; choose from {', '.join(known)}.")
        if not self.datasets:
            raise ValueError("give at least one dataset spec, e.g. --datasets cora.")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"repeats must be >= 1 and warmup >= 0; "
                             f"got {self.repeats}, {self.warmup}.")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout must be positive; got {self.timeout_s}.")
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1; got {self.rounds}.")


# ------------------------------------------------------------------ worker side
def _framework_check(framework: str) -> str | None:
    """Why ``framework`` cannot run here (``None``: it can)."""
    try:
        if framework == "pyg":
            import_pyg()
        elif framework == "dgl":
            import_dgl()
    except Exception as exc:  # ImportError, or DGL's own failures on a newer torch
        return (f"framework {framework} unavailable (not installed or not importable): "
                f"{type(exc).__name__}: {exc}")
    return None


def set_threads(threads: int | None) -> None:
    """Use ``threads`` threads in torch and in numba's parallel kernels (before they load)."""
    if not threads:
        return
    import torch

    torch.set_num_threads(threads)
    numba = sys.modules.get("numba")
    if numba is None:
        os.environ["NUMBA_NUM_THREADS"] = str(threads)
    else:
        # Already loaded: numba re-reads NUMBA_NUM_THREADS whenever it compiles and
        # refuses a value that differs from its launched pool, so leave the variable
        # alone and cap the pool instead.
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


def warm_up(framework: str, ds: Any, runs: list[tuple[str, str]], cfg: CharacterizeConfig) -> None:
    """Run each model/mode once on a 64-vertex graph so that imports, JIT compilation
    (numba kernels, compiled plans) and first-use allocations do not land in the
    first measured run's time or peak memory."""
    import torch

    from ngra.characterize.measure import run_workload
    from ngra.characterize.workloads import prepare_workload

    gen = torch.Generator().manual_seed(0)
    n = 64
    ei = torch.randint(0, n, (2, 4 * n), generator=gen)
    tiny = _Tiny(graph=Graph.from_edge_index(torch.cat([ei, ei.flip(0)], 1), num_nodes=n),
                 x=torch.randn(n, ds.x.shape[1], generator=gen),
                 y=torch.randint(0, ds.num_classes, (n,), generator=gen),
                 num_classes=ds.num_classes)
    for model, mode in runs:
        try:
            run_workload(framework, prepare_workload(tiny, model, cfg.hidden), mode, repeats=1,
                         warmup=0)
        except Exception:  # the real run will report it
            log.info("warm-up of %s/%s/%s failed", framework, model, mode, exc_info=True)


class _Tiny:
    """The fields of a NodeDataset that :func:`prepare_workload` reads."""

    name = "warmup"
    edge_type = None
    num_edge_types = 1

    def __init__(self, graph: Any, x: Any, y: Any, num_classes: int) -> None:
        import torch

        self.graph, self.x, self.y, self.num_classes = graph, x, y, num_classes
        self.train_mask = torch.ones(graph.num_nodes, dtype=torch.bool)


def _data_kb() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmData:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _load(spec: str, data_root: str | None) -> Any:
    return load(spec, root=data_root, progress=False)


def execute_run(framework: str, ds: Any, spec: str, model: str, mode: str,
                cfg: CharacterizeConfig) -> RunResult:
    """One run in this process; failures become a ``failed``/``skipped`` result."""
    from ngra.characterize.measure import run_workload
    from ngra.characterize.workloads import prepare_workload

    try:
        w = prepare_workload(ds, model, cfg.hidden, dataset=spec)
        return run_workload(framework, w, mode, repeats=cfg.repeats, warmup=cfg.warmup,
                            budget_s=cfg.timeout_s * 0.5, plain=cfg.plain)
    except (MemoryError, RuntimeError) as exc:
        if isinstance(exc, MemoryError) or "allocate memory" in str(exc):
            cap = f"the {cfg.memory_cap_gb:g} GB cap" if cfg.memory_cap_gb else "available memory"
            return RunResult(framework, model, spec, mode, status="skipped",
                             reason=f"out of memory (needs more than {cap})")
        return _failed(framework, model, spec, mode, exc)
    except Exception as exc:  # record and go on with the grid
        return _failed(framework, model, spec, mode, exc)


def _failed(framework: str, model: str, spec: str, mode: str, exc: BaseException) -> RunResult:
    tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
    log.warning("run %s/%s/%s/%s failed:\n%s", framework, model, spec, mode, traceback.format_exc())
    return RunResult(framework, model, spec, mode, status="failed", reason=tb[:300])


def _worker(conn: Any, framework: str, spec: str, runs: list[tuple[str, str]],
            cfg: CharacterizeConfig, log_path: str) -> None:
    """Worker process: load once, run ``runs`` in order, report over ``conn``."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    set_threads(cfg.threads)
    why = _framework_check(framework)
    if why is None:
        try:
            ds = _load(spec, cfg.data_root)
        except Exception as exc:
            why = f"dataset {spec!r} unavailable: {type(exc).__name__}: {exc}"
    if why is None:
        warm_up(framework, ds, runs, cfg)
    if why is not None:
        for model, mode in runs:
            conn.send(("done", RunResult(framework, model, spec, mode, status="skipped",
                                         reason=why)))
        conn.close()
        return
    if cfg.memory_cap_gb:
        limit = _data_kb() * 1024 + int(cfg.memory_cap_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    for model, mode in runs:
        conn.send(("start", (model, mode)))
        conn.send(("done", execute_run(framework, ds, spec, model, mode, cfg)))
    conn.close()


# ------------------------------------------------------------------ parent side
def _group_isolated(framework: str, spec: str, runs: list[tuple[str, str]],
                    cfg: CharacterizeConfig, log_dir: Path, bar: Any) -> list[RunResult]:
    ctx = mp.get_context("spawn")
    results: list[RunResult] = []
    todo = list(runs)
    safe = "".join(c if c.isalnum() else "_" for c in f"{framework}-{spec}")[:80]
    log_path = str(log_dir / f"worker-{safe}.log")
    while todo:
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker, args=(child, framework, spec, todo, cfg, log_path),
                           daemon=True)
        proc.start()
        child.close()
        current: tuple[str, str] | None = None
        started = time.monotonic()
        # loading the dataset and importing the framework get the same cap as a run
        while todo:
            left = cfg.timeout_s - (time.monotonic() - started)
            if not parent.poll(max(left, 0.0)):
                model, mode = current or todo[0]
                what = "run" if current else "dataset load / import"
                results.append(RunResult(framework, model, spec, mode, status="skipped",
                                         reason=f"timeout: {what} exceeded {cfg.timeout_s:g}s"))
                todo.remove((model, mode))
                bar.update(1)
                proc.kill()
                break
            try:
                kind, payload = parent.recv()
            except EOFError:
                proc.join(5)
                model, mode = current or todo[0]
                code = proc.exitcode
                died = code is not None and code < 0
                sig = f"killed by signal {-code}" if died else f"exit {code}"
                hint = " (likely out of memory)" if code == -9 else ""
                results.append(RunResult(framework, model, spec, mode, status="failed",
                                         reason=f"worker died: {sig}{hint}"))
                todo.remove((model, mode))
                bar.update(1)
                break
            if kind == "start":
                current, started = payload, time.monotonic()
            else:
                results.append(payload)
                todo.remove((payload.model, payload.mode))
                bar.update(1)
                bar.set_postfix_str(f"{framework}/{payload.model}/{spec[:20]}/{payload.mode}")
                current, started = None, time.monotonic()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        parent.close()
    return results


def _group_inprocess(framework: str, spec: str, runs: list[tuple[str, str]],
                     cfg: CharacterizeConfig, bar: Any) -> list[RunResult]:
    set_threads(cfg.threads)
    why = _framework_check(framework)
    ds = None
    if why is None:
        try:
            ds = _load(spec, cfg.data_root)
        except Exception as exc:
            why = f"dataset {spec!r} unavailable: {type(exc).__name__}: {exc}"
    if why is None:
        warm_up(framework, ds, runs, cfg)
    results = []
    for model, mode in runs:
        if why is not None:
            res = RunResult(framework, model, spec, mode, status="skipped", reason=why)
        else:
            res = execute_run(framework, ds, spec, model, mode, cfg)
        results.append(res)
        bar.update(1)
    return results


def median_round(rounds: list[RunResult]) -> RunResult:
    """One run's result over its rounds: the ``ok`` round with the median time (the lower
    median of an even count; ``plain_s`` where measured, else ``total_s``), with every
    round's instrumented totals; the first round when none is ``ok``."""
    ok = [r for r in rounds if r.status == "ok"]
    if len(rounds) == 1 or not ok:
        return rounds[0]

    def time_of(r: RunResult) -> float:
        return r.plain_s if r.plain_s == r.plain_s else r.total_s  # NaN: not measured

    ok.sort(key=time_of)
    pick = ok[(len(ok) - 1) // 2]
    times = ", ".join(f"{time_of(r) * 1e3:.1f}" for r in ok)
    return dataclasses.replace(
        pick, totals=[t for r in ok for t in r.totals],
        notes=[*pick.notes, f"median of {len(ok)} of {len(rounds)} rounds "
                            f"(frameworks taking turns): {times} ms"])


def run_grid(cfg: CharacterizeConfig,
             on_group: Callable[[list[RunResult]], None] | None = None) -> list[RunResult]:
    """Every framework x model x dataset x mode of ``cfg``; skips and failures included.

    ``on_group(results_so_far)`` is called after each dataset's groups (all their
    rounds), e.g. to save partial results.
    """
    cfg.check()
    out = Path(cfg.out)
    log_dir = out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    runs = [(m, mode) for m in cfg.models for mode in cfg.modes]
    total = len(runs) * len(cfg.frameworks) * len(cfg.datasets) * cfg.rounds
    results: list[RunResult] = []
    with tqdm(total=total, desc="characterize", unit="run", disable=not cfg.progress) as bar:
        for spec in cfg.datasets:
            by_run: dict[tuple[str, str, str], list[RunResult]] = {}
            for _ in range(cfg.rounds):
                for framework in cfg.frameworks:
                    group = (_group_isolated(framework, spec, runs, cfg, log_dir, bar)
                             if cfg.isolate else _group_inprocess(framework, spec, runs, cfg, bar))
                    for r in group:
                        by_run.setdefault((r.framework, r.model, r.mode), []).append(r)
            results += [median_round(rs) for rs in by_run.values()]
            if on_group is not None:
                on_group(results)
    return results
