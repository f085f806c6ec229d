"""``ngra characterize`` end to end on a tiny grid: all four outputs, rows that add up."""

from __future__ import annotations

import json
import math

import pytest

from ngra.characterize.command import _datasets
from ngra.characterize.report import read_csv
from ngra.cli import main

CEILINGS = {"bandwidth": 20e9, "gather_bandwidth": 10e9, "flops": 100e9, "ridge": 5.0,
            "threads": 1, "method": "fixed for the test"}


def _have_pyg() -> bool:
    try:
        import torch_geometric  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("extra", [
    pytest.param(["--no-isolate"], id="in-process"),
    pytest.param([], id="worker-processes", marks=pytest.mark.slow),
])
def test_cli_writes_all_outputs(tmp_path, extra):
    out = tmp_path / "out"
    out.mkdir()
    (out / "ceilings.json").write_text(json.dumps(CEILINGS))  # skip measuring (seconds)
    frameworks = "ngra,pyg" if _have_pyg() else "ngra"
    rc = main(["characterize", "--models", "gcn,gat", "--datasets",
               "sbm:nodes=120,blocks=3,p_in=0.1,p_out=0.01,feat=8", "--frameworks", frameworks,
               "--mode", "inference,training", "--repeats", "1", "--warmup", "0",
               "--threads", "1", "--out", str(out), "--data-root", str(tmp_path / "data"),
               "--reuse-ceilings", "--no-progress", "--timeout", "120", *extra])
    assert rc == 0
    for name in ("runs.csv", "report.md", "stages.png", "roofline.png"):
        assert (out / name).stat().st_size > 0, name
    rows = read_csv(out / "runs.csv")
    runs = {(r["framework"], r["model"], r["mode"]) for r in rows}
    assert len(runs) == 2 * 2 * len(frameworks.split(","))
    assert all(r["status"] == "ok" for r in rows), [r["notes"] for r in rows if r["status"] != "ok"]
    for key in runs:
        mine = [r for r in rows if (r["framework"], r["model"], r["mode"]) == key]
        assert [r["stage"] for r in mine] == ["Scatter", "ApplyEdge", "Gather", "ApplyVertex",
                                             "remainder"]
        total = mine[0]["run_total_s"]
        assert sum(r["time_s"] for r in mine) == pytest.approx(total, rel=1e-4, abs=1e-6)
        assert mine[0]["peak_mb"] >= 0
        gather = mine[2]
        assert gather["flops"] > 0 and gather["bytes"] > 0
        assert math.isclose(gather["intensity"], gather["flops"] / gather["bytes"], rel_tol=1e-4)
    ngra_gather = [r for r in rows if r["framework"] == "ngra" and r["stage"] == "Gather"]
    assert all(r["fused"] == "yes" for r in ngra_gather)
    report = (out / "report.md").read_text()
    assert "## Findings (computed from runs.csv)" in report and "Dominant stage" in report
    # the report can be rebuilt from the CSV alone
    (out / "report.md").unlink()
    assert main(["characterize", "--out", str(out), "--report-only"]) == 0
    assert (out / "report.md").exists()


def test_dataset_list_parsing():
    assert _datasets("cora,citeseer,rmat:scale=18,edge_factor=16,feat=64") == [
        "cora", "citeseer", "rmat:scale=18,edge_factor=16,feat=64"]
    assert _datasets("pubmed:structure,twitter") == ["pubmed:structure", "twitter"]
    assert _datasets("sbm:nodes=10;cora") == ["sbm:nodes=10", "cora"]


def test_cli_rejects_unknown_names(tmp_path, capsys):
    rc = main(["characterize", "--models", "gcn,nope", "--out", str(tmp_path)])
    assert rc == 2
    assert "unknown model(s) ['nope']" in capsys.readouterr().err
