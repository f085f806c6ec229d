"""runs.csv rows, and report.md with findings computed from them.

:func:`result_rows` turns run results into one row per framework x model x
dataset x mode x stage (the four SAGA stages and ``remainder``), with the
analytic FLOPs/bytes of :mod:`ngra.characterize.metrics` and the rates they
imply ("useful" work, the same for every framework), and the FLOPs/bytes the run
executed (``exec_flops``, ``exec_bytes``: they differ where ngra multiplied sparse
input features as a sparse matrix), which the roofline plots. Skipped and failed
runs get one row (stage ``-``) with the reason; :func:`unfinished` lists them.
:func:`write_report` reads nothing but those rows and the ceilings, so a
report can be rebuilt from a ``runs.csv`` (:func:`read_csv`).
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ngra.characterize.measure import RunResult
from ngra.characterize.metrics import LayerDims, model_counts
from ngra.characterize.stages import REMAINDER, STAGES
from ngra.diskspace import write_file

__all__ = ["COLUMNS", "result_rows", "write_csv", "read_csv", "write_report", "findings",
           "unfinished", "executed"]

COLUMNS = [
    "framework", "model", "dataset", "mode", "stage", "fused", "status", "time_s", "fwd_s",
    "bwd_s", "share", "flops", "bytes", "intensity", "flop_rate", "bandwidth", "peak_mb",
    "run_total_s", "run_plain_s", "repeats", "num_nodes", "num_edges", "exec_flops", "exec_bytes",
    "notes",
]
MODEL_ORDER = ("gcn", "gat", "sage", "gin", "ggnn", "rgcn")
FW_ORDER = ("ngra", "ngra-generic", "pyg", "dgl")
NUMERIC = {"time_s", "fwd_s", "bwd_s", "share", "flops", "bytes", "intensity", "flop_rate",
           "bandwidth", "peak_mb", "run_total_s", "run_plain_s", "repeats", "num_nodes",
           "num_edges", "exec_flops", "exec_bytes"}


def _div(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) and b > 0 else float("nan")


def result_rows(results: Iterable[RunResult]) -> list[dict[str, Any]]:
    """Rows of ``runs.csv`` for ``results`` (see the module docstring)."""
    rows: list[dict[str, Any]] = []
    for r in results:
        base = {"framework": r.framework, "model": r.model, "dataset": r.dataset, "mode": r.mode,
                "status": r.status, "num_nodes": r.num_nodes, "num_edges": r.num_edges}
        if r.status != "ok":
            rows.append({**base, "stage": "-", "notes": r.reason})
            continue
        layers = [LayerDims(**d) for d in r.layers]
        fused_all = bool(r.fused) and all(r.fused)
        fused = list(r.fused) if r.fused else False
        training = r.mode == "training"
        counts = model_counts(layers, r.num_nodes, r.num_edges, training=training, fused=fused)
        ran = model_counts(layers, r.num_nodes, r.num_edges, training=training, fused=fused,
                           input_nnz=r.input_nnz)
        common = {**base, "peak_mb": r.peak_mb, "run_total_s": r.total_s,
                  "run_plain_s": r.plain_s, "repeats": r.repeats,
                  "notes": "; ".join(r.notes + ([r.peak_note] if r.peak_note else []))}
        for s in STAGES:
            t = r.stage_s[s]
            c = counts[s]
            rows.append({**common, "stage": s,
                         "fused": "yes" if (s == "Gather" and fused_all) else
                                  ("partial" if s == "Gather" and any(r.fused) else ""),
                         "time_s": t, "fwd_s": r.fwd.get(s, 0.0), "bwd_s": r.bwd.get(s, 0.0),
                         "share": _div(t, r.total_s), "flops": c.flops, "bytes": c.bytes,
                         "intensity": _div(c.flops, c.bytes),
                         "flop_rate": _div(c.flops, t) if c.flops else float("nan"),
                         "bandwidth": _div(c.bytes, t) if c.bytes else float("nan"),
                         "exec_flops": ran[s].flops, "exec_bytes": ran[s].bytes})
        rem = r.remainder_s
        fwd_rem = r.fwd_total_s - sum(r.fwd.values())
        rows.append({**common, "stage": REMAINDER, "fused": "", "time_s": rem,
                     "fwd_s": fwd_rem, "bwd_s": rem - fwd_rem, "share": _div(rem, r.total_s)})
    return rows


def _fmt_csv(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return "" if v is None else v


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=COLUMNS)
    w.writeheader()
    for row in rows:
        w.writerow({k: _fmt_csv(row.get(k)) for k in COLUMNS})
    write_file(path, text.getvalue(), "the characterization table")


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a ``runs.csv``, numbers parsed (blank -> NaN)."""
    out = []
    with Path(path).open(newline="") as fh:
        for row in csv.DictReader(fh):
            for k in NUMERIC:
                v = row.get(k, "")
                row[k] = float(v) if v not in ("", None) else float("nan")
            out.append(row)
    return out


# ------------------------------------------------------------------ analysis
Key = tuple[str, str, str, str]   # framework, model, dataset, mode


def _runs(rows: list[dict[str, Any]]) -> dict[Key, dict[str, dict[str, Any]]]:
    """``{(framework, model, dataset, mode): {stage: row}}`` of runs that completed."""
    out: dict[Key, dict[str, dict[str, Any]]] = defaultdict(dict)
    for row in rows:
        if row["status"] == "ok":
            out[(row["framework"], row["model"], row["dataset"], row["mode"])][row["stage"]] = row
    return out


def _total(stages: dict[str, dict[str, Any]]) -> float:
    return float(next(iter(stages.values()))["run_total_s"])


def _plain(stages: dict[str, dict[str, Any]]) -> float:
    v = float(next(iter(stages.values()))["run_plain_s"])
    return v if not math.isnan(v) else _total(stages)


def executed(row: dict[str, Any]) -> tuple[float, float, bool]:
    """``(flops, bytes, known)``: what a stage row's run executed; a ``runs.csv`` written
    before ``exec_flops`` existed gives the analytic counts with ``known=False``."""
    f, b = _f(row.get("exec_flops")), _f(row.get("exec_bytes"))
    if math.isnan(f) or math.isnan(b):
        return _f(row.get("flops")), _f(row.get("bytes")), False
    return f, b, True


def unfinished(rows: list[dict[str, Any]]) -> list[str]:
    """One line per reason runs did not complete, naming them
    (``"skipped: <reason> -- ngra/gcn/cora/inference, ..."``); empty when all did."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        if r["status"] != "ok":
            why = str(r.get("notes") or "").strip() or "no reason recorded"
            by_reason[f"{r['status']}: {why}"].append(
                f"{r['framework']}/{r['model']}/{r['dataset']}/{r['mode']}")
    return [f"{why} -- {len(runs)} run(s): {', '.join(runs)}" for why, runs in by_reason.items()]


def _dominant(stages: dict[str, dict[str, Any]]) -> tuple[str, float]:
    s = max(STAGES, key=lambda k: stages[k]["time_s"])
    return s, float(stages[s]["share"])


def _label(stage: str, stages: dict[str, dict[str, Any]]) -> str:
    fused = stage == "Gather" and stages["Gather"].get("fused") == "yes"
    return "Gather (fused)" if fused else stage


def _order(values: Iterable[str], preferred: Iterable[str]) -> list[str]:
    vals = list(dict.fromkeys(values))
    pref = [p for p in preferred if p in vals]
    return pref + [v for v in vals if v not in pref]


def _ms(s: float) -> str:
    if math.isnan(s):
        return "-"
    return f"{s * 1e3:.1f}" if s < 10 else f"{s * 1e3:.0f}"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.0f}%"


def findings(rows: list[dict[str, Any]], ceilings: dict[str, Any] | None = None) -> list[str]:
    """Findings computed from the rows: one markdown bullet (or paragraph) each."""
    runs = _runs(rows)
    out: list[str] = []
    if not runs:
        return ["No run completed; see the skipped/failed table."]
    models = _order((k[1] for k in runs), MODEL_ORDER)
    modes = _order((k[3] for k in runs), ("inference", "training"))

    # 1. dominant stage per model (over frameworks and datasets)
    for mode in modes:
        parts = []
        for m in models:
            doms = Counter(_dominant(st)[0] for k, st in runs.items() if k[1] == m and k[3] == mode)
            if not doms:
                continue
            stage, n = doms.most_common(1)[0]
            shares = [float(st[stage]["share"]) for k, st in runs.items()
                      if k[1] == m and k[3] == mode and _dominant(st)[0] == stage]
            parts.append(f"{m}: {stage} in {n}/{sum(doms.values())} runs "
                         f"(median share {_pct(statistics.median(shares))})")
        if parts:
            out.append(f"**Dominant stage, {mode}** (most common over frameworks and datasets): "
                       + "; ".join(parts) + ".")

    # 2. dominant stage shifts with the dataset (smallest -> largest graph)
    short = short_names(k[2] for k in runs)
    size = {k[2]: float(next(iter(st.values()))["num_edges"]) for k, st in runs.items()}
    shifts, steady = [], 0
    for (fw, m, mode) in sorted({(k[0], k[1], k[3]) for k in runs},
                                key=lambda t: (_rank(t[1], MODEL_ORDER), _rank(t[0], FW_ORDER))):
        per_ds = {k[2]: _dominant(st) for k, st in runs.items()
                  if (k[0], k[1], k[3]) == (fw, m, mode)}
        if len(per_ds) < 2:
            continue
        if len({s for s, _ in per_ds.values()}) == 1:
            steady += 1
            continue
        small, large = min(per_ds, key=size.get), max(per_ds, key=size.get)
        (s0, sh0), (s1, sh1) = per_ds[small], per_ds[large]
        move = (f"{s0} {_pct(sh0)} on {short[small]} -> {s1} {_pct(sh1)} on {short[large]}"
                if s0 != s1 else f"{s0} on the smallest and largest, other stages in between")
        shifts.append(f"{m}/{fw}/{mode}: {move}")
    if shifts:
        out.append(f"**The dominant stage shifts with the dataset** in {len(shifts)} of "
                   f"{len(shifts) + steady} model/framework/mode series (smallest -> largest "
                   "graph by edges): " + "; ".join(shifts) + ".")
    elif steady:
        out.append(f"The dominant stage is the same on every dataset in all {steady} "
                   "model/framework/mode series measured on several datasets.")

    # 3. fusion: ngra (compiled) vs ngra-generic
    pairs = []
    for k, st in runs.items():
        if k[0] != "ngra":
            continue
        g = runs.get(("ngra-generic",) + k[1:])
        if g is None:
            continue
        edge_f = sum(st[s]["time_s"] for s in ("Scatter", "ApplyEdge", "Gather"))
        edge_g = sum(g[s]["time_s"] for s in ("Scatter", "ApplyEdge", "Gather"))
        pairs.append((k, _plain(g) / _plain(st), _div(edge_g, edge_f),
                      _div(float(g["Gather"]["peak_mb"]), float(st["Gather"]["peak_mb"])),
                      st["Gather"].get("fused") == "yes"))
    if pairs:
        by_model = defaultdict(list)
        for k, sp, esp, mem, fused in pairs:
            by_model[k[1]].append((sp, esp, mem, k[2], k[3], fused))
        parts = []
        for m in _order(by_model, models):
            v = by_model[m]
            best = max(v, key=lambda t: t[0])
            edge = [t[1] for t in v if not math.isnan(t[1])]
            edge_txt = f"x{statistics.median(edge):.1f}" if edge else "-"
            parts.append(f"{m}: total x{statistics.median(t[0] for t in v):.2f} median "
                         f"(max x{best[0]:.1f} on {short[best[3]]} {best[4]}), "
                         f"Scatter+ApplyEdge+Gather {edge_txt}")
        faster = sum(1 for p in pairs if p[1] > 1)
        out.append("**Fusion** (ngra compiled vs `ngra-generic`, the same model on the generic "
                   "UDF executor; speedup = generic time / compiled time): compiled is faster in "
                   f"{faster} of {len(pairs)} pairs. " + "; ".join(parts) + ".")
        big = [p for p in pairs if p[1] >= 10]
        if big:
            out.append(f"Fusion gains an order of magnitude or more in {len(big)} of {len(pairs)} "
                       "pairs: " + ", ".join(f"{k[1]} on {short[k[2]]} {k[3]} x{sp:.0f}"
                                             for k, sp, *_ in sorted(big, key=lambda p: -p[1])[:8])
                       + ".")
        mems = [p[3] for p in pairs if not math.isnan(p[3])]
        if mems:
            med = statistics.median(mems)
            why = (": it materializes per-edge tensors that fused kernels never write"
                   if med > 1.2 else "")
            out.append(f"Peak memory of the generic executor is x{med:.1f} the compiled "
                       f"plan's (median over pairs; max x{max(mems):.1f}){why}.")

    # 4. fastest framework
    groups = defaultdict(dict)
    for k, st in runs.items():
        if k[0] == "ngra-generic":
            continue
        groups[(k[1], k[2], k[3])][k[0]] = _plain(st)
    wins = Counter()
    ratios = defaultdict(list)
    for g, fws in groups.items():
        if len(fws) < 2:
            continue
        best = min(fws, key=fws.get)
        wins[best] += 1
        for fw, t in fws.items():
            ratios[fw].append(t / fws[best])
    if wins:
        total = sum(wins.values())
        desc = ", ".join(f"{fw} {n}/{total}" for fw, n in wins.most_common())
        slow = ", ".join(f"{fw} x{statistics.median(v):.2f}" for fw, v in sorted(ratios.items()))
        out.append(f"**Fastest framework** (uninstrumented total per model/dataset/mode): {desc}. "
                   f"Median time relative to the fastest: {slow}.")

    # 5. roofline position
    if ceilings:
        ridge = ceilings["flops"] / ceilings["bandwidth"]
        parts = []
        for s in STAGES:
            pts = [r for r in rows if r["status"] == "ok" and r["stage"] == s
                   and _f(r["time_s"]) > 0 and _f(r["bytes"]) > 0]
            if not pts:
                continue
            inten = statistics.median(_f(r["intensity"]) for r in pts)
            if inten < ridge:
                bw = statistics.median(_f(r["bandwidth"]) for r in pts)
                parts.append(f"{s}: intensity {inten:.2f} FLOP/B (memory-bound side), "
                             f"{bw / 1e9:.2f} GB/s = {_pct(bw / ceilings['bandwidth'])} of copy "
                             "bandwidth")
            else:
                fl = statistics.median(executed(r)[0] / _f(r["time_s"]) for r in pts)
                parts.append(f"{s}: intensity {inten:.1f} FLOP/B (compute-bound side), "
                             f"{fl / 1e9:.2f} executed GFLOP/s = {_pct(fl / ceilings['flops'])} "
                             "of sgemm")
        out.append(f"**Roofline** (medians over runs; ridge point {ridge:.1f} FLOP/B = "
                   f"{ceilings['flops'] / 1e9:.1f} GFLOP/s / "
                   f"{ceilings['bandwidth'] / 1e9:.1f} GB/s): " + "; ".join(parts) + ".")

    # 6. backward share of training
    bwd = defaultdict(list)
    for k, st in runs.items():
        if k[3] == "training":
            back = sum(_f(st[s]["bwd_s"]) for s in STAGES + (REMAINDER,))
            bwd[k[0]].append(_div(back, _total(st)))
    if bwd:
        shares = ", ".join(f"{fw} {_pct(statistics.median(v))}" for fw, v in sorted(bwd.items()))
        out.append(f"**Backward share of a training iteration** (median): {shares}.")

    # 7. remainder and instrumentation overhead
    rem = defaultdict(list)
    over = defaultdict(list)
    for k, st in runs.items():
        rem[k[0]].append(float(st[REMAINDER]["share"]))
        p = float(next(iter(st.values()))["run_plain_s"])
        if not math.isnan(p) and p > 0:
            over[k[0]].append(_total(st) / p)
    out.append("**Unattributed remainder** (median share of the run): "
               + ", ".join(f"{fw} {_pct(statistics.median(v))}" for fw, v in sorted(rem.items()))
               + ". Instrumented / plain time (median): "
               + ", ".join(f"{fw} x{statistics.median(v):.2f}" for fw, v in sorted(over.items()))
               + ".")
    return out


def short_names(specs: Iterable[str]) -> dict[str, str]:
    """Short labels for dataset specs: the name before ``:`` (``rmat:scale=18,...`` ->
    ``rmat-18``), the full spec where two would collide."""
    specs = list(dict.fromkeys(specs))
    out = {}
    for spec in specs:
        name, _, rest = spec.partition(":")
        params = dict(p.split("=", 1) for p in rest.split(",") if "=" in p)
        out[spec] = f"{name}-{params['scale']}" if "scale" in params else name
    counts = Counter(out.values())
    return {s: (v if counts[v] == 1 else s) for s, v in out.items()}


def _f(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


# ------------------------------------------------------------------ markdown
def write_report(rows: list[dict[str, Any]], path: Path, *, ceilings: dict[str, Any] | None = None,
                 invocations: list[dict[str, Any]] | None = None,
                 extra: list[str] | None = None) -> None:
    """Write ``report.md``: setup, findings, stage tables, skips."""
    runs = _runs(rows)
    lines = ["# GNN workload characterization", ""]
    for i, inv in enumerate(invocations or []):
        title = "## Setup" if len(invocations) == 1 else f"## Setup, invocation {i + 1}"
        lines += [title, ""]
        env = inv.get("environment", {})
        lines += [f"- {k}: `{v}`" for k, v in inv.items() if k not in ("environment", "progress")]
        if env:
            lines.append("- environment: " + ", ".join(f"{k} `{v}`" for k, v in env.items()))
        lines.append("")
    if ceilings:
        lines += ["## Machine ceilings", "",
                  f"- copy bandwidth: {ceilings['bandwidth'] / 1e9:.2f} GB/s",
                  f"- random-row gather bandwidth: {ceilings['gather_bandwidth'] / 1e9:.2f} GB/s",
                  f"- sgemm: {ceilings['flops'] / 1e9:.1f} GFLOP/s "
                  f"({ceilings.get('threads', '?')} threads)",
                  f"- method: {ceilings.get('method', '')}", ""]
    short = short_names(r["dataset"] for r in rows)
    order = _datasets_by_size(rows)
    if order:
        lines += ["## Datasets", "",
                  "| label | spec | vertices | edges (after each model's preparation) |",
                  "|---|---|---:|---|"]
        for d in order:
            mine = [r for r in rows if r["dataset"] == d and r["status"] == "ok"]
            n = max(int(_f(r["num_nodes"])) for r in mine)
            es = sorted({int(_f(r["num_edges"])) for r in mine})
            e_txt = f"{es[0]:,}" if len(es) == 1 else f"{es[0]:,} - {es[-1]:,}"
            lines.append(f"| {short[d]} | `{d}` | {n:,} | {e_txt} |")
        lines.append("")
    lines += ["## Findings (computed from runs.csv)", ""]
    lines += [f"- {f}" for f in findings(rows, ceilings)]
    lines.append("")
    lines += ["## How to read this", "",
              "- Stage times are from the instrumented iteration with the median total; "
              "`remainder` = that total minus the four stages (framework overhead, ops outside "
              "GNN layers, profiler overhead). `plain` is the median uninstrumented time "
              "(`-` where it was not measured; comparisons then use the instrumented total).",
              "- ngra: runtime probes (backward split by autograd markers). PyG/DGL: "
              "`torch.profiler`, operators mapped to stages as documented in "
              "`ngra/characterize/stages.py`.",
              "- \"Gather (fused)\": one kernel did Scatter + ApplyEdge + Gather (g-SpMM, "
              "softmax aggregation); its FLOPs/bytes are those of the fused pass.",
              "- FLOPs and bytes are analytic (`ngra/characterize/metrics.py`), the same for every "
              "framework: `GFLOP/s` and `GB/s` are useful work per second. Bytes ignore caches: "
              "stages of graphs that fit in the last-level cache (Cora, CiteSeer) can land above "
              "the measured DRAM roof.",
              "- *Executed* FLOPs and bytes (`exec_flops`, `exec_bytes`; roofline.png, the "
              "roofline finding, `exec GFLOP/s`) are the work the run did. They differ from the "
              "analytic ones where ngra multiplied mostly-zero input features as a sparse matrix "
              "(`ngra/kernels/sparse_input.py`): its first-layer transform then does `2 nnz k` "
              "FLOPs, not the dense `2 N F k`, so useful FLOP/s of that stage can exceed the "
              "sgemm roof while executed FLOP/s cannot.", ""]
    if extra:
        lines += extra + [""]
    for mode in _order((k[3] for k in runs), ("inference", "training")):
        lines += [f"## Stage times, {mode} (ms; share of the run)", ""]
        head = ("| dataset | model | framework | total | plain | Scatter | ApplyEdge | Gather | "
                "ApplyVertex | remainder | dominant | peak MB |")
        lines += [head, "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
        keys = sorted((k for k in runs if k[3] == mode),
                      key=lambda k: (_rank(k[2], tuple(order)), _rank(k[1], MODEL_ORDER),
                                     _rank(k[0], FW_ORDER)))
        for k in keys:
            st = runs[k]
            cells = []
            for s in STAGES + (REMAINDER,):
                cells.append(f"{_ms(float(st[s]['time_s']))} ({_pct(float(st[s]['share']))})")
            dom, share = _dominant(st)
            lines.append(f"| {short[k[2]]} | {k[1]} | {k[0]} | {_ms(_total(st))} | "
                         f"{_ms(float(st['Scatter']['run_plain_s']))} | " + " | ".join(cells)
                         + f" | {_label(dom, st)} | {float(st['Scatter']['peak_mb']):.0f} |")
        lines.append("")
        lines += _dominance_table(runs, mode, order, short)
    lines += _rate_table(rows)
    bad = [r for r in rows if r["status"] != "ok"]
    lines += ["## Skipped and failed runs", ""]
    if bad:
        lines += ["| framework | model | dataset | mode | status | reason |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['framework']} | {r['model']} | {r['dataset']} | {r['mode']} | "
                  f"{r['status']} | {str(r.get('notes', '')).replace('|', '/')} |" for r in bad]
    else:
        lines.append("None.")
    lines.append("")
    write_file(path, "\n".join(lines) + "\n", "the characterization report")


def _rank(v: str, order: tuple[str, ...]) -> int:
    return order.index(v) if v in order else len(order)


def _datasets_by_size(rows: list[dict[str, Any]]) -> list[str]:
    """Datasets of completed runs, smallest graph (edges) first."""
    size: dict[str, float] = {}
    for r in rows:
        if r["status"] == "ok":
            size[r["dataset"]] = max(size.get(r["dataset"], 0.0), _f(r["num_edges"]))
    return sorted(size, key=size.get)


def _dominance_table(runs: dict[Key, dict[str, dict[str, Any]]], mode: str, order: list[str],
                     short: dict[str, str]) -> list[str]:
    present = {k[2] for k in runs if k[3] == mode}
    datasets = [d for d in order if d in present]
    series = sorted({(k[1], k[0]) for k in runs if k[3] == mode},
                    key=lambda t: (_rank(t[0], MODEL_ORDER), _rank(t[1], FW_ORDER)))
    if not series:
        return []
    lines = [f"### Dominant stage by dataset, {mode}", "",
             "| model | framework | " + " | ".join(short[d] for d in datasets) + " |",
             "|---|---|" + "---|" * len(datasets)]
    for m, fw in series:
        cells = []
        for d in datasets:
            st = runs.get((fw, m, d, mode))
            if st is None:
                cells.append("-")
            else:
                s, sh = _dominant(st)
                cells.append(f"{_label(s, st)} {_pct(sh)}")
        lines.append(f"| {m} | {fw} | " + " | ".join(cells) + " |")
    return lines + [""]


def _rate_table(rows: list[dict[str, Any]]) -> list[str]:
    """Median intensity / achieved rates per framework and stage."""
    groups = defaultdict(list)
    for r in rows:
        if r["status"] == "ok" and r["stage"] in STAGES and _f(r["time_s"]) > 0:
            groups[(r["framework"], r["stage"])].append(r)
    if not groups:
        return []
    lines = ["## Achieved rates per stage (median over runs)", "",
             "Analytic (useful) counts per second; `exec GFLOP/s`: executed FLOPs per second "
             "(see How to read this).", "",
             "| framework | stage | intensity (FLOP/B) | GFLOP/s | exec GFLOP/s | GB/s | runs |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for (fw, s) in sorted(groups, key=lambda t: (_rank(t[0], FW_ORDER), STAGES.index(t[1]))):
        rs = groups[(fw, s)]

        def med(key: str) -> float:
            vals = [_f(r[key]) for r in rs if not math.isnan(_f(r[key]))]
            return statistics.median(vals) if vals else float("nan")

        ran = [executed(r)[0] / _f(r["time_s"]) for r in rs if executed(r)[0] > 0]
        exec_rate = statistics.median(ran) if ran else float("nan")
        lines.append(f"| {fw} | {s} | {med('intensity'):.2f} | {med('flop_rate') / 1e9:.2f} | "
                     f"{exec_rate / 1e9:.2f} | {med('bandwidth') / 1e9:.2f} | {len(rs)} |")
    return lines + [""]
