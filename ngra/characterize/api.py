"""``characterize``: run the grid and write every output."""

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
from ngra.characterize.report import read_csv, result_rows, write_csv, write_report
from ngra.characterize.runner import CharacterizeConfig, run_grid

__all__ = ["characterize", "rebuild_outputs", "OUTPUTS"]

log = logging.getLogger(__name__)

OUTPUTS = ("runs.csv", "report.md", "stages.png", "roofline.png")


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
    (out / "config.json").write_text(
        json.dumps({"invocations": invocations + [resolved]}, indent=2) + "\n")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    load_or_measure(out, remeasure=cfg.remeasure_ceilings)
    kept = read_csv(out / "runs.csv") if cfg.append and (out / "runs.csv").exists() else []

    def save(results: list) -> None:  # after every group: a crash keeps what was measured
        rows = result_rows(results)
        done = {_key(r) for r in rows}
        write_csv([r for r in kept if _key(r) not in done] + rows, out / "runs.csv")

    save(run_grid(cfg, on_group=save))
    resolved["environment"]["loadavg_end"] = _loadavg()
    (out / "config.json").write_text(
        json.dumps({"invocations": invocations + [resolved]}, indent=2) + "\n")
    return rebuild_outputs(out)


def _loadavg() -> str:
    try:
        return " ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def _key(row: dict[str, Any]) -> tuple[str, str, str, str]:
    return row["framework"], row["model"], row["dataset"], row["mode"]


def _invocations(out: Path) -> list[dict[str, Any]]:
    path = out / "config.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return data.get("invocations", [data])


def rebuild_outputs(out: Path | str) -> dict[str, Path]:
    """Rewrite report.md, stages.png and roofline.png from ``out``'s runs.csv,
    ceilings.json and config.json."""
    out = Path(out)
    rows = read_csv(out / "runs.csv")
    ceilings = json.loads((out / "ceilings.json").read_text())
    invocations = _invocations(out)
    write_report(rows, out / "report.md", ceilings=ceilings, invocations=invocations)
    plot_stages(rows, out / "stages.png")
    plot_roofline(rows, ceilings, out / "roofline.png")
    return {name: out / name for name in OUTPUTS}
