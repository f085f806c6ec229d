"""Planner validation: predicted vs measured step times of candidate plans on gloo ranks.

    flock /tmp/ngra-bench.lock .venv/bin/python experiments/planner_validation.py
    # -> experiments/results/planner.md, planner.csv and planner.json (the raw runs)

For each process count (2 and 4): calibrate this machine's link and compute rates
afresh (``ngra plan --calibrate``), then for each case -- MLP stacks of widths
256..4096, and the dense parts of GCN, G-GCN and GAT (zoo models, input widths
16..1024) on synthetic graphs -- take the planner's ranked plans (the best of each
mesh shape and micro-batch count) plus variants (a tensor-parallel plan with every
layer whole, a pipeline with recomputation), run them all with torch's DDP / tensor
parallel / pipelining through :func:`ngra.planner.measure.measure_cases` (one launch
per process count; plans interleaved in rounds), and compare:

* a predicted-vs-measured table per case;
* Kendall's tau between predicted and measured times over every pair of plans of the
  same case (pooled over cases, and per case);
* the regret of the planner's top pick per case: measured(pick) / measured(best) - 1
  (the worst case is reported).

GNN cases run each rank's part of the real graph (edge-balanced destination ranges) and
exchange the busiest rank's halo row count (:class:`ngra.planner.measure.ChainModule`).
The "exchange" pair is one G-GCN on two graphs of equal size and degree (4): a banded
graph (neighbours are nearby ids: a halo of a few rows) and a random one (a halo of
several times a rank's own rows): the exchange bytes change the pick.

The machine has 2 cores: each rank runs one torch thread, so 4 ranks share 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ngra.graph import Graph
from ngra.planner import Chain, Devices, ParallelPlan, evaluate, search
from ngra.planner.measure import kendall_tau, measure_cases
from ngra.planner.trace import trace_module

RESULTS = Path(__file__).resolve().parent / "results"
NODES = 16384
DEGREE = 16
EXCHANGE_NODES = 65536


def _mlp(widths: list[int]) -> torch.nn.Module:
    from ngra.planner.command import _mlp as build

    return build("mlp:" + ",".join(map(str, widths)))


def banded_graph(n: int, degree: int) -> Graph:
    """In-edges from the ``degree`` nearest ids (a halo of ``degree / 2`` rows per cut)."""
    dst = torch.arange(n).repeat_interleave(degree)
    off = torch.tensor([k for k in range(-degree // 2, degree // 2 + 1) if k != 0])
    src = (dst + off.repeat(n)).clamp(0, n - 1)
    return Graph.from_edge_index(torch.stack([src, dst]), num_nodes=n)


def random_graph(n: int, degree: int, seed: int = 0) -> Graph:
    g = torch.Generator().manual_seed(seed)
    dst = torch.arange(n).repeat_interleave(degree)
    src = torch.randint(0, n, (n * degree,), generator=g)
    return Graph.from_edge_index(torch.stack([src, dst]), num_nodes=n)


def gnn_case(name: str, model: str, graph: Graph, f_in: int, hidden: int, k: int,
             heads: int | None = None) -> tuple[str, Chain, Any]:
    from ngra.models import build_model, prepare
    from ngra.planner.gnn import gnn_chain

    g, edge_data = prepare(model, graph)
    torch.manual_seed(0)
    net = build_model(model, f_in, 16, hidden=hidden, heads=heads)
    x = torch.randn(graph.num_nodes, f_in)
    parts = [p for p in range(2, k + 1) if k % p == 0]
    chain = gnn_chain(net, g, x, edge_data, parts=parts, name=name)
    return name, chain, (g.indptr.clone(), g.indices.clone())


def cases(k: int, quick: bool) -> list[tuple[str, Chain, Any]]:
    out = [("mlp 256-2048-2048-256, 1024 rows",
            trace_module(_mlp([256, 2048, 2048, 256]), 1024), None),
           ("mlp 512-1024x4-512, 1024 rows",
            trace_module(_mlp([512, 1024, 1024, 1024, 1024, 512]), 1024), None),
           ("mlp 1024-4096-1024, 256 rows", trace_module(_mlp([1024, 4096, 1024]), 256), None)]
    if quick:
        out = out[:1]
    n = NODES // (4 if quick else 1)
    rand = random_graph(n, DEGREE)
    out += [gnn_case("gcn 1024-256-16, random graph", "gcn", rand, 1024, 256, k),
            gnn_case("gat 256-8x8-16, random graph", "gat", rand, 256, 8, k, heads=8)]
    if not quick:
        out.append(gnn_case("ggcn 16-64-16, random graph", "ggcn", rand, 16, 64, k))
    # the exchange pair: 4 in-edges a vertex, so the halo of a random graph is several
    # times a rank's own rows, that of a banded graph a few rows
    n = EXCHANGE_NODES // (4 if quick else 1)
    out += [gnn_case("ggcn 32-32-16, banded graph, degree 4 (exchange)", "ggcn",
                     banded_graph(n, 4), 32, 32, k),
            gnn_case("ggcn 32-32-16, random graph, degree 4 (exchange)", "ggcn",
                     random_graph(n, 4), 32, 32, k)]
    return out


def candidates(chain: Chain, devices: Devices, limit: int) -> list[ParallelPlan]:
    """The planner's best plan of each shape, and variants of them, without repeats."""
    ranked = search(chain, devices, micro_batches=(1, 4))
    out = {p.label: p for p in ranked}
    for p in ranked:
        if p.tensor > 1:  # the same shape with every layer whole
            whole = [(s.start, s.stop, ("rep",) * len(s.configs), s.recompute) for s in p.stages]
            alt = evaluate(chain, devices, p.shape, whole)
            out.setdefault(alt.label, alt)
        if p.pipeline > 1 and not any(s.recompute for s in p.stages):
            again = [(s.start, s.stop, s.configs, True) for s in p.stages]
            alt = evaluate(chain, devices, p.shape, again)
            out.setdefault(alt.label, alt)
    plans = sorted(out.values(), key=lambda p: p.predicted_time_s)
    if len(plans) > limit:  # keep the top and an even spread of the rest
        step = (len(plans) - 1) / (limit - 1)
        plans = [plans[round(i * step)] for i in range(limit)]
    return plans


def pooled_tau(rows_by_case: list[list[dict]]) -> float:
    """Kendall's tau over every within-case pair of plans."""
    s = n = 0
    for rows in rows_by_case:
        m = len(rows)
        tau = kendall_tau([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows])
        if m > 1:
            s += tau * m * (m - 1) / 2
            n += m * (m - 1) / 2
    return s / n if n else float("nan")


def validate(k: int, args: argparse.Namespace) -> dict[str, Any]:
    from ngra.distributed.link import calibrate

    t0 = time.time()
    link = calibrate(k)
    devices = Devices(k, 8 * 2**30, link)
    todo = []
    for name, chain, graph in cases(k, args.quick):
        plans = candidates(chain, devices, args.limit)
        todo.append((name, chain, plans, graph))
        print(f"[{k} ranks] {name}: {len(plans)} plans", flush=True)
    measured = measure_cases([(c, p, g) for _, c, p, g in todo], steps=args.steps,
                             warmup=args.warmup, rounds=args.rounds)
    results = []
    for (name, chain, plans, _), rows in zip(todo, measured):
        best = min(r["measured_s"] for r in rows)
        pick = rows[0]  # candidates are sorted by predicted time
        for r, p in zip(rows, plans):
            r["breakdown"] = {k2: v for k2, v in vars(p.breakdown).items() if v}
        results.append({"case": name, "rows": rows,
                        "tau": kendall_tau([r["predicted_s"] for r in rows],
                                           [r["measured_s"] for r in rows]),
                        "regret": pick["measured_s"] / best - 1, "pick": pick["label"],
                        "best": min(rows, key=lambda r: r["measured_s"])["label"]})
    return {"k": k, "link": link.describe(), "cases": results, "seconds": time.time() - t0,
            "tau": pooled_tau([c["rows"] for c in results]),
            "regret": max(c["regret"] for c in results),
            "plans": sum(len(c["rows"]) for c in results)}


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def report(runs: list[dict], args: argparse.Namespace, command: str) -> str:
    load = os.getloadavg()
    lines = ["# Planner validation: predicted vs measured step times", "",
             f"Command: `{command}`", "",
             f"Machine: {platform.node()}, {os.cpu_count()} cores, torch {torch.__version__}, "
             f"gloo on 127.0.0.1; {time.strftime('%Y-%m-%d %H:%M')}. Each rank runs one torch "
             "thread: **4 ranks share 2 cores**. The machine was shared with other engineers' "
             f"test runs (load average at the end {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}), "
             "so single times are noisy; each plan's time is the median of "
             f"{args.rounds} interleaved rounds x {args.steps} steps (after {args.warmup} "
             "warm-up steps per round) of a whole training step (forward, backward, gradient "
             "all-reduce, Adam), the slowest rank's. Peak memory per device is the largest "
             "rank's peak of live tensors in one more (profiled) step plus its parameters and "
             "Adam states (ngra.planner.measure); it is reported, not a target.", "",
             "Kendall tau pools every pair of plans of the same case; regret is the worst "
             "case's measured(pick) / measured(best) - 1, the pick being the planner's top "
             "plan among the candidates.", ""]
    for run in runs:
        lines += [f"## {run['k']} processes", "",
                  f"Kendall tau: {run['tau']:.2f}", f"regret: {run['regret'] * 100:.1f}%", "",
                  f"{run['plans']} candidate plans in {len(run['cases'])} cases; "
                  f"{run['seconds']:.0f} s with calibration.", "",
                  f"Calibration: {run['link']}", "",
                  "| case | plans | tau | pick | measured best | regret |",
                  "|---|---|---|---|---|---|"]
        for c in run["cases"]:
            lines.append(f"| {c['case']} | {len(c['rows'])} | {c['tau']:.2f} | {c['pick']} | "
                         f"{c['best']} | {c['regret'] * 100:.1f}% |")
        for c in run["cases"]:
            lines += ["", f"### {c['case']} ({run['k']} processes)", "",
                      "| plan | predicted ms | measured ms | predicted breakdown (ms) | "
                      "predicted / measured peak MB per device |",
                      "|---|---|---|---|---|"]
            for r in c["rows"]:
                parts = ", ".join(f"{k} {_ms(v)}" for k, v in r["breakdown"].items())
                lines.append(f"| {r['label']} | {_ms(r['predicted_s'])} | "
                             f"{_ms(r['measured_s'])} | {parts} | "
                             f"{r['predicted_peak_bytes'] / 2**20:.0f} / "
                             f"{r['measured_peak_bytes'] / 2**20:.0f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nprocs", default="2,4")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit", type=int, default=10, help="plans per case at most")
    ap.add_argument("--quick", action="store_true", help="fewer, smaller cases (a smoke run)")
    ap.add_argument("--out", default=str(RESULTS / "planner.md"))
    args = ap.parse_args(argv)
    command = " ".join(["python experiments/planner_validation.py", *(argv or sys.argv[1:])])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = []
    for k in args.nprocs.split(","):
        runs.append(validate(int(k), args))
        text = report(runs, args, command)  # after each process count: nothing is lost
        out.write_text(text + "\n")
        out.with_suffix(".json").write_text(json.dumps(runs, indent=1) + "\n")
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["processes", "case", "plan", "predicted_s", "measured_s", "times_s",
                    "predicted_peak_bytes", "measured_peak_bytes"])
        for one in runs:
            for c in one["cases"]:
                for r in c["rows"]:
                    w.writerow([one["k"], c["case"], r["label"], r["predicted_s"],
                                r["measured_s"], json.dumps(r["times_s"]),
                                r["predicted_peak_bytes"], r["measured_peak_bytes"]])
    print(text)


if __name__ == "__main__":
    main()
