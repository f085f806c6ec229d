"""stages.png (stacked stage shares per run) and roofline.png, from runs.csv rows.

Both figures keep their titles and legends inside the figure (stages.png wraps its
title and spreads its legend over as many rows as its width needs; constrained layout
makes room for both) and are saved with ``bbox_inches="tight"``. The roofline plots
executed FLOPs and bytes (``exec_flops`` / ``exec_bytes``, see
:mod:`ngra.characterize.metrics`): a stage cannot execute faster than the measured
sgemm, while its analytic (useful) FLOP rate can exceed it where ngra skipped the
zeros of sparse input features. Rows of a runs.csv without those columns fall back to
the analytic counts, and the panel says so.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from ngra.characterize.report import executed, short_names  # noqa: E402
from ngra.characterize.stages import REMAINDER, STAGES  # noqa: E402
from ngra.diskspace import write_file  # noqa: E402

__all__ = ["plot_stages", "plot_roofline", "stages_figure", "roofline_figure"]

COLORS = {"Scatter": "#4C72B0", "ApplyEdge": "#DD8452", "Gather": "#55A868",
          "ApplyVertex": "#C44E52", REMAINDER: "#BBBBBB"}
FUSED_COLOR = "#1B5E20"
MARKERS = {"ngra": "o", "ngra-generic": "X", "pyg": "s", "dgl": "^"}
SHORT = {"ngra": "ngra", "ngra-generic": "gen", "pyg": "pyg", "dgl": "dgl"}
MODEL_ORDER = ("gcn", "gat", "sage", "gin", "ggnn", "rgcn")
FW_ORDER = ("ngra", "ngra-generic", "pyg", "dgl")
MODE_ORDER = ("inference", "training")


def _order(values: Any, preferred: tuple[str, ...]) -> list[str]:
    vals = list(dict.fromkeys(values))
    return [p for p in preferred if p in vals] + [v for v in vals if v not in preferred]


def _f(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _runs(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, dict]]:
    out: dict = defaultdict(dict)
    for r in rows:
        if r["status"] == "ok":
            out[(r["framework"], r["model"], r["dataset"], r["mode"])][r["stage"]] = r
    return out


def _save(fig: Figure, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    write_file(path, buf.getvalue(), "a plot")


def plot_stages(rows: list[dict[str, Any]], path: Path) -> None:
    """Write :func:`stages_figure` of ``rows`` to ``path``."""
    _save(stages_figure(rows), path)


def stages_figure(rows: list[dict[str, Any]]) -> Figure:
    """One panel per dataset x mode; per model a bar per framework, stacked by stage share,
    with the run's total time above it.

    Raises:
        ValueError: no row is of a completed run (there is nothing to plot).
    """
    runs = _runs(rows)
    if not runs:
        raise ValueError("no completed run to plot: every row of runs.csv is skipped or failed.")
    size: dict[str, float] = {}
    for k, st in runs.items():
        size[k[2]] = max(size.get(k[2], 0.0), _f(next(iter(st.values()))["num_edges"]))
    datasets = sorted(size, key=size.get)
    short = short_names(datasets)
    modes = _order((k[3] for k in runs), MODE_ORDER)
    models = _order((k[1] for k in runs), MODEL_ORDER)
    fws = _order((k[0] for k in runs), FW_ORDER)
    nb = len(fws)
    width = 0.8 / nb
    panel_w = max(6.0, 0.32 * len(models) * nb + 1.5)
    fig, axes = plt.subplots(len(datasets), len(modes), squeeze=False, layout="constrained",
                             figsize=(panel_w * len(modes), 3.4 * len(datasets) + 0.9))
    for i, d in enumerate(datasets):
        for j, mode in enumerate(modes):
            ax = axes[i][j]
            ticks, labels = [], []
            for mi, m in enumerate(models):
                for fi, fw in enumerate(fws):
                    x = mi + (fi - (nb - 1) / 2) * width
                    ticks.append(x)
                    labels.append(SHORT.get(fw, fw))
                    st = runs.get((fw, m, d, mode))
                    if st is None:
                        ax.text(x, 0.02, "n/a", rotation=90, ha="center", va="bottom",
                                fontsize=6, color="#888888")
                        continue
                    total = _f(st[STAGES[0]]["run_total_s"])
                    bottom = 0.0
                    for s in STAGES + (REMAINDER,):
                        share = max(_f(st[s]["share"]), 0.0) if s in st else 0.0
                        if math.isnan(share):
                            share = 0.0
                        fused = s == "Gather" and st[s].get("fused") == "yes"
                        ax.bar(x, share, width * 0.92, bottom=bottom,
                               color=FUSED_COLOR if fused else COLORS[s],
                               hatch="//" if s == REMAINDER else None, edgecolor="white",
                               linewidth=0.3)
                        bottom += share
                    ms = total * 1e3
                    txt = f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}"
                    ax.text(x, min(bottom, 1.0) + 0.02, txt, rotation=90, ha="center",
                            va="bottom", fontsize=6.5)
            ax.set_xticks(ticks)
            ax.set_xticklabels(labels, rotation=90, fontsize=6.5)
            for mi, m in enumerate(models):
                ax.text(mi, -0.17, m, ha="center", va="top", fontsize=9, fontweight="bold",
                        transform=ax.get_xaxis_transform())
            ax.set_xlim(-0.55, len(models) - 0.45)
            ax.set_ylim(0, 1.32)
            ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
            ax.set_yticklabels(["0", "25%", "50%", "75%", "100%"], fontsize=7)
            ax.set_title(f"{short[d]} ({int(size[d]):,} edges) — {mode}", fontsize=10)
            ax.grid(axis="y", alpha=0.3)
            if j == 0:
                ax.set_ylabel("share of run time", fontsize=8)
    handles = [Patch(color=COLORS[s], label=s) for s in STAGES]
    handles.insert(3, Patch(color=FUSED_COLOR, label="Gather (fused)"))
    handles.append(Patch(facecolor=COLORS[REMAINDER], hatch="//", edgecolor="white",
                         label="remainder"))
    fig_w = fig.get_figwidth()
    # ~1.6 in per legend entry at 9 pt, ~0.09 in per title character at 11 pt: as many
    # legend columns and title characters per line as the figure's width holds
    fig.legend(handles=handles, loc="outside lower center", frameon=False, fontsize=9,
               ncol=max(1, min(len(handles), int(fig_w / 1.6))))
    title = ("Share of run time per SAGA stage (numbers above bars: run total in ms; "
             "ngra = compiled, gen = ngra generic executor)")
    fig.suptitle(textwrap.fill(title, width=max(30, int(fig_w / 0.09))), fontsize=11)
    fig.get_layout_engine().set(h_pad=0.12, hspace=0.06)
    return fig


def plot_roofline(rows: list[dict[str, Any]], ceilings: dict[str, Any], path: Path) -> None:
    """Write :func:`roofline_figure` of ``rows`` to ``path``."""
    _save(roofline_figure(rows, ceilings), path)


def roofline_figure(rows: list[dict[str, Any]], ceilings: dict[str, Any]) -> Figure:
    """Roofline panels (one per mode) of every stage with FLOPs, and a bandwidth panel
    for every stage (zero-FLOP Scatters included) against the measured bandwidths; each
    point is a stage's executed FLOPs and bytes over its measured time."""
    ok = [r for r in rows if r["status"] == "ok" and r["stage"] in STAGES and _f(r["time_s"]) > 0]
    work = {id(r): executed(r) for r in ok}
    analytic_only = any(not w[2] for w in work.values())
    modes = _order((r["mode"] for r in ok), MODE_ORDER) or ["inference"]
    peak, bw, gbw = ceilings["flops"], ceilings["bandwidth"], ceilings["gather_bandwidth"]
    fig, axes = plt.subplots(1, len(modes) + 1, figsize=(6.2 * (len(modes) + 1), 5.4),
                             squeeze=False)
    axes = axes[0]
    for ax, mode in zip(axes, modes):
        pts = [r for r in ok if r["mode"] == mode and work[id(r)][0] > 0 and work[id(r)][1] > 0]
        xs = [work[id(r)][0] / work[id(r)][1] for r in pts]
        lo = min(xs + [0.05]) / 3
        hi = max(xs + [peak / bw * 10]) * 3
        grid = [lo * (hi / lo) ** (k / 200) for k in range(201)]
        ax.plot(grid, [min(peak, bw * x) for x in grid], color="black", lw=1.5,
                label=f"roof: {bw / 1e9:.1f} GB/s copy, {peak / 1e9:.0f} GFLOP/s sgemm")
        ax.plot(grid, [min(peak, gbw * x) for x in grid], color="black", lw=1, ls="--",
                label=f"random-row gather {gbw / 1e9:.1f} GB/s")
        for r in pts:
            fused = r["stage"] == "Gather" and r.get("fused") == "yes"
            flops, bytes_, _ = work[id(r)]
            ax.scatter(flops / bytes_, flops / _f(r["time_s"]), s=26,
                       marker=MARKERS.get(r["framework"], "D"),
                       facecolors="none" if fused else COLORS[r["stage"]],
                       edgecolors=FUSED_COLOR if fused else COLORS[r["stage"]],
                       linewidths=1.2, alpha=0.85)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (executed FLOP / byte)")
        ax.set_ylabel("achieved FLOP/s (executed FLOPs / measured time)")
        ax.set_title(f"Roofline — {mode}")
        if analytic_only:
            ax.text(0.02, 0.98, "runs.csv without exec_flops: analytic FLOPs of the unfused\n"
                    "dense program, which can exceed the roof where ngra skipped zeros",
                    transform=ax.transAxes, va="top", fontsize=7, color="#A00000")
        ax.grid(which="both", alpha=0.25)
        ax.legend(fontsize=7, loc="lower right")
    ax = axes[-1]
    for si, s in enumerate(STAGES):
        pts = [r for r in ok if r["stage"] == s and work[id(r)][1] > 0]
        fws = _order((r["framework"] for r in pts), FW_ORDER)
        for r in pts:
            fi = fws.index(r["framework"])
            x = si + (fi - (len(fws) - 1) / 2) * 0.18 + (0.04 if r["mode"] == "training" else -0.04)
            fused = s == "Gather" and r.get("fused") == "yes"
            ax.scatter(x, work[id(r)][1] / _f(r["time_s"]), s=22,
                       marker=MARKERS.get(r["framework"], "D"),
                       facecolors="none" if fused else COLORS[s],
                       edgecolors=FUSED_COLOR if fused else COLORS[s], linewidths=1.1, alpha=0.85)
    ax.axhline(bw, color="black", lw=1.5)
    ax.axhline(gbw, color="black", lw=1, ls="--")
    ax.text(len(STAGES) - 0.5, bw, " copy", va="bottom", ha="right", fontsize=8)
    ax.text(len(STAGES) - 0.5, gbw, " gather", va="bottom", ha="right", fontsize=8)
    ax.set_xticks(range(len(STAGES)))
    ax.set_xticklabels(STAGES)
    ax.set_xlim(-0.5, len(STAGES) - 0.5)
    ax.set_yscale("log")
    ax.set_ylabel("achieved bandwidth (executed bytes / measured time, B/s)")
    ax.set_title("Bandwidth per stage (all modes)")
    ax.grid(which="both", axis="y", alpha=0.25)
    fws_all = _order((r["framework"] for r in ok), FW_ORDER)
    handles = [Line2D([], [], marker=MARKERS.get(fw, "D"), ls="", color="#444444", label=fw)
               for fw in fws_all]
    handles += [Patch(color=COLORS[s], label=s) for s in STAGES]
    handles.append(Line2D([], [], marker="o", ls="", markerfacecolor="none",
                          markeredgecolor=FUSED_COLOR, label="Gather (fused)"))
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig
