"""A rank's fixed cost, phase by phase: where a Cora rank's memory goes before its data.

What
    Issue 41's "fixed cost per process" target: a rank of a Cora run peaks at most 380 MB.
    This probe starts the two ranks of a Cora GCN run (``--nprocs 2``, one thread each,
    halo exchange) as fresh processes of its own, with the environment ``torchrun`` gives a
    rank, and each walks a rank's life by hand, reading ``VmRSS`` and ``VmHWM`` after
    every phase: the interpreter, ``import torch``, the rank's modules
    (``ngra.training.ranks``, plus what a variant adds), the gloo process group, the shard,
    the model and session, the optimizer, what the first step loads before its own work
    (``torch.autograd.grad`` with ``grad_outputs``, which ngra's backward recomputations
    call, imports ``torch.fx.experimental.symbolic_shapes`` and sympy; numba's first
    function initializes LLVM), the first training step and evaluation (ngra's kernels
    compiled or read from numba's cache, the step's own memory), and the steady state after
    ``--steps`` steps. The variants apply the cuts one at a time, so the table shows
    before and after in the same run:

    * ``before``: ``torch.optim.Adam`` (its first call imports ``torch._dynamo``), and the
      modules a rank of the ``ngra`` console script imported before the cuts: ``spawn``
      re-runs the launching script's imports, so such a rank imported ``ngra.cli`` and,
      through it, ``ngra.characterize`` (matplotlib) and ``ngra.planner``; and DTensor
      (sympy), which ``split_linears`` imported even when a plan split nothing;
    * ``ngra Adam``: :class:`ngra.training.optim.Adam` instead;
    * ``+ lazy cli``: ``ngra.cli`` as it is now (those commands imported when run);
    * ``+ no DTensor``: nothing more: a console-script rank now;
    * ``python -m ngra``: without ``ngra.cli`` (``spawn`` does not re-run a ``-m`` main);
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
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
#: Modules whose presence the table reports (what a rank may import without needing it).
WATCHED = ("torch._dynamo", "sympy", "numba", "scipy", "matplotlib", "torch_geometric", "dgl",
           "pandas", "networkx", "triton")
#: What ``ngra.cli`` imported at module level before its lazy imports (matplotlib through
#: ``ngra.characterize``), and what ``split_linears`` imported before it imported it only for
#: a plan that splits a Linear (sympy through DTensor): the "before" variants import them.
CLI_BEFORE = ("ngra.cli", "ngra.characterize.command", "ngra.planner.command")
DTENSOR = ("torch.distributed.tensor.parallel",)
#: name -> (optimizer, modules imported with the rank's, MALLOC_ARENA_MAX or None)
VARIANTS = {
    "before": ("torch", CLI_BEFORE + DTENSOR, None),
    "ngra Adam": ("ngra", CLI_BEFORE + DTENSOR, None),
    "+ lazy cli": ("ngra", ("ngra.cli",) + DTENSOR, None),
    "+ no DTensor": ("ngra", ("ngra.cli",), None),
    "python -m ngra": ("ngra", (), None),
    "+ 2 arenas": ("ngra", (), "2"),
}


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


def child(folder: str, optimizer: str, extra: list[str], steps: int) -> None:
    """One rank (RANK, WORLD_SIZE, MASTER_* set by the parent): a JSON line a phase."""
    phases = []

    def mark(name: str) -> None:
        phases.append({"phase": name, "rss": _status_mb("VmRSS"), "hwm": _status_mb("VmHWM"),
                       "modules": [m for m in WATCHED if m in sys.modules]})

    mark("interpreter")
    import torch

    mark("import torch")
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
    # what the first step loads before its own work, split out: torch.autograd.grad with
    # grad_outputs (ngra's backward recomputations) imports symbolic_shapes, hence sympy;
    # numba's first function initializes LLVM
    import torch.fx.experimental.symbolic_shapes  # noqa: F401
    from numba import njit

    mark("autograd.grad's sympy")
    njit(lambda v: v + 1)(1)
    mark("numba's LLVM")
    for i in range(steps):
        train_step(s, opt)
        if i == 0:
            mark("first step")
    mark(f"after {steps} steps")
    torch.distributed.destroy_process_group()
    print(json.dumps(phases), flush=True)


def run_ranks(folder: str, variant: str, steps: int, timeout_s: float) -> list[list[dict]]:
    """Both ranks of ``variant`` as fresh processes; each rank's phases."""
    from ngra.distributed.launch import free_port

    optimizer, extra, arenas = VARIANTS[variant]
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    if arenas:
        env["MALLOC_ARENA_MAX"] = arenas
    procs = [subprocess.Popen([sys.executable, __file__, "--child", folder, "--optimizer",
                               optimizer, "--steps", str(steps), "--extra", ",".join(extra)],
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
                   module: bool) -> list[float]:
    """Each rank's peak (MB) in ``ngra train --nprocs 2`` on Cora, started as the ``ngra``
    console script or (``module``) as ``python -m ngra``."""
    head = ([sys.executable, "-m", "ngra"] if module
            else [str(Path(sys.executable).with_name("ngra"))])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "summary.json")
        cmd = [*head, "train", "--model", "gcn", "--dataset", "cora", "--nprocs", "2",
               "--threads", "1", "--epochs", str(epochs), "--out", str(out),
               *(["--data-root", data_root] if data_root else [])]
        subprocess.run(cmd, check=True, timeout=timeout_s, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return [m["peak_rss"] / 2**20 for m in json.loads(out.read_text())["memory_per_rank"]]


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
    args = ap.parse_args()
    if args.child:
        child(args.child, args.optimizer, [m for m in args.extra.split(",") if m], args.steps)
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
             + "; ".join(f"{how} {' and '.join(f'{p:.0f}' for p in peaks)} MB"
                         for how, peaks in real.items()) + ". "
             f"The machine was shared (load {os.getloadavg()[0]:.1f}); memory does not depend "
             "on it.", "",
             markdown_table(rows, [("phase", "phase"), *((v, v) for v in variants)]), ""]
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
