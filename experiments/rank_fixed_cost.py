"""A rank's fixed cost, phase by phase: where a Cora rank's memory goes before its data.

What
    Issue 41's "fixed cost per process" target: a rank of a Cora run peaks at most 380 MB.
    This probe starts the two ranks of a Cora GCN run (``--nprocs 2``, one thread each,
    halo exchange) as fresh processes of its own, with the environment ``torchrun`` gives a
    rank, and each walks a rank's life by hand, reading ``VmRSS`` and ``VmHWM`` after
    every phase: the interpreter, ``import torch``, the rank's modules
    (``ngra.training.ranks``, plus what a variant adds), the gloo process group, the shard,
    the model and session, the optimizer, numba's implementations (what its first compile
    or cache load loads: the NRT module, which LLVM compiles, and its registries; before the
    cuts with ``scipy.linalg``, now as a CPU rank loads them,
    ``ngra.kernels.cpu.load_implementations``), the first training step and evaluation
    (ngra's kernels read from numba's cache, the shard's pages, the step's own memory;
    before the cuts also sympy: ``torch.broadcast_shapes`` and ``torch.autograd.grad`` with
    ``grad_outputs``, which the overlapped exchange's gathers and backward recomputations
    called, import ``torch.fx.experimental.symbolic_shapes``), and the steady state after
    ``--steps`` steps, with the median step time. The variants apply the cuts one at a
    time, so the table shows before and after in the same run:

    * ``before``: ``torch.optim.Adam`` (its first call imports ``torch._dynamo``), and the
      modules a rank of the ``ngra`` console script imported before the cuts: ``spawn``
      re-runs the launching script's imports, so such a rank imported ``ngra.cli`` and,
      through it, ``ngra.characterize`` (matplotlib) and ``ngra.planner``; and DTensor
      (sympy), which ``split_linears`` imported even when a plan split nothing;
    * ``ngra Adam``: :class:`ngra.training.optim.Adam` instead;
    * ``+ lazy cli``: ``ngra.cli`` as it is now (those commands imported when run);
    * ``+ no DTensor``: nothing more: a console-script rank now;
    * ``python -m ngra``: without ``ngra.cli`` (``spawn`` does not re-run a ``-m`` main);
    * ``+ no sympy``: ngra's ``broadcast_shape`` and ``vjp`` (:mod:`ngra.kernels.lean`);
    * ``+ no scipy.linalg``: numba's implementations loaded without it: a rank now;
    * ``+ 2 arenas``: also ``MALLOC_ARENA_MAX=2`` (glibc's arenas).

    The header also gives each rank's peak in real ``ngra train --nprocs 2`` runs (console
    script and ``python -m ngra``: ``memory_per_rank``), as a check on the walk.

Run
    python experiments/rank_fixed_cost.py        # Cora, 20 steps
Writes experiments/results/rank_fixed_cost.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
#: Modules whose presence the table reports (what a rank may import without needing it).
WATCHED = ("torch._dynamo", "sympy", "numba", "scipy", "scipy.linalg", "matplotlib",
           "torch_geometric", "dgl", "pandas", "networkx", "triton")
#: What ``ngra.cli`` imported at module level before its lazy imports (matplotlib through
#: ``ngra.characterize``), and what ``split_linears`` imported before it imported it only for
#: a plan that splits a Linear (sympy through DTensor): the "before" variants import them.
CLI_BEFORE = ("ngra.cli", "ngra.characterize.command", "ngra.planner.command")
DTENSOR = ("torch.distributed.tensor.parallel",)
#: name -> (optimizer, modules imported with the rank's, torch's broadcast_shapes and
#: autograd.grad where ngra.kernels.lean's are now (sympy), numba's implementations loaded
#: without scipy.linalg, MALLOC_ARENA_MAX or None)
VARIANTS = {
    "before": ("torch", CLI_BEFORE + DTENSOR, True, False, None),
    "ngra Adam": ("ngra", CLI_BEFORE + DTENSOR, True, False, None),
    "+ lazy cli": ("ngra", ("ngra.cli",) + DTENSOR, True, False, None),
    "+ no DTensor": ("ngra", ("ngra.cli",), True, False, None),
    "python -m ngra": ("ngra", (), True, False, None),
    "+ no sympy": ("ngra", (), False, False, None),
    "+ no scipy.linalg": ("ngra", (), False, True, None),
    "+ 2 arenas": ("ngra", (), False, True, "2"),
}


def _os_threads() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("Threads:"))


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def train_step(s, opt) -> None:
    """One step of a rank's loop by hand (``RankSession`` ``s``: forward, loss, backward,
    gradient all-reduce, ``opt``) and its evaluation."""
    s.step_begin()
    s.model.train()
    opt.zero_grad()
    with s.context():
        loss, _ = s.loss(s.forward())
        loss.backward()
    s.after_backward()
    opt.step()
    s.step_done()
    s.evaluate()


def torch_paths() -> None:
    """Put torch's ``broadcast_shapes`` and ``autograd.grad`` back where a Cora rank's step
    calls ngra.kernels.lean's (the overlapped exchange's gathers and tile backward): the
    step as it was before that cut."""
    import torch

    import ngra.compiler.gather
    import ngra.runtime.stream

    ngra.compiler.gather.broadcast_shape = torch.broadcast_shapes
    ngra.runtime.stream.vjp = torch.autograd.grad


def child(folder: str, optimizer: str, extra: list[str], torch_fns: bool, lean: bool,
          steps: int) -> None:
    """One rank (RANK, WORLD_SIZE, MASTER_* set by the parent): a JSON line a phase."""
    phases = []

    def mark(name: str) -> None:
        phases.append({"phase": name, "rss": _status_mb("VmRSS"), "hwm": _status_mb("VmHWM"),
                       "modules": [m for m in WATCHED if m in sys.modules],
                       "threads": threading.active_count(), "os_threads": _os_threads()})

    mark("interpreter")
    import torch

    mark("import torch")
    import numba  # noqa: F401  (ngra.datasets imports it; here its own phase)

    mark("import numba")
    from ngra.training import TrainConfig
    from ngra.training.ranks import RankSession, open_shard

    import importlib

    for name in extra:
        importlib.import_module(name)

    mark("rank modules")
    from ngra.distributed.dense import split_linears
    from ngra.distributed.launch import init_process_group

    torch.set_num_threads(1)
    init_process_group("gloo", 120.0)
    mark("gloo group")
    cfg = TrainConfig(model="gcn", dataset="cora", seed=0, progress=False, nprocs=2,
                      exchange="halo", threads=1)
    shard, layout, groups = open_shard(cfg, Path(folder))
    mark("shard")
    hyper, m = cfg.resolved(), shard.meta
    model = cfg.source.build(m["num_features"], m["num_classes"], hyper=hyper,
                             num_layers=hyper["num_layers"], num_edge_types=m["num_edge_types"])
    s = RankSession(split_linears(model, layout, groups.tp), shard, None, groups.gradients,
                    layout)
    mark("model, session")
    if optimizer == "torch":
        opt = torch.optim.Adam(s.model.parameters(), lr=hyper["lr"])
    else:
        from ngra.training.optim import Adam

        opt = Adam(s.model.parameters(), lr=hyper["lr"])
    mark("optimizer")
    if torch_fns:
        torch_paths()
    # what the first step loads before its own work, split out: numba's implementations,
    # with scipy.linalg (numba's own first load) or without (a rank's now)
    if lean:
        from ngra.kernels.cpu import load_implementations

        load_implementations()
    else:
        from numba.core.registry import cpu_target

        cpu_target.target_context.refresh()
    mark("numba's implementations")
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        train_step(s, opt)
        times.append(time.perf_counter() - t0)
        if i == 0:
            mark("first step")
    mark(f"after {steps} steps")
    phases[-1]["step_s"] = statistics.median(times[1:] or times)
    torch.distributed.destroy_process_group()
    print(json.dumps(phases), flush=True)


def run_ranks(folder: str, variant: str, steps: int, timeout_s: float) -> list[list[dict]]:
    """Both ranks of ``variant`` as fresh processes; each rank's phases."""
    from ngra.distributed.launch import free_port

    optimizer, extra, torch_fns, lean, arenas = VARIANTS[variant]
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    if arenas:
        env["MALLOC_ARENA_MAX"] = arenas
    procs = [subprocess.Popen([sys.executable, __file__, "--child", folder, "--optimizer",
                               optimizer, "--steps", str(steps), "--extra", ",".join(extra),
                               *(["--torch-paths"] if torch_fns else []),
                               *(["--lean"] if lean else [])],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout_s)
        if p.returncode:
            raise RuntimeError(f"{variant}: a rank exited with {p.returncode}")
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def real_run_peaks(data_root: str | None, epochs: int, timeout_s: float,
                   module: bool) -> tuple[list[float], list[float]]:
    """Each rank's peak (MB) and median step (s) in ``ngra train --nprocs 2`` on Cora,
    started as the ``ngra`` console script or (``module``) as ``python -m ngra``."""
    head = ([sys.executable, "-m", "ngra"] if module
            else [str(Path(sys.executable).with_name("ngra"))])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "summary.json")
        cmd = [*head, "train", "--model", "gcn", "--dataset", "cora", "--nprocs", "2",
               "--threads", "1", "--epochs", str(epochs), "--out", str(out),
               *(["--data-root", data_root] if data_root else [])]
        subprocess.run(cmd, check=True, timeout=timeout_s, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        summary = json.loads(out.read_text())
        return ([m["peak_rss"] / 2**20 for m in summary["memory_per_rank"]],
                summary["epoch_time_s_per_rank"])


#: The variant that is a rank as it is now (``+ 2 arenas`` is not: ranks keep glibc's default)
NOW = "+ no scipy.linalg"
#: What each phase of a rank as it is now holds (the last variant's column), for the summary
PHASE_NOTE = {
    "interpreter": "the interpreter",
    "import torch": "`import torch` (libtorch's pages, its operator registrations, torch's "
                    "Python modules)",
    "import numba": "`import numba` (libllvmlite's pages: LLVM's static initializers; "
                    "numba's modules; scipy's top level, which numba imports for its version)",
    "rank modules": "ngra's modules",
    "gloo group": "the gloo process group",
    "shard": "the shard",
    "model, session": "the model and session",
    "optimizer": "the optimizer",
    "numba's implementations": "numba's implementations (the NRT module compiled by LLVM: "
                               "LLVM's code pages; numba's registries)",
    "first step": "the first step (ngra's kernels read from numba's cache, the shard's "
                  "features paged in, activations)",
}


def remaining(ranks: list[list[dict]], variant: str) -> list[str]:
    """The summary under the table: what a rank holds now, phase by phase (MB, the larger
    rank's RSS growth), against the 380 MB target."""
    a, b = ranks
    out = []
    for i, (pa, pb) in enumerate(zip(a, b)):
        grow = max(pa["rss"] - (a[i - 1]["rss"] if i else 0),
                   pb["rss"] - (b[i - 1]["rss"] if i else 0))
        if round(grow) >= 1:
            out.append(f"{PHASE_NOTE.get(pa['phase'], pa['phase'])} {grow:.0f}")
    peak = max(a[-1]["hwm"], b[-1]["hwm"])
    return [f"Now ({variant}): a rank peaks at {peak:.0f} MB against the 380 MB target "
            f"({'met' if peak <= 380 else 'missed'}). What it holds, phase by phase (MB): "
            + "; ".join(out) + f". It runs {a[-1]['os_threads']} threads "
            f"({a[-1]['threads']} of them Python's)."]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", default=str(RESULTS / "rank_fixed_cost.md"))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--optimizer", default="ngra", help=argparse.SUPPRESS)
    ap.add_argument("--extra", default="", help=argparse.SUPPRESS)
    ap.add_argument("--torch-paths", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--lean", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.optimizer, [m for m in args.extra.split(",") if m],
              args.torch_paths, args.lean, args.steps)
        return 0

    from _bench_util import machine_info, markdown_table

    from ngra.training import TrainConfig
    from ngra.training.ranks import prepare_shards

    cfg = TrainConfig(model="gcn", dataset="cora", data_root=args.data_root, seed=0,
                      progress=False, nprocs=2, exchange="halo", threads=1)
    folder = str(prepare_shards(cfg))
    variants = args.variants.split(",")
    got = {v: run_ranks(folder, v, args.steps, args.timeout) for v in variants}
    real = {how: real_run_peaks(args.data_root, args.steps, args.timeout, module)
            for how, module in (("`ngra train`", False), ("`python -m ngra train`", True))}
    rows = []
    for i, ph in enumerate(got[variants[0]][0]):
        row = {"phase": ph["phase"]}
        for v in variants:
            a, b = got[v][0][i], got[v][1][i]  # the larger rank's figures
            new = [m for m in a["modules"] if i == 0 or m not in got[v][0][i - 1]["modules"]]
            row[v] = (f"{max(a['rss'], b['rss']):.0f} / {max(a['hwm'], b['hwm']):.0f}"
                      + (f" (+{', '.join(new)})" if new else ""))
        rows.append(row)
        print(row, flush=True)
    rows.append({"phase": "median step (ms)", **{
        v: f"{1e3 * max(r[-1]['step_s'] for r in got[v]):.1f}" for v in variants}})
    now = NOW if NOW in variants else variants[-1]
    info = machine_info()
    lines = ["# A rank's fixed cost, phase by phase (issue 41)", "",
             "Regenerate: `" + " ".join(["python experiments/rank_fixed_cost.py", *sys.argv[1:]])
             + f"` (git {info.get('git', '?')}, {info.get('date', '?')}, torch "
             f"{info.get('torch', '?')}): the two ranks of a Cora GCN run (2 ranks x 1 thread, "
             "halo exchange), each a fresh process, VmRSS / VmHWM in MB after each phase (the "
             "larger rank's), and the watched modules each phase loaded (+). Variants as "
             "the script's docstring says. Real runs, "
             f"`--nprocs 2 --threads 1 --epochs {args.steps}` on Cora, each rank's peak "
             "(`memory_per_rank`): "
             + "; ".join(f"{how} {' and '.join(f'{p:.0f}' for p in peaks)} MB (median step "
                         f"{' and '.join(f'{1e3 * t:.1f}' for t in times)} ms)"
                         for how, (peaks, times) in real.items()) + ". "
             f"The machine was shared (load {os.getloadavg()[0]:.1f}); memory does not depend "
             "on it.", "",
             markdown_table(rows, [("phase", "phase"), *((v, v) for v in variants)]), "",
             *remaining(got[now], now), ""]
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
