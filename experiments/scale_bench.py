"""How large a graph each framework trains on this machine: peak RSS and epoch time vs scale.

Every (framework, model, scale, setting) runs in its own child process, watched from
here: its RSS is polled every 50 ms and the child is killed past ``--kill-gb`` (so an
out-of-memory case is a row, "killed at X GB", not a crash of the benchmark); a child
that finishes reports its own peak (``VmHWM``). The dataset is generated into ngra's
cache first, in a separate process, so generation is not charged to training.

* ngra: ``ngra train`` (zoo GCN / GAT, 2 threads, ``--epochs``), in memory, with
  ``--memory-budget``, and ``--storage disk``; the JSON summary gives the peak, the
  median epoch time (training step), the resident data after loading (``resident``)
  and the bytes read from storage during training.
* PyG 2.8 ``GCNConv`` / ``GATConv`` and DGL 2.1 ``GraphConv`` / ``GATConv``: the same
  two-layer models and hyper-parameters (hidden 16 / 8x8 heads, dropout, Adam) on the
  same graph, read from ngra's cache; self-loops added the way each library does.

Usage::

    flock /tmp/ngra-bench.lock python experiments/scale_bench.py \\
        --scales 20,21,22,23 --models gcn,gat --frameworks ngra,pyg,dgl \\
        --out experiments/results/scale
    python experiments/scale_bench.py --scales 23 --models gcn --frameworks ngra \\
        --settings budget --budget 2GB --append --out experiments/results/scale

Writes ``<out>.md`` (with the command) and ``<out>.csv``; ``--append`` adds rows to an
existing CSV (a case run again replaces its row) and rewrites the markdown from all of
them, followed by the hand-written ``<out>_notes.md`` (the runs behind the rows, the
targets) when it exists.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GIB = 2**30


def _status(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def watched(cmd: list[str], kill_bytes: int, timeout: float, env: dict) -> dict:
    """Run ``cmd``; kill it past ``kill_bytes`` of RSS or ``timeout`` seconds."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    state = {"max_rss": 0, "killed": None}

    def watch() -> None:
        start = time.time()
        while proc.poll() is None:
            rss = _status(proc.pid, "VmRSS")
            state["max_rss"] = max(state["max_rss"], rss)
            if rss > kill_bytes:
                state["killed"] = f"killed at {rss / GIB:.1f} GB (limit {kill_bytes / GIB:.0f})"
                proc.kill()
            elif time.time() - start > timeout:
                state["killed"] = f"killed after {timeout:.0f} s (time limit)"
                proc.kill()
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    out, err = proc.communicate()
    t.join()
    result = {"max_rss": state["max_rss"], "killed": state["killed"], "rc": proc.returncode}
    lines = [ln for ln in out.strip().splitlines() if ln.startswith("{")]
    if lines and proc.returncode == 0:
        result.update(json.loads(lines[-1]))
    elif not state["killed"] and proc.returncode != 0:
        result["error"] = err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"
    return result


# ------------------------------------------------------------------ children
def _spec(scale: int) -> str:
    return f"rmat:scale={scale}"


def child_generate(spec: str) -> None:
    from ngra.datasets import load

    t0 = time.perf_counter()
    ds = load(spec, storage="disk")
    print(json.dumps({"num_nodes": ds.num_nodes, "num_edges": ds.num_edges,
                      "generate_s": time.perf_counter() - t0}))


def child_baseline(framework: str, model: str, spec: str, epochs: int) -> None:
    """PyG or DGL training on the cached graph; prints peak, epoch times as JSON."""
    import torch
    import torch.nn.functional as F

    from ngra.datasets import load
    from ngra.memstat import peak_rss_bytes, rss_bytes

    torch.set_num_threads(2)
    torch.manual_seed(0)
    ds = load(spec)
    n, c = ds.num_nodes, ds.num_classes
    ei = ds.graph.edge_index()
    x, y, mask = ds.x, ds.y, ds.train_mask
    del ds
    resident = rss_bytes()
    if framework == "pyg":
        from torch_geometric.nn import GATConv, GCNConv
        from torch_geometric.utils import add_self_loops, remove_self_loops

        if model == "gcn":
            convs = torch.nn.ModuleList([GCNConv(x.shape[1], 16, cached=True),
                                         GCNConv(16, c, cached=True)])
            p = 0.5
        else:
            ei = add_self_loops(remove_self_loops(ei)[0], num_nodes=n)[0]
            convs = torch.nn.ModuleList([GATConv(x.shape[1], 8, heads=8, add_self_loops=False),
                                         GATConv(64, c, heads=1, add_self_loops=False)])
            p = 0.6

        def forward(training: bool) -> torch.Tensor:
            h = F.dropout(x, p, training)
            h = convs[0](h, ei)
            h = F.relu(h) if model == "gcn" else F.elu(h)
            return convs[1](F.dropout(h, p, training), ei)
    else:
        from ngra.compat import import_dgl

        dgl = import_dgl()
        from dgl.nn import GATConv, GraphConv

        g = dgl.graph((ei[0], ei[1]), num_nodes=n)
        del ei
        g = dgl.add_self_loop(dgl.remove_self_loop(g))
        if model == "gcn":
            convs = torch.nn.ModuleList([GraphConv(x.shape[1], 16), GraphConv(16, c)])
            p = 0.5
        else:
            convs = torch.nn.ModuleList([GATConv(x.shape[1], 8, num_heads=8),
                                         GATConv(64, c, num_heads=1)])
            p = 0.6

        def forward(training: bool) -> torch.Tensor:
            h = convs[0](g, F.dropout(x, p, training))
            h = F.relu(h) if model == "gcn" else F.elu(h.flatten(1))
            return convs[1](g, F.dropout(h, p, training)).reshape(n, -1)
    opt = torch.optim.Adam(convs.parameters(), lr=0.01, weight_decay=5e-4)
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(forward(True)[mask], y[mask])
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"peak_rss_mb": peak_rss_bytes() / 2**20, "epoch_time_s":
                      statistics.median(times), "resident_mb": resident / 2**20}))


# ------------------------------------------------------------------ driver
def run_case(framework: str, model: str, scale: int, setting: str, args, env) -> dict:
    spec = _spec(scale)
    row = {"framework": framework, "model": model, "scale": scale, "setting": setting}
    if framework == "ngra":
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "summary.json"
            cmd = [sys.executable, "-m", "ngra.cli", "train", "--model", model, "--dataset", spec,
                   "--epochs", str(args.epochs), "--threads", "2", "--no-progress",
                   "--out", str(out)]
            if setting == "budget":
                cmd += ["--memory-budget", args.budget]
            if setting == "disk":
                cmd += ["--storage", "disk"]
                if args.disk_budget:
                    cmd += ["--memory-budget", args.disk_budget]
            res = watched(cmd, int(args.kill_gb * GIB), args.timeout, env)
            if out.is_file():
                res.update(json.loads(out.read_text()))
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", framework, model, spec,
               str(args.epochs)]
        res = watched(cmd, int(args.kill_gb * GIB), args.timeout, env)
    row.update(
        num_edges=res.get("num_edges", ""),
        peak_gb=round(res["peak_rss_mb"] / 1024, 2) if "peak_rss_mb" in res else "",
        resident_gb=round(res["resident_mb"] / 1024, 2) if "resident_mb" in res else "",
        epoch_s=round(res["epoch_time_s"], 2) if "epoch_time_s" in res else "",
        disk_read_gb=round(res["disk_read_mb"] / 1024, 2) if "disk_read_mb" in res else "",
        status=res.get("killed") or res.get("error") or "ok",
        max_rss_seen_gb=round(res["max_rss"] / GIB, 2),
    )
    return row


FIELDS = ["framework", "model", "scale", "setting", "num_edges", "peak_gb", "resident_gb",
          "epoch_s", "disk_read_gb", "status", "max_rss_seen_gb"]


def write(rows: list[dict], out: Path, command: str) -> None:
    with open(out.with_suffix(".csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    lines = [
        "# Training at scale: peak RSS and epoch time vs R-MAT scale",
        "",
        f"Regenerate: `{command}` (rows accumulate with `--append`; each run's command is "
        "listed below). Machine: 2 cores, 24 GiB, shared with other engineers while these "
        "ran, so times are noisy; every framework ran as its own child process with 2 "
        "threads, its RSS watched and killed past the limit (a kill is a row).",
        "",
        "`peak` is the child's VmHWM; `resident` the RSS after loading and preparing the data "
        "(ngra) or building the graph (PyG/DGL); `epoch` the median training step. Graphs: "
        "R-MAT, edge factor 16, 64 features, 8 classes, duplicates and loops removed.",
        "",
        "| framework | model | scale | setting | edges | peak GB | resident GB | epoch s |"
        " disk read GB | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(f"| {r['framework']} | {r['model']} | 2^{r['scale']} | {r['setting']} | "
                     f"{r['num_edges']} | {r['peak_gb']} | {r['resident_gb']} | {r['epoch_s']} | "
                     f"{r['disk_read_gb']} | {r['status']} |")
    largest = {}
    for r in rows:
        if r["status"] == "ok":
            key = (r["framework"], r["model"], r["setting"])
            largest[key] = max(largest.get(key, 0), int(r["scale"]))
    lines += ["", "Largest scale trained (of those run):", ""]
    lines += [f"- {f} {m} ({s}): 2^{v}" for (f, m, s), v in sorted(largest.items())]
    notes = out.with_name(out.name + "_notes.md")  # hand-written: the runs, the targets
    if notes.is_file():
        lines += ["", notes.read_text().rstrip()]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def _case(row: dict) -> tuple:
    return row["framework"], row["model"], str(row["scale"]), row["setting"]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind = sys.argv[2]
        if kind == "generate":
            child_generate(sys.argv[3])
        else:
            child_baseline(kind, sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scales", default="20,21,22,23")
    ap.add_argument("--models", default="gcn,gat")
    ap.add_argument("--frameworks", default="ngra,pyg,dgl")
    ap.add_argument("--settings", default="memory", help="ngra: memory,budget,disk")
    ap.add_argument("--budget", default="2GB")
    ap.add_argument("--disk-budget", default=None)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--kill-gb", type=float, default=21.0)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--append", action="store_true")
    ap.add_argument("--keep-cache", action="store_true", help="keep generated graphs")
    ap.add_argument("--out", default=str(REPO / "experiments" / "results" / "scale"))
    args = ap.parse_args()
    out = Path(args.out)
    env = dict(os.environ, OMP_NUM_THREADS="2", NUMBA_NUM_THREADS="2")
    command = "python experiments/scale_bench.py " + " ".join(sys.argv[1:])
    rows: list[dict] = []
    if args.append and out.with_suffix(".csv").is_file():
        with open(out.with_suffix(".csv")) as fh:
            rows = list(csv.DictReader(fh))
    for scale in [int(s) for s in args.scales.split(",")]:
        gen = watched([sys.executable, str(Path(__file__).resolve()), "--child", "generate",
                       _spec(scale)], int(args.kill_gb * GIB), args.timeout, env)
        print(f"scale {scale}: generate {gen}", flush=True)
        for model in args.models.split(","):
            for fw in args.frameworks.split(","):
                settings = args.settings.split(",") if fw == "ngra" else ["memory"]
                for setting in settings:
                    row = run_case(fw, model, scale, setting, args, env)
                    print(row, flush=True)
                    # a case run again replaces its row
                    rows = [r for r in rows if _case(r) != _case(row)] + [row]
                    write(rows, out, command)
    write(rows, out, command)


if __name__ == "__main__":
    main()
