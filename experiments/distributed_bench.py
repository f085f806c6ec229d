"""Multi-process training: bytes exchanged, per-rank memory, epoch time, and the cost model.

What
    GCN and GAT (zoo defaults) on R-MAT 2^20 (edge factor 16, 64 features) and SNAP
    ego-Twitter (``twitter``), trained by ``ngra train`` on 1 process (2 threads, and 1
    thread) and on 2 and 4 processes of one thread each (gloo on 127.0.0.1), for each
    partition method (METIS, range) and each exchange (halo, ring). Per case: the epoch
    time (median training step of the slowest rank), bytes sent in one training step
    (exchange and gradient all-reduce, counted at the sends, summed over ranks), the
    largest rank's peak RSS (``VmHWM``: interpreter, libraries, shard and training), and the
    cost model's predictions. The cost model's pick for a (graph, model, ranks, method)
    cell is the strategy with the smaller predicted total over the layers; it is right
    when that strategy's measured epoch is the faster one.

Targets (this 2-core machine, one thread a rank)
    * per-rank peak memory at 4 ranks <= 0.35x of one process (the 2-thread run);
    * 2 processes x 1 thread within 1.3x of the epoch time of 1 process x 2 threads;
    * the cost model picks the measured faster strategy in >= 80% of the cells.

How
    Every case is a fresh ``python -m ngra train`` process tree (the launching process
    partitions and writes shards, cached between cases; only the ranks' memory is
    reported); a case over ``--time-cap`` seconds or whose tree exceeds ``--mem-cap-gb`` of
    RSS is killed and recorded as such. Default allocator, ``OMP_WAIT_POLICY=PASSIVE``.

Overlap (``--overlap``: issue 41's overlapped halo)
    The overlapped and the blocking halo exchange (``--halo-overlap`` / ``--no-halo-overlap``)
    on 2 ranks of one thread each, METIS, in **one** run: the ranks load their shard twice
    (one ``DistGraph`` per mode) and alternate a full training step (forward, loss,
    backward, gradient all-reduce, Adam) of one mode with one of the other, so both see
    the same load from the rest of the machine; a step's time is the slowest rank's
    (barrier before each step), the first step of each mode is a warm-up. Beside them,
    ``ngra train --nprocs 1 --threads 1`` (one process, one thread) before and after: the
    parallel-efficiency row (2 ranks x 1 thread over 1 rank x 1 thread). Per mode, the
    seconds a rank's compute thread was blocked waiting for the exchange a step (summed
    over layers, the summary's ``exchange_per_layer``). Writes
    ``distributed_overlap.csv`` and a section of ``distributed.md``.

Compression (``--compression``: issue 41's ``--halo-bits 8`` and ``--halo-staleness 1``)
    ``ngra train --nprocs K --exchange halo`` (K from ``--procs``) with exact, 8-bit and
    stale halos on the
    Planetoid graphs here (Cora, CiteSeer; PubMed's features are not on this machine),
    GCN and GAT, ``--runs`` seeds of ``--epochs`` each: mean test accuracy over the seeds
    (the selected epoch's), its difference, halo bytes a step and the step time. Writes
    ``distributed_compression.csv`` and a section of ``distributed.md``.

Feature layout (``--feature``: issue 41's feature-parallel layers)
    ``ngra train --exchange halo|ring|feature`` (``--exchanges``) on 2 and 4 ranks of one
    thread each, GCN hidden 128 (``--models gcn128``), METIS (``--methods``), R-MAT 2^17
    (edge factor 8) by default (``--graphs rmat20`` for R-MAT 2^20), ``--epochs`` epochs a
    case: the median step of the slowest rank, the exchange bytes of one training step
    (forward and backward, summed over ranks, and the busiest rank's), and the cost
    model's predictions of the three layouts summed over the layers (every forced run
    still prices all three); per cell (graph, model, ranks, partition) the cost model's
    pick (the smallest predicted total) against the measured fastest. Writes
    ``distributed_feature.md`` and ``.csv`` (rows of other cells kept, a cell's replaced).

Memory (``--memory``: issue 41's memory proportional to the partition)
    ``ngra train --nprocs K --threads 1 --exchange halo`` (GCN by default, ``--epochs``
    epochs) on Cora and R-MAT 2^17 (edge factor 8; ``--graphs``), 2 and 4 ranks, METIS
    and range. Each rank's summary gives its peak (``VmHWM``) and what its partition
    requires (:func:`ngra.distributed.memory.partition_bytes`). The **fixed cost** is
    measured once per case, as "a rank's peak on an empty partition of the same run": the
    same command (model, ranks, partition method, threads, flags) on R-MAT 2^6 (64
    vertices, edge factor 8) with the case's feature width and class count; rank ``r``'s
    fixed cost is that run's rank ``r`` peak less what its (tiny, under 1 MB) partition
    requires. Per rank: peak - fixed against required, and the ratio (target <= 1.25x).
    Writes ``distributed_memory.md`` and ``.csv``.

Run
    python experiments/distributed_bench.py                     # the full grid (about an hour)
    python experiments/distributed_bench.py --memory            # peak above fixed vs required
    python experiments/distributed_bench.py --feature           # halo vs ring vs feature
    python experiments/distributed_bench.py --overlap           # overlapped vs blocking halo
    python experiments/distributed_bench.py --quick             # Cora, a smoke check
    python experiments/distributed_bench.py --repeats 2         # halo/ring alternated twice
    python experiments/distributed_bench.py --graphs rmat22 --models gcn --methods range
                                                                # R-MAT 2^22 (not in the grid)
Writes experiments/results/distributed.md and distributed.csv.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench_util import fmt_bytes, fmt_ratio, fmt_seconds, machine_info, markdown_table, write_csv

RESULTS = Path(__file__).resolve().parent / "results"
GRAPHS = {"rmat20": "rmat:scale=20,edge_factor=16,feat=64", "twitter": "twitter"}
MORE = {"rmat22": "rmat:scale=22,edge_factor=16,feat=64"}  # by name with --graphs
QUICK = {"cora": "cora"}
#: the overlap rows' graphs (``--overlap``; R-MAT 2^20 by name with --graphs rmat20)
OVERLAP_GRAPHS = {"rmat17": "rmat:scale=17,edge_factor=8,feat=64", "twitter": "twitter"}
#: the overlap rows' models: zoo name and hidden width (None: the zoo's)
OVERLAP_MODELS = {"gcn128": ("gcn", 128), "gcn16": ("gcn", 16), "gat": ("gat", None)}
#: the feature rows' graphs (``--feature``; R-MAT 2^20 by name with --graphs rmat20)
FEATURE_GRAPHS = {"rmat17": "rmat:scale=17,edge_factor=8,feat=64"}
LAYOUTS = ("halo", "ring", "feature")
OVERLAP_MARK = "<!-- overlap rows (distributed_bench.py --overlap) -->"
COMPRESSION_MARK = "<!-- compression rows (distributed_bench.py --compression) -->"


def _tree_rss(pid: int) -> int:
    import psutil

    try:
        p = psutil.Process(pid)
        return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
    except psutil.Error:
        return 0


def run_case(spec: str, model: str, nprocs: int, threads: int, method: str, exchange: str,
             epochs: int, data_root: str | None, time_cap: float, mem_cap: float,
             hidden: int | None = None, extra: tuple[str, ...] = ()) -> dict:
    """One ``ngra train`` run; its JSON summary, or ``{"error": why}``."""
    out = Path(tempfile.mkdtemp(prefix="ngra-dist-bench-")) / "summary.json"
    cmd = [sys.executable, "-m", "ngra", "train", "--model", model, "--dataset", spec,
           "--epochs", str(epochs), "--no-progress", "--threads", str(threads),
           "--nprocs", str(nprocs), "--partition-method", method, "--exchange", exchange,
           "--out", str(out)] + (["--hidden", str(hidden)] if hidden else []) + list(extra)
    if data_root:
        cmd += ["--data-root", data_root]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    t0, why = time.monotonic(), None
    while proc.poll() is None:
        if time.monotonic() - t0 > time_cap:
            why = f"over the time cap ({time_cap:.0f} s)"
        elif _tree_rss(proc.pid) > mem_cap * 2**30:
            why = f"over the memory cap ({mem_cap:.0f} GB)"
        if why:
            os.killpg(proc.pid, 9)
            proc.wait()
            return {"error": why}
        time.sleep(0.5)
    _, err = proc.communicate()
    if proc.returncode != 0:
        return {"error": (err.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(out.read_text())


def _row(name: str, model: str, nprocs: int, threads: int, method: str, exchange: str,
         s: dict) -> dict[str, Any]:
    row = {"graph": name, "model": model, "procs": nprocs, "threads": threads,
           "method": method if nprocs > 1 else "—", "exchange": exchange if nprocs > 1 else "—"}
    if "error" in s:
        return {**row, "error": s["error"]}
    per_rank = s.get("epoch_time_s_per_rank") or [s["epoch_time_s"]]
    row.update(epoch_s=max(per_rank), peak_mb=s["peak_rss_mb"], test_acc=s["test_acc"])
    if nprocs > 1:
        sent = s["bytes_sent_per_epoch"]["per_rank"]
        row.update(
            exchange_bytes=sum(sum(b.get(x, 0) for x in LAYOUTS) for b in sent),
            allreduce_bytes=sum(b.get("allreduce", 0) for b in sent),
            pred_halo_s=sum(lay["predicted_halo_s"] for lay in s["exchange"]),
            pred_ring_s=sum(lay["predicted_ring_s"] for lay in s["exchange"]),
            halo_rows=sum(s["partition"]["halo_rows"]),
            edge_cut=s["partition"]["edge_cut_fraction"],
            # the cost model's inputs, so a changed model can be re-scored (--rescore)
            row_bytes=json.dumps([lay["row_bytes"] for lay in s["exchange"]]),
            attention=json.dumps([lay["attention"] for lay in s["exchange"]]),
            stats=json.dumps(s.get("partition_stats")))
    return row


def rescore(rows: list[dict]) -> None:
    """Recompute every multi-process row's predictions with this checkout's cost model,
    from the row's recorded partition statistics and layer widths and this host's link
    calibration (what ``ngra train`` reads)."""
    from ngra.distributed.cost import PartitionStats, predict
    from ngra.distributed.link import calibration_path, load_link

    links: dict[int, Any] = {}
    for r in rows:
        if "error" in r or int(r["procs"]) < 2 or not r.get("stats"):
            continue
        k = int(r["procs"])
        if k not in links:
            links[k] = load_link(calibration_path("gloo", "cpu", k))
        stats = PartitionStats.from_dict(json.loads(r["stats"]))
        widths = json.loads(r["row_bytes"])
        # rows of runs before the summary said so: every layer of the zoo's GAT attends
        attention = (json.loads(r["attention"]) if r.get("attention")
                     else [r["model"] == "gat"] * len(widths))
        preds = [predict(stats, b, links[k], a) for b, a in zip(widths, attention)]
        r["pred_halo_s"] = sum(h for h, _ in preds)
        r["pred_ring_s"] = sum(g for _, g in preds)


# ---------------------------------------------------------------- --memory
#: the memory rows' graphs (``--memory``): name -> (spec, feature width, classes)
MEMORY_GRAPHS = {"cora": ("cora", 1433, 7),
                 "rmat17": ("rmat:scale=17,edge_factor=8,feat=64", 64, 8)}


def _empty_spec(features: int, classes: int) -> str:
    """The fixed-cost run's graph: 64 vertices of the case's feature width and classes."""
    return f"rmat:scale=6,edge_factor=8,feat={features},classes={classes}"


def memory_rows(args: argparse.Namespace) -> int:
    """``--memory``: the rows of the module docs' Memory section."""
    names = (args.graphs.split(",") if args.graphs != ",".join(GRAPHS)
             else list(MEMORY_GRAPHS))
    models = args.models if args.models != "gcn,gat" else "gcn"
    out = Path(args.out)
    out = out.with_name(out.name + "_memory") if out.name == "distributed" else out
    rows = _read_rows(out.with_suffix(".csv"))
    for name in names:
        spec, feat, classes = MEMORY_GRAPHS[name]
        for model in models.split(","):
            for k in [int(p) for p in args.procs.split(",")]:
                for method in args.methods.split(","):
                    t = time.monotonic()
                    empty = run_case(_empty_spec(feat, classes), model, k, 1, method, "halo",
                                     args.epochs, args.data_root, args.time_cap,
                                     args.mem_cap_gb)
                    s = run_case(spec, model, k, 1, method, "halo", args.epochs,
                                 args.data_root, args.time_cap, args.mem_cap_gb)
                    new = _memory_rows(name, model, k, method, s, empty)
                    rows = _replace_cell(rows, new, ("graph", "model", "procs", "method"))
                    worst = max((r.get("ratio") or 0 for r in new), default=0)
                    print(f"{name} {model} {k}x1 {method}: worst ratio {worst:.2f} "
                          f"({time.monotonic() - t:.0f} s, load {os.getloadavg()[0]:.1f})",
                          flush=True)
                    _save_rows(out, rows, memory_report(rows))
    return 0


def _replace_cell(rows: list[dict], new: list[dict], key: tuple[str, ...]) -> list[dict]:
    """``rows`` without those of the cell of ``new`` (equal ``key`` columns), then ``new``."""
    cell = tuple(new[0][c] for c in key)
    return [r for r in rows if tuple(r[c] for c in key) != cell] + new


def _save_rows(out: Path, rows: list[dict], report_md: str) -> None:
    """``rows`` as ``OUT.csv`` and their report as ``OUT.md`` (after every case: an
    interrupted run keeps what it measured)."""
    write_csv(rows, out.with_suffix(".csv"))
    out.with_suffix(".md").write_text(report_md)


def _memory_rows(name: str, model: str, k: int, method: str, s: dict,
                 empty: dict) -> list[dict[str, Any]]:
    """One row a rank: its peak, the fixed cost (the empty run's same rank), required."""
    base = {"graph": name, "model": model, "procs": k, "method": method,
            "load_1m": round(os.getloadavg()[0], 1), "git": machine_info().get("git", "?"),
            "date": time.strftime("%Y-%m-%d %H:%M")}
    why = s.get("error") or empty.get("error")
    if why:
        return [{**base, "rank": "—", "error": why}]
    rows = []
    for r, (m, f) in enumerate(zip(s["memory_per_rank"], empty["memory_per_rank"])):
        fixed = f["peak_rss"] - (f["required_bytes"] or 0)
        above = m["peak_rss"] - fixed
        req = m["required"] or {}
        rows.append({**base, "rank": r, "peak_mb": m["peak_rss"] / 2**20,
                     "fixed_mb": fixed / 2**20, "above_mb": above / 2**20,
                     "required_mb": (m["required_bytes"] or 0) / 2**20,
                     "ratio": above / m["required_bytes"] if m["required_bytes"] else None,
                     "start_rss_mb": (m["fixed_bytes"] or 0) / 2**20,
                     **{f"req_{p}_mb": v / 2**20 for p, v in req.items() if p != "total"}})
    return rows


def memory_report(rows: list[dict]) -> str:
    info = machine_info()
    lines = ["# Memory proportional to the partition (issue 41)", "",
             "Regenerate: `python experiments/distributed_bench.py "
             + " ".join(["--memory"] + [a for a in sys.argv[1:] if a != "--memory"])
             + f"` (git {info.get('git', '?')}, {info.get('date', '?')}): `ngra train "
             "--nprocs K --threads 1 --exchange halo`, one row a rank. peak: the rank's "
             "VmHWM; fixed: the same command's rank peak on R-MAT 2^6 (64 vertices) of the "
             "same feature width and classes, less what that partition requires (an empty "
             "partition of the same run); required: `ngra.distributed.memory."
             "partition_bytes` (data, structure, overlap split, activations kept, backward, "
             "loss, parameters); ratio = (peak - fixed) / required, target <= 1.25x. start: "
             "the rank's RSS before its shard (the summary's fixed_bytes: imports and process "
             "group only). The machine was shared (load in the row): memory is not timing, "
             "but the fixed cost moves by a few MB between runs, which small partitions "
             "(Cora) feel.", ""]
    shown = []
    for r in rows:
        d = {k: r.get(k) for k in ("graph", "model", "procs", "method", "rank")}
        if "error" in r and r.get("error"):
            d["peak"] = r["error"]
        else:
            d.update(peak=f"{r['peak_mb']:.0f} MB", fixed=f"{r['fixed_mb']:.0f} MB",
                     start=f"{r['start_rss_mb']:.0f} MB", above=f"{r['above_mb']:.1f} MB",
                     required=f"{r['required_mb']:.1f} MB",
                     ratio=fmt_ratio(r["ratio"]) if r.get("ratio") is not None else "—",
                     parts=", ".join(f"{p[4:-3]} {r[p]:.1f}" for p in r
                                     if p.startswith("req_") and r[p] not in ("", None)
                                     and float(r[p]) >= 0.05),
                     load=r.get("load_1m"))
        shown.append(d)
    lines.append(markdown_table(shown, [
        ("graph", "graph"), ("model", "model"), ("procs", "ranks"), ("method", "partition"),
        ("rank", "rank"), ("peak", "peak"), ("fixed", "fixed"), ("start", "start"),
        ("above", "peak - fixed"), ("required", "required"), ("ratio", "ratio"),
        ("parts", "required by part (MB)"), ("load", "load 1m")]))
    ok = [r for r in rows if r.get("ratio") not in (None, "")]
    if ok:
        worst = max(ok, key=lambda r: float(r["ratio"]))
        over = [r for r in ok if float(r["ratio"]) > 1.25]
        lines += ["", f"Worst ratio {fmt_ratio(float(worst['ratio']))} ({worst['graph']} "
                  f"{worst['procs']} ranks {worst['method']} rank {worst['rank']}); "
                  f"{len(ok) - len(over)} of {len(ok)} ranks within 1.25x.", "",
                  "What takes the rest: the glibc heap. A rank maps frees of 8 MiB and more "
                  "(`ngra.training.ranks.RANK_LARGE_FREE_BYTES`); its 1-8 MiB per-step "
                  "temporaries (terms, halo rows, gradients) come from heap arenas whose "
                  "freed pages stay resident, and the peak grows over the first steps (R-MAT "
                  "2^17, range, 2 ranks: 1.00-1.12x the count after step 1, 1.19-1.26x "
                  "after step 4). Mapped from 1 MiB the same ranks peak at 0.79-0.84x: "
                  "`experiments/results/"
                  "distributed_memory_phases.md` (`python experiments/rank_memory_phases.py`),"
                  " at the step-time cost the ranks module documents."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- --feature
def feature_rows(args: argparse.Namespace) -> int:
    """``--feature``: the rows of the module docs' Feature layout section."""
    graphs = {k: {**FEATURE_GRAPHS, **GRAPHS, **MORE}.get(k, k)
              for k in (args.graphs if args.graphs != ",".join(GRAPHS)
                        else ",".join(FEATURE_GRAPHS)).split(",")}
    models = args.models if args.models != "gcn,gat" else "gcn128"
    exchanges = args.exchanges if args.exchanges != "halo,ring" else ",".join(LAYOUTS)
    out = Path(args.out)
    out = out.with_name(out.name + "_feature") if out.name == "distributed" else out
    rows = _read_rows(out.with_suffix(".csv"))
    for name, spec in graphs.items():
        for label in models.split(","):
            model, hidden = OVERLAP_MODELS.get(label, (label, None))
            for k in [int(p) for p in args.procs.split(",")]:
                for method in args.methods.split(","):
                    for exchange in exchanges.split(","):
                        t = time.monotonic()
                        s = run_case(spec, model, k, 1, method, exchange, args.epochs,
                                     args.data_root, args.time_cap, args.mem_cap_gb, hidden)
                        row = _feature_row(name, label, k, method, exchange, s)
                        rows = _replace_cell(rows, [row], ("graph", "model", "procs",
                                                           "method", "exchange"))
                        print(f"{name} {label} {k}x1 {method} {exchange}: "
                              f"{row.get('error') or fmt_seconds(row['epoch_s'])}, "
                              f"{fmt_bytes(row.get('bytes', 0))} a step "
                              f"({time.monotonic() - t:.0f} s, load {row['load_1m']})",
                              flush=True)
                        _save_rows(out, rows, feature_report(rows))
    return 0


def _feature_row(name: str, label: str, k: int, method: str, exchange: str,
                 s: dict) -> dict[str, Any]:
    row: dict[str, Any] = {"graph": name, "model": label, "procs": k, "method": method,
                           "exchange": exchange, "load_1m": round(os.getloadavg()[0], 1),
                           "argv": " ".join(sys.argv[1:]),
                           "git": machine_info().get("git", "?"),
                           "date": time.strftime("%Y-%m-%d %H:%M")}
    if "error" in s:
        return {**row, "error": s["error"]}
    sent = s["bytes_sent_per_epoch"]["per_rank"]
    layers = s["exchange"]
    row.update(epoch_s=max(s.get("epoch_time_s_per_rank") or [s["epoch_time_s"]]),
               bytes=sum(sum(b.get(x, 0) for x in LAYOUTS) for b in sent),
               busiest_bytes=max(sum(b.get(x, 0) for x in LAYOUTS) for b in sent),
               ran=",".join(lay["strategy"] for lay in layers),
               peak_mb=s["peak_rss_mb"], test_acc=s["test_acc"])
    for x in LAYOUTS:
        preds = [lay.get(f"predicted_{x}_s") for lay in layers]
        # a layer that cannot run a layout counts it as never chosen (None: not a candidate)
        row[f"pred_{x}_s"] = sum(preds) if all(p is not None for p in preds) else ""
    return row


def feature_report(rows: list[dict]) -> str:
    runs: dict[tuple, dict[str, Any]] = {}
    for r in rows:  # one entry a command: its git, first date and cells
        run = runs.setdefault((r.get("argv", ""), r.get("git", "?")),
                              {"date": r.get("date", "?"), "cells": {}})
        run["cells"][f"{r['graph']} {r['model']} {r['procs']}x1"] = None
    made = "; ".join(f"`nice -n 10 python experiments/distributed_bench.py {a}` (git {g}, "
                     f"{run['date']}: {', '.join(run['cells'])})"
                     for (a, g), run in runs.items())
    lines = ["# Feature-parallel layers vs halo and ring (issue 41, item 2)", "",
             f"Regenerate: {made}. `ngra train --nprocs K --threads 1 --exchange X` a case "
             "(each a fresh process tree), the median step of the slowest rank; bytes: the "
             "exchange bytes of one training step (forward and backward), all ranks and the "
             "busiest rank; predicted: the cost model's totals over the layers (every run "
             "prices all three layouts), its pick the smallest. The machine (2 cores) was "
             "shared with other work: the 1-minute load average is in each row; at 4 ranks "
             "the ranks share the cores, so times are noisy, bytes are not.", ""]
    shown, cells = [], {}
    for r in rows:
        d = {"cell": f"{r['graph']} {r['model']} {r['procs']}x1 {r['method']}",
             "exchange": r["exchange"], "load": f"{r['load_1m']:.1f}"}
        if "error" in r:
            d["epoch"] = r["error"]
        else:
            d.update(epoch=fmt_seconds(r["epoch_s"]), bytes=fmt_bytes(r["bytes"]),
                     busiest=fmt_bytes(r["busiest_bytes"]), acc=f"{r['test_acc']:.3f}",
                     pred=" / ".join(fmt_seconds(r[f"pred_{x}_s"]) if r.get(f"pred_{x}_s")
                                     not in (None, "") else "—" for x in LAYOUTS))
            cells.setdefault(d["cell"], {})[r["exchange"]] = r
        shown.append(d)
    lines.append(markdown_table(shown, [
        ("cell", "graph model ranks partition"), ("exchange", "exchange"),
        ("epoch", "step (slowest rank)"), ("bytes", "exchange bytes/step (all ranks)"),
        ("busiest", "busiest rank"), ("pred", "predicted halo / ring / feature"),
        ("acc", "test acc"), ("load", "load 1m")]))
    detail, right, close = [], 0, 0
    for cell, got in cells.items():
        if set(got) != set(LAYOUTS):
            continue
        first = next(iter(got.values()))
        preds = {x: first[f"pred_{x}_s"] for x in LAYOUTS if first.get(f"pred_{x}_s") != ""}
        pick = min(preds, key=preds.get)
        fastest = min(got, key=lambda x: got[x]["epoch_s"])
        regret = got[pick]["epoch_s"] / got[fastest]["epoch_s"] - 1
        right += pick == fastest
        close += regret <= 0.10
        detail.append({"cell": cell, "pick": pick, "fastest": fastest,
                       "regret": "—" if pick == fastest else f"+{regret:.0%}",
                       "fb": fmt_ratio(got["feature"]["bytes"] / got["halo"]["bytes"])
                       if got["halo"]["bytes"] else "—"})
    if detail:
        lines += ["", "## The cost model's pick and the bytes", "",
                  f"The pick is the measured fastest in {right} of {len(detail)} cells; "
                  f"within 10% of it in {close} of {len(detail)}. Targets (issue 41): the "
                  "pick the fastest in >= 80% of cells and within 10% in every cell; on "
                  "R-MAT 2^20 GCN at 4 ranks, feature moves fewer bytes a step than the halo.",
                  "", markdown_table(detail, [("cell", "cell"), ("pick", "cost model"),
                                              ("fastest", "measured fastest"),
                                              ("regret", "pick over fastest"),
                                              ("fb", "feature / halo bytes a step")])]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- --overlap
def interleaved_steps(model: str, hidden: int | None, folder: str, steps: int,
                      seed: int = 0) -> dict[str, Any] | None:
    """On each of the launched ranks: alternate training steps of the overlapped and the
    blocking halo (module docs); rank 0 returns every step's slowest-rank seconds by mode
    and each mode's per-layer wait and bytes, rank by rank."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from ngra.distributed import GradientSync
    from ngra.distributed.shards import load_shard
    from ngra.kernels import dropout_rows
    from ngra.models import build_model

    r, k = dist.get_rank(), dist.get_world_size()
    shards = {mode: load_shard(folder, r, k, exchange="halo", overlap=mode == "overlapped")
              for mode in ("overlapped", "blocking")}
    m = shards["overlapped"].meta
    torch.manual_seed(seed)
    net = build_model(model, m["num_features"], m["num_classes"],
                      num_edge_types=m["num_edge_types"],
                      **({"hidden": hidden} if hidden else {}))
    sync = GradientSync(net.parameters())
    sync.broadcast_parameters()
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    n = max(m["split_sizes"]["train"], 1)
    times: dict[str, list[float]] = {"overlapped": [], "blocking": []}
    net.train()
    for step in range(2 * steps + 2):
        mode = ("overlapped", "blocking")[step % 2 if step // 2 % 2 == 0 else 1 - step % 2]
        sh = shards[mode]
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        with dropout_rows(sh.row_ids):
            out = net(sh.graph, sh.x, sh.edge_data)
        mask = sh.masks["train"]
        loss = F.cross_entropy(out[mask], sh.y[mask], reduction="sum") / n
        loss.backward()
        sync.finish()
        opt.step()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if step >= 2:  # one warm-up step a mode
            times[mode].append(float(t))
    stats = {mode: sh.graph.exchange_stats() for mode, sh in shards.items()}
    everyone: list[Any] = [None] * k
    dist.all_gather_object(everyone, stats)
    if r != 0:
        return None
    return {"times": times, "stats": {mode: [e[mode] for e in everyone] for mode in times}}


def overlap_rows(args: argparse.Namespace) -> int:
    """``--overlap``: the rows of the module docs' Overlap section."""
    import statistics

    from ngra.distributed import launch
    from ngra.training import TrainConfig
    from ngra.training.ranks import prepare_shards

    graphs = {k: {**OVERLAP_GRAPHS, **GRAPHS, **MORE}.get(k, k)
              for k in (args.graphs if args.graphs != ",".join(GRAPHS)
                        else ",".join(OVERLAP_GRAPHS)).split(",")}
    models = args.models if args.models != "gcn,gat" else ",".join(OVERLAP_MODELS)
    out = Path(args.out)
    csv_path = out.with_name(out.name + "_overlap").with_suffix(".csv")
    rows = _read_rows(csv_path)  # other cells' rows stay; this run's replace their own
    for name, spec in graphs.items():
        for label in models.split(","):
            model, hidden = OVERLAP_MODELS.get(label, (label, None))
            t = time.monotonic()
            one = [run_case(spec, model, 1, 1, "metis", "auto", args.epochs, args.data_root,
                            args.time_cap, args.mem_cap_gb, hidden)]
            cfg = TrainConfig(model=model, dataset=spec, data_root=args.data_root, nprocs=2,
                              progress=False, hidden=hidden)
            folder = str(prepare_shards(cfg))
            got = launch(interleaved_steps, 2, model, hidden, folder, args.steps,
                         threads=1, timeout_s=args.time_cap)[0]
            load = os.getloadavg()[0]
            one.append(run_case(spec, model, 1, 1, "metis", "auto", args.epochs,
                                args.data_root, args.time_cap, args.mem_cap_gb, hidden))
            one_s = [s["epoch_time_s"] for s in one if "error" not in s]
            row: dict[str, Any] = {"graph": name, "model": label, "steps": args.steps,
                                   "cores": os.cpu_count(),
                                   "load_1m": round(max(load, os.getloadavg()[0]), 1),
                                   "argv": " ".join(sys.argv[1:]),
                                   "git": machine_info().get("git", "?"),
                                   "date": time.strftime("%Y-%m-%d %H:%M")}
            for mode in ("overlapped", "blocking"):
                ts = got["times"][mode]
                per_rank = got["stats"][mode]  # [rank][layer]
                row[f"{mode}_s"] = statistics.median(ts)
                row[f"{mode}_min_s"] = min(ts)
                row[f"{mode}_wait_s"] = max(sum(lay["wait_s"] or 0.0 for lay in rank)
                                            for rank in per_rank)
                row[f"{mode}_bytes"] = sum(lay["forward_bytes"] + lay["backward_bytes"]
                                           for rank in per_rank for lay in rank)
            # the same steps, pair by pair: how the mode's order within a pair washes out
            pairs = [a / b for a, b in zip(got["times"]["overlapped"], got["times"]["blocking"])]
            row["ratio_median_of_pairs"] = statistics.median(pairs)
            row["ratio"] = row["overlapped_s"] / row["blocking_s"]
            if one_s:
                row["one_rank_s"] = statistics.median(one_s)
                row["efficiency"] = min(row["overlapped_s"], row["blocking_s"]) / row["one_rank_s"]
            # a cell's row per machine size: the 16-core rows beside this machine's
            rows = [r for r in rows if (r["graph"], r["model"], r.get("cores", 2))
                    != (name, label, row["cores"])] + [row]
            print(f"{name} {label}: overlapped {fmt_seconds(row['overlapped_s'])}, blocking "
                  f"{fmt_seconds(row['blocking_s'])} ({row['ratio']:.2f}x), 1 rank "
                  f"{fmt_seconds(row.get('one_rank_s', float('nan')))} "
                  f"({time.monotonic() - t:.0f} s, load {row['load_1m']})", flush=True)
            write_csv(rows, csv_path)
            _write_overlap_section(out.with_suffix(".md"), overlap_report(rows, args))
    return 0


def _read_rows(path: Path) -> list[dict]:
    import csv

    if not path.exists():
        return []
    with open(path, newline="") as f:
        return [{k: _number(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]


def overlap_report(rows: list[dict], args: argparse.Namespace) -> str:
    runs = {}
    for r in rows:  # rows of earlier runs carry their own command (older ones: this run's)
        key = (r.get("argv", " ".join(sys.argv[1:])), r.get("git", "?"), r.get("date", "?"))
        runs.setdefault(key, []).append(f"{r['graph']} {r['model']}")
    made = "; ".join(f"`python experiments/distributed_bench.py {a}` (git {g}, {d}: "
                     f"{', '.join(cells)})" for (a, g, d), cells in runs.items())
    lines = [OVERLAP_MARK, "", "## Overlapped vs blocking halo (issue 41)", "",
             f"Regenerate: {made}. 2 ranks x 1 thread, METIS, "
             "halo forced; the two modes alternate training steps in one run (`--steps` "
             "steps each after a warm-up step each; median of the slowest rank's step); "
             "1 rank x 1 thread is `ngra train --nprocs 1 --threads 1`, `--epochs` epochs, "
             "run before and after (median epoch). Cores: the machine's CPU count (2: the "
             "shared development machine, where a 1-minute load above 2 means the ranks "
             "shared their cores; 16: the host of the lent GPU machine, otherwise idle). "
             "Wait: seconds the slowest-waiting rank's compute thread "
             "was blocked on the exchange in a step (median per layer, summed); bytes: "
             "halo bytes sent by all ranks in a step (forward and backward).", ""]
    shown = []
    for r in rows:
        shown.append({
            "cell": f"{r['graph']} {r['model']}",
            "ov": fmt_seconds(r["overlapped_s"]), "bl": fmt_seconds(r["blocking_s"]),
            "ratio": f"{r['ratio']:.2f}x", "pairs": f"{r['ratio_median_of_pairs']:.2f}x",
            "wait": f"{fmt_seconds(r['overlapped_wait_s'])} / "
                    f"{fmt_seconds(r['blocking_wait_s'])}",
            "bytes": f"{fmt_bytes(r['overlapped_bytes'])} / {fmt_bytes(r['blocking_bytes'])}",
            "one": fmt_seconds(r["one_rank_s"]) if "one_rank_s" in r else "—",
            "eff": fmt_ratio(r["efficiency"]) if "efficiency" in r else "—",
            "cores": str(int(r.get("cores", 2))), "load": f"{r['load_1m']:.1f}"})
    lines.append(markdown_table(shown, [
        ("cell", "graph model"), ("ov", "overlapped step"), ("bl", "blocking step"),
        ("ratio", "overlapped / blocking"), ("pairs", "median of step pairs"),
        ("wait", "wait a step: overlapped / blocking"),
        ("bytes", "halo bytes a step: overlapped / blocking"),
        ("one", "1 rank x 1 thread epoch"), ("eff", "2x1 (faster mode) / 1x1"),
        ("cores", "cores"), ("load", "load 1m")]))
    lines += ["", "Targets: overlapped <= 0.85x blocking; 2 x 1 <= 0.65x 1 x 1.", ""]
    return "\n".join(lines)


def _write_overlap_section(md: Path, section: str, mark: str = OVERLAP_MARK) -> None:
    """``section`` (opening with ``mark``) in place of the previous one in ``md``, else
    appended; the grid's report above the marked sections is left as it is."""
    text = md.read_text() if md.exists() else "# Multi-process training\n"
    marks = (OVERLAP_MARK, COMPRESSION_MARK)
    found = sorted((text.index(m), m) for m in marks if m in text)
    pieces = {m: text[at:(found[n + 1][0] if n + 1 < len(found) else len(text))]
              for n, (at, m) in enumerate(found)}
    pieces[mark] = section
    head = text[:found[0][0]] if found else text
    body = [pieces[m].rstrip("\n") for m in marks if m in pieces]
    md.write_text(head.rstrip("\n") + "\n\n" + "\n\n".join(body) + "\n")


# ---------------------------------------------------------------- --compression
def compression_rows(args: argparse.Namespace) -> int:
    """``--compression``: exact vs 8-bit halos, accuracy and bytes (module docs)."""
    graphs = ["cora", "citeseer"] if args.graphs == ",".join(GRAPHS) else args.graphs.split(",")
    rows = []
    out = Path(args.out)
    cells = [(name, model, k) for name in graphs for model in args.models.split(",")
             for k in [int(p) for p in args.procs.split(",")]]
    for name, model, k in cells:
        row: dict[str, Any] = {"graph": name, "model": model, "procs": k, "runs": args.runs,
                               "epochs": args.epochs}
        for label, extra in (("exact", ()), ("bits8", ("--halo-bits", "8")),
                             ("stale1", ("--halo-staleness", "1"))):
            s = run_case(name, model, k, 1, "metis", "halo", args.epochs, args.data_root,
                         args.time_cap, args.mem_cap_gb, None,
                         ("--runs", str(args.runs), *extra))
            if "error" in s:
                row[f"{label}_error"] = s["error"]
                continue
            runs = s.get("results") or [s]
            row[f"{label}_acc"] = s["test_acc_mean"]
            row[f"{label}_acc_std"] = s["test_acc_std"]
            row[f"{label}_step_s"] = s["epoch_time_s"]
            row[f"{label}_halo_bytes"] = sum(
                b.get("halo", 0) for b in runs[0]["bytes_sent_per_epoch"]["per_rank"])
        row["load_1m"] = round(os.getloadavg()[0], 1)
        rows.append(row)
        print(f"{name} {model} {k} ranks: exact {row.get('exact_acc')}, "
              f"8-bit {row.get('bits8_acc')}, stale {row.get('stale1_acc')} "
              f"(load {row['load_1m']})", flush=True)
        write_csv(rows, out.with_name(out.name + "_compression").with_suffix(".csv"))
        _write_overlap_section(out.with_suffix(".md"), compression_report(rows, args),
                               COMPRESSION_MARK)
    return 0


def compression_report(rows: list[dict], args: argparse.Namespace) -> str:
    info = machine_info()
    lines = [COMPRESSION_MARK, "", "## 8-bit and stale halos (issue 41, `--halo-bits 8`, "
             "`--halo-staleness 1`)", "",
             f"Regenerate: `python experiments/distributed_bench.py {' '.join(sys.argv[1:])}` "
             f"(git {info.get('git', '?')}, {info.get('date', '?')}): `ngra train --nprocs K "
             f"--threads 1 --exchange halo` (K: the ranks column), METIS, {args.epochs} epochs, "
             f"{args.runs} seeds "
             "(--runs), the zoo's hyper-parameters; test accuracy at the best validation "
             "epoch, mean +- sample std over the seeds; halo bytes: every rank, one training "
             "step; step: median training step (the machine was shared: load in the row).",
             ""]
    shown = []
    for r in rows:
        d = {"cell": f"{r['graph']} {r['model']}", "load": f"{r['load_1m']:.1f}",
             "procs": r.get("procs", 2)}  # rows of earlier runs: 2 ranks
        for label in ("exact", "bits8", "stale1"):
            if f"{label}_acc" in r:
                d[label] = f"{r[f'{label}_acc']:.4f} +- {r[f'{label}_acc_std'] or 0:.4f}"
                d[f"{label}_b"] = fmt_bytes(r[f"{label}_halo_bytes"])
                d[f"{label}_t"] = fmt_seconds(r[f"{label}_step_s"])
            else:
                d[label] = r.get(f"{label}_error", "—")
        for label in ("bits8", "stale1"):
            if "exact_acc" in r and f"{label}_acc" in r:
                d[f"{label}_d"] = f"{(r[f'{label}_acc'] - r['exact_acc']) * 100:+.2f} points"
        shown.append(d)
    lines.append(markdown_table(shown, [
        ("cell", "graph model"), ("procs", "ranks"), ("exact", "exact test acc"),
        ("bits8", "8-bit test acc"),
        ("bits8_d", "8-bit - exact"), ("stale1", "stale test acc"),
        ("stale1_d", "stale - exact"), ("exact_b", "halo bytes/step exact"),
        ("bits8_b", "8-bit"), ("exact_t", "step exact"), ("bits8_t", "step 8-bit"),
        ("stale1_t", "step stale"), ("load", "load 1m")]))
    lines += ["", "Target: each within 0.5 points of the exact run.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    ap.add_argument("--models", default="gcn,gat")
    ap.add_argument("--procs", default="2,4")
    ap.add_argument("--methods", default="metis,range")
    ap.add_argument("--exchanges", default="halo,ring")
    ap.add_argument("--repeats", type=int, default=1,
                    help="rounds of the grid's multi-process cases, interleaved; a case's "
                         "epoch is its fastest round's, its peak the largest")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--time-cap", type=float, default=1200)
    ap.add_argument("--mem-cap-gb", type=float, default=20)
    ap.add_argument("--quick", action="store_true", help="Cora only: a smoke check")
    ap.add_argument("--out", default=str(RESULTS / "distributed"))
    ap.add_argument("--rescore", action="store_true",
                    help="run nothing: recompute the predictions of the cases in OUT.csv with "
                         "this checkout's cost model and rewrite OUT.md")
    ap.add_argument("--overlap", action="store_true",
                    help="overlapped vs blocking halo, interleaved in one run, and the "
                         "parallel-efficiency row (module docs)")
    ap.add_argument("--steps", type=int, default=10,
                    help="--overlap: training steps of each mode")
    ap.add_argument("--feature", action="store_true",
                    help="halo vs ring vs feature layout, bytes a step and the cost model's "
                         "pick (module docs)")
    ap.add_argument("--compression", action="store_true",
                    help="exact vs 8-bit halos: accuracy and bytes (module docs)")
    ap.add_argument("--runs", type=int, default=3, help="--compression: seeds a case")
    ap.add_argument("--memory", action="store_true",
                    help="each rank's peak above its fixed cost vs what its partition "
                         "requires (module docs)")
    args = ap.parse_args()
    out = Path(args.out)
    if args.overlap:
        return overlap_rows(args)
    if args.feature:
        return feature_rows(args)
    if args.compression:
        return compression_rows(args)
    if args.memory:
        return memory_rows(args)
    if args.rescore:
        import csv

        with open(out.with_suffix(".csv"), newline="") as f:
            rows = [{k: _number(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]
        rescore(rows)
        run = json.loads(out.with_suffix(".json").read_text())
        out.with_suffix(".md").write_text(report(rows, run, rescored=True))
        print(f"rewrote {out.with_suffix('.md')} with this checkout's cost model")
        return 0
    run = {"argv": sys.argv[1:], "epochs": args.epochs, "repeats": args.repeats,
           "machine": machine_info()}  # the run's, which --rescore keeps
    graphs = QUICK if args.quick else {k: {**GRAPHS, **MORE}.get(k, k)
                                       for k in args.graphs.split(",")}
    procs = [int(p) for p in args.procs.split(",")]
    rows = []

    def case(name, spec, model, k, threads, method="metis", exchange="auto", again=None):
        t = time.monotonic()
        s = run_case(spec, model, k, threads, method, exchange, args.epochs, args.data_root,
                     args.time_cap, args.mem_cap_gb)
        row = _row(name, model, k, threads, method, exchange, s)
        if again is not None:  # a later round of the same case: keep the fastest epoch
            if "error" in again:  # an earlier round failed: this one replaces it
                again.clear()
                again.update(row)
            elif "error" not in row:
                again.update(epoch_s=min(again["epoch_s"], row["epoch_s"]),
                             peak_mb=max(again["peak_mb"], row["peak_mb"]),
                             rounds=again.get("rounds", 1) + 1)
            row = again
        else:
            rows.append(row)
        print(f"{name} {model} procs={k}x{threads} {method} {exchange}: "
              f"{row.get('error') or fmt_seconds(row['epoch_s'])} "
              f"({time.monotonic() - t:.0f} s)", flush=True)
        row["load_1m"] = max(row.get("load_1m", 0.0), os.getloadavg()[0])
        write(rows)  # after every case: an interrupted grid keeps what it measured
        return row

    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(run) + "\n")

    def write(rows):
        write_csv(rows, out.with_suffix(".csv"))
        out.with_suffix(".md").write_text(report(rows, run))

    if not args.quick:  # each model's fixed cost per process: the same runs on Cora
        for model in args.models.split(","):
            case("cora", "cora", model, 1, 2)
            for k in procs:
                case("cora", "cora", model, k, 1, "range", "halo")
    methods, exchanges = args.methods.split(","), args.exchanges.split(",")
    for name, spec in graphs.items():
        for model in args.models.split(","):
            case(name, spec, model, 1, 2)
            case(name, spec, model, 1, 1)
            multi = [(k, m, x) for k in procs for m in methods for x in exchanges]
            done = {}
            for _ in range(args.repeats):  # halo and ring alternate within a round
                for k, method, exchange in multi:
                    done[k, method, exchange] = case(name, spec, model, k, 1, method, exchange,
                                                     again=done.get((k, method, exchange)))
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.csv')}")
    return 0


def _number(v: str) -> Any:
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def report(rows: list[dict], run: dict, rescored: bool = False) -> str:
    info = run.get("machine") or machine_info()
    ok = [r for r in rows if "error" not in r]
    base = {(r["graph"], r["model"], r["threads"]): r for r in ok if r["procs"] == 1}
    loads = [r["load_1m"] for r in rows if "load_1m" in r] or [os.getloadavg()[0]]
    lines = ["# Multi-process training", "",
             "Regenerate: `python experiments/distributed_bench.py"
             + "".join(f" {a}" for a in run["argv"]) + "`"
             f" ({run['epochs']} epochs a case, median step; multi-process cases in "
             f"{run['repeats']} interleaved round(s), the fastest round's epoch and the largest "
             "peak).", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items()),
             f"1-minute load average after each case: {min(loads):.1f} to {max(loads):.1f}"
             " (above 2 the cores were shared with other work: times are noisy, memory and"
             " bytes are not).", ""]
    if rescored:
        lines += ["Predictions re-scored (`--rescore`) with the cost model of "
                  f"git {machine_info().get('git', '?')} from each case's recorded partition "
                  "statistics and layer widths and this host's link calibration; the "
                  "measurements are the run's.", ""]
    lines += ["## Cases", ""]
    shown = []
    for r in rows:
        b2 = base.get((r["graph"], r["model"], 2))
        d = dict(r)
        if "error" in r:
            d["epoch"] = r["error"]
        else:
            d["epoch"] = fmt_seconds(r["epoch_s"])
            d["peak"] = f"{r['peak_mb']:.0f} MB"
            if b2 and r["procs"] > 1:
                d["mem_ratio"] = fmt_ratio(r["peak_mb"] / b2["peak_mb"])
                d["time_ratio"] = fmt_ratio(r["epoch_s"] / b2["epoch_s"])
            if r["procs"] > 1:
                d["xbytes"] = fmt_bytes(r["exchange_bytes"])
                d["arbytes"] = fmt_bytes(r["allreduce_bytes"])
                d["pred"] = f"{fmt_seconds(r['pred_halo_s'])} / {fmt_seconds(r['pred_ring_s'])}"
            d["acc"] = f"{r['test_acc']:.3f}"
        shown.append(d)
    lines.append(markdown_table(shown, [
        ("graph", "graph"), ("model", "model"), ("procs", "procs"), ("threads", "threads/rank"),
        ("method", "partition"), ("exchange", "exchange"), ("epoch", "epoch (slowest rank)"),
        ("time_ratio", "vs 1x2 time"), ("peak", "peak RSS (largest rank)"),
        ("mem_ratio", "vs 1x2 memory"), ("xbytes", "exchange bytes/step"),
        ("arbytes", "all-reduce bytes/step"), ("pred", "predicted halo / ring"),
        ("acc", "test acc")]))
    lines += ["", "## Targets", ""]
    # Cora measures each process's fixed cost (below); the targets are the other graphs'
    # (Cora's own only in a --quick run, where it is the one graph)
    fixed_only = "cora" if {r["graph"] for r in ok} - {"cora"} else None
    mem = [r["peak_mb"] / base[(r["graph"], r["model"], 2)]["peak_mb"] for r in ok
           if r["procs"] == 4 and r["graph"] != fixed_only
           and (r["graph"], r["model"], 2) in base]
    lines.append(f"* per-rank peak memory at 4 ranks vs one process: worst "
                 f"{fmt_ratio(max(mem)) if mem else '—'}, best {fmt_ratio(min(mem)) if mem else '—'}"
                 " (target <= 0.35x)")
    # what a process costs before any graph (interpreter, torch, numba's compiled kernels,
    # gloo): the same model's run on Cora, per process count
    fixed = {(r["model"], r["procs"]): r["peak_mb"] for r in ok if r["graph"] == "cora"
             and (r["procs"] == 1 and r["threads"] == 2 or r["procs"] > 1)}
    data = [((r["peak_mb"] - fixed[(r["model"], 4)])
             / (base[(r["graph"], r["model"], 2)]["peak_mb"] - fixed[(r["model"], 1)]),
             r["graph"], r["model"]) for r in ok
            if r["procs"] == 4 and r["graph"] != "cora" and (r["graph"], r["model"], 2) in base
            and (r["model"], 4) in fixed and (r["model"], 1) in fixed]
    if data:
        lines.append(
            "* the same above each process's fixed cost (its peak on Cora: "
            + ", ".join(f"{m} {fixed[(m, 1)]:.0f} MB alone, {fixed[(m, 4)]:.0f} MB a rank"
                        for m in sorted({d[2] for d in data}))
            + f"): worst {fmt_ratio(max(data)[0])}, best {fmt_ratio(min(data)[0])}")
    t2 = []
    for (g, m, th), b in base.items():
        if th != 2 or g == fixed_only:
            continue
        two = [r["epoch_s"] for r in ok if (r["graph"], r["model"], r["procs"]) == (g, m, 2)]
        if two:
            t2.append((g, m, min(two) / b["epoch_s"]))
    lines.append("* 2 processes x 1 thread vs 1 process x 2 threads (fastest 2-rank "
                 "configuration): " + ", ".join(f"{g}/{m} {fmt_ratio(x)}" for g, m, x in t2)
                 + " (target <= 1.3x)")
    cells, right, regrets = {}, 0, []
    for r in ok:
        if r["procs"] > 1:
            cells.setdefault((r["graph"], r["model"], r["procs"], r["method"]), {})[
                r["exchange"]] = r
    detail = []
    for key, pair in cells.items():
        if set(pair) != {"halo", "ring"}:
            continue
        h, g = pair["halo"], pair["ring"]
        pick = "ring" if h["pred_ring_s"] < h["pred_halo_s"] else "halo"
        faster = "ring" if g["epoch_s"] < h["epoch_s"] else "halo"
        right += pick == faster
        regret = pair[pick]["epoch_s"] / pair[faster]["epoch_s"] - 1
        regrets.append(regret)
        detail.append({"cell": " ".join(map(str, key)), "pick": pick, "faster": faster,
                       "halo": fmt_seconds(h["epoch_s"]), "ring": fmt_seconds(g["epoch_s"]),
                       "pred": f"{fmt_seconds(h['pred_halo_s'])} / {fmt_seconds(h['pred_ring_s'])}",
                       "ok": "yes" if pick == faster else f"no (+{regret:.0%})"})
    n = len(detail)
    lines.append(f"* cost model picks the measured faster strategy in {right} of {n} cells "
                 f"({right / n:.0%}); the pick's epoch over the faster one's: mean "
                 f"+{sum(regrets) / n:.1%}, worst +{max(regrets):.0%}"
                 if n else "* cost model: no complete cell")
    lines += ["", markdown_table(detail, [("cell", "cell (graph model ranks partition)"),
                                          ("pick", "cost model"), ("faster", "measured faster"),
                                          ("halo", "halo epoch"), ("ring", "ring epoch"),
                                          ("pred", "predicted halo / ring"),
                                          ("ok", "right")]), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
