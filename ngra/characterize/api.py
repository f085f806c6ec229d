"""``characterize``: run the grid and write every output.

A grid in which no run completed (every dataset missing, every framework not installed,
every run past its caps or failed) writes runs.csv and report.md, which list each run and
why, but no plots, and raises :class:`NoCompletedRunsError` (``ngra characterize`` exits
with status 2) naming what was missing. Runs skipped in a grid where others completed are
logged, listed in report.md and, by the CLI, at the end of its output.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ngra.characterize.ceilings import load_or_measure
from ngra.characterize.plots import plot_roofline, plot_stages
from ngra.characterize.report import read_csv, result_rows, unfinished, write_csv, write_report
from ngra.characterize.runner import CharacterizeConfig, run_grid
from ngra.diskspace import write_file

__all__ = ["characterize", "rebuild_outputs", "NoCompletedRunsError", "OUTPUTS"]

log = logging.getLogger(__name__)

OUTPUTS = ("runs.csv", "report.md", "stages.png", "roofline.png")


class NoCompletedRunsError(ValueError):
    """No run completed, so there is nothing to plot; the message says what each run
    lacked (a dataset not found and where it was looked for, a framework not installed)."""


def _nothing_completed(rows: list[dict[str, Any]], out: Path) -> NoCompletedRunsError:
    lines = unfinished(rows)
    missing = " ".join(lines)
    fixes = []
    if "dataset " in missing:
        fixes.append("point --data-root (default: $NGRA_DATA) at a folder holding the datasets, "
                     "or name others in --datasets")
    if "framework " in missing:
        fixes.append("install the missing frameworks or leave them out of --frameworks")
    if "timeout" in missing or "out of memory" in missing:
        fixes.append("raise --timeout / --memory-cap-gb or use smaller datasets")
    fix = ("Fix: " + "; ".join(fixes) + ". ") if fixes else ""
    n = sum(1 for r in rows if r["status"] != "ok")
    return NoCompletedRunsError(
        f"no run completed ({n} skipped or failed), so no plots were written:\n  "
        + "\n  ".join(lines) + f"\n{fix}{out / 'report.md'} lists every run.")


def _environment(cfg: CharacterizeConfig) -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                           "cpu_count": os.cpu_count(),
                           "threads": cfg.threads or torch.get_num_threads(),
                           "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE", "unset"),
                           "loadavg_start": _loadavg()}
    from importlib.metadata import PackageNotFoundError, version

    for name in ("torch_geometric", "dgl"):
        try:
            env[name] = version(name)
        except PackageNotFoundError:
            env[name] = "absent"
    return env


def characterize(cfg: CharacterizeConfig) -> dict[str, Path]:
    """Run ``cfg``'s grid; write runs.csv, report.md, stages.png, roofline.png
    (and ceilings.json, config.json) to ``cfg.out``. Returns the paths."""
    cfg.check()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    resolved = asdict(cfg)
    resolved["environment"] = _environment(cfg)
    log.info("ngra characterize config: %s", json.dumps(resolved, sort_keys=True))
    invocations = _invocations(out) if cfg.append else []
    _write_config(out, invocations + [resolved])
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    load_or_measure(out, remeasure=cfg.remeasure_ceilings)
    kept = read_csv(out / "runs.csv") if cfg.append and (out / "runs.csv").exists() else []

    def save(results: list) -> None:  # after every group: a crash keeps what was measured
        rows = result_rows(results)
        done = {_key(r) for r in rows}
        write_csv([r for r in kept if _key(r) not in done] + rows, out / "runs.csv")

    results = run_grid(cfg, on_group=save)
    save(results)
    resolved["environment"]["loadavg_end"] = _loadavg()
    _write_config(out, invocations + [resolved])
    mine = result_rows(results)
    if not any(r.status == "ok" for r in results):
        _write_report(out, read_csv(out / "runs.csv"))
        raise _nothing_completed(mine, out)
    for line in unfinished(mine):
        log.warning("did not complete: %s", line)
    return rebuild_outputs(out)


def _loadavg() -> str:
    try:
        return " ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def _key(row: dict[str, Any]) -> tuple[str, str, str, str]:
    return row["framework"], row["model"], row["dataset"], row["mode"]


def _write_config(out: Path, invocations: list[dict[str, Any]]) -> None:
    write_file(out / "config.json", json.dumps({"invocations": invocations}, indent=2) + "\n",
               "the characterization's configuration")


def _invocations(out: Path) -> list[dict[str, Any]]:
    path = out / "config.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return data.get("invocations", [data])


def rebuild_outputs(out: Path | str) -> dict[str, Path]:
    """Rewrite report.md, stages.png and roofline.png from ``out``'s runs.csv,
    ceilings.json and config.json; without a completed run, report.md only, and
    :class:`NoCompletedRunsError`."""
    out = Path(out)
    rows = read_csv(out / "runs.csv")
    ceilings = _write_report(out, rows)
    if not any(r["status"] == "ok" for r in rows):
        raise _nothing_completed(rows, out)
    plot_stages(rows, out / "stages.png")
    plot_roofline(rows, ceilings, out / "roofline.png")
    return {name: out / name for name in OUTPUTS}


def _write_report(out: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """report.md from ``rows`` and ``out``'s ceilings.json and config.json; the ceilings."""
    ceilings = json.loads((out / "ceilings.json").read_text())
    write_report(rows, out / "report.md", ceilings=ceilings, invocations=_invocations(out))
    return ceilings
