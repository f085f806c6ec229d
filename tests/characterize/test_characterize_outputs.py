"""What ``ngra characterize`` writes and how it ends: no data reachable is an error (exit 2,
no plots), skipped runs are listed; titles and legends lie inside the figures; the
roofline plots the FLOPs a run executed (ngra's sparse input products included)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ngra.characterize.measure import RunResult, run_workload
from ngra.characterize.metrics import LayerDims, input_linears, layer_dims, model_counts
from ngra.characterize.plots import roofline_figure, stages_figure
from ngra.characterize.report import read_csv, result_rows, unfinished, write_csv
from ngra.characterize.stages import STAGES
from ngra.characterize.workloads import prepare_workload
from ngra.graph import Graph
from ngra.kernels import sparse_input

ROOT = Path(__file__).resolve().parents[2]
CEILINGS = {"bandwidth": 20e9, "gather_bandwidth": 10e9, "flops": 100e9, "ridge": 5.0,
            "threads": 1, "method": "fixed for the test"}
SBM = "sbm:nodes=120,blocks=3,p_in=0.1,p_out=0.01,feat=8"


def _characterize(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
                  timeout: float = 240) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "ceilings.json").write_text(json.dumps(CEILINGS))  # skip measuring (seconds)
    cmd = [sys.executable, "-m", "ngra", "characterize", "--out", str(out), "--models", "gcn",
           "--mode", "inference", "--repeats", "1", "--warmup", "0", "--threads", "1",
           "--reuse-ceilings", "--no-progress", "--timeout", "120", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})
    return proc, out


def _no_dgl(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import dgl`` fails, as where DGL is not installed."""
    fake = tmp_path / "fake" / "dgl"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'dgl'\")\n")
    path = os.pathsep.join(p for p in (str(fake.parent), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path}


# ---------------------------------------------------------------- nothing reachable
@pytest.mark.parametrize("isolate", [pytest.param(["--no-isolate"], id="in-process"),
                                     pytest.param([], id="worker-processes")])
def test_no_reachable_dataset_exits_2_and_writes_no_plots(tmp_path, isolate):
    # a data root below a plain file: nothing there, nothing can be downloaded into it
    (tmp_path / "afile").write_text("")
    root = tmp_path / "afile" / "data"
    proc, out = _characterize(tmp_path, "--datasets", "cora", "--data-root", str(root),
                              "--frameworks", "ngra", *isolate)
    assert proc.returncode == 2, proc.stderr
    assert "no run completed" in proc.stderr
    assert "dataset 'cora' unavailable" in proc.stderr and str(root) in proc.stderr
    assert "--data-root" in proc.stderr
    assert not (out / "stages.png").exists() and not (out / "roofline.png").exists()
    rows = read_csv(out / "runs.csv")
    assert [r["status"] for r in rows] == ["skipped"]
    assert "Skipped and failed runs" in (out / "report.md").read_text()
    # rebuilding from that runs.csv is the same error
    rebuilt = subprocess.run([sys.executable, "-m", "ngra", "characterize", "--out", str(out),
                              "--report-only"], capture_output=True, text=True, timeout=120,
                             cwd=ROOT)
    assert rebuilt.returncode == 2 and "no run completed" in rebuilt.stderr
    assert not (out / "stages.png").exists()


def test_missing_framework_exits_2_naming_it(tmp_path):
    proc, out = _characterize(tmp_path, "--datasets", SBM, "--frameworks", "dgl",
                              "--data-root", str(tmp_path / "data"), "--no-isolate",
                              env=_no_dgl(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "framework dgl unavailable (not installed" in proc.stderr
    assert "--frameworks" in proc.stderr
    assert not (out / "stages.png").exists()


def test_some_runs_skipped_are_listed_at_the_end(tmp_path):
    proc, out = _characterize(tmp_path, "--datasets", SBM, "--frameworks", "ngra,dgl",
                              "--data-root", str(tmp_path / "data"), "--no-isolate",
                              env=_no_dgl(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "1 of 2 runs did not complete" in proc.stderr
    assert "dgl/gcn/" in proc.stderr and "framework dgl unavailable" in proc.stderr
    for name in ("stages.png", "roofline.png"):
        assert (out / name).stat().st_size > 0
    report = (out / "report.md").read_text()
    skipped = report.split("## Skipped and failed runs", 1)[1]
    assert "| dgl | gcn |" in skipped and "framework dgl unavailable" in skipped


def test_unfinished_groups_runs_by_reason():
    results = [RunResult("dgl", m, "cora", "inference", status="skipped", reason="no dgl")
               for m in ("gcn", "gat")]
    results.append(RunResult("ngra", "gcn", "cora", "inference", status="failed", reason="boom"))
    lines = unfinished(result_rows(results))
    assert lines == ["skipped: no dgl -- 2 run(s): dgl/gcn/cora/inference, dgl/gat/cora/inference",
                     "failed: boom -- 1 run(s): ngra/gcn/cora/inference"]


# ---------------------------------------------------------------- figure layout
def _fake_rows(frameworks=("ngra", "ngra-generic", "pyg", "dgl"), models=("gcn", "gat"),
               datasets=("cora",), modes=("inference",)) -> list[dict]:
    results = []
    for fw in frameworks:
        for m in models:
            for d in datasets:
                for mode in modes:
                    t = {s: 1e-3 * (i + 1) for i, s in enumerate(STAGES)}
                    layers = [LayerDims(m, 32, 8, heads=2 if m == "gat" else 1),
                              LayerDims(m, 16, 4)]
                    results.append(RunResult(
                        fw, m, d, mode, fwd=t, total_s=0.012, fwd_total_s=0.012, plain_s=0.011,
                        fused=[fw == "ngra"] * 2, num_nodes=1000, num_edges=10000, repeats=1,
                        layers=[vars(x) for x in layers]))
    return result_rows(results)


def _inside(fig, artist) -> bool:
    box = artist.get_window_extent(fig.canvas.get_renderer())
    page = fig.bbox
    return (box.x0 >= page.x0 - 0.5 and box.y0 >= page.y0 - 0.5
            and box.x1 <= page.x1 + 0.5 and box.y1 <= page.y1 + 0.5)


@pytest.mark.parametrize("shape", [
    pytest.param({"frameworks": ("ngra",), "models": ("gcn",)}, id="one-run"),
    pytest.param({}, id="four-frameworks"),
    pytest.param({"modes": ("inference", "training"), "datasets": ("cora", "citeseer")},
                 id="two-by-two"),
])
def test_stages_title_and_legend_inside_the_figure(shape):
    import matplotlib.pyplot as plt

    fig = stages_figure(_fake_rows(**shape))
    fig.canvas.draw()
    assert fig._suptitle is not None and fig.legends
    assert _inside(fig, fig._suptitle), "title cut off"
    for legend in fig.legends:
        assert _inside(fig, legend), "legend cut off"
    plt.close(fig)


def test_roofline_title_and_legend_inside_the_figure():
    import matplotlib.pyplot as plt

    fig = roofline_figure(_fake_rows(modes=("inference", "training")), CEILINGS)
    fig.canvas.draw()
    for legend in fig.legends:
        assert _inside(fig, legend)
    for ax in fig.axes:
        assert _inside(fig, ax.title)
    plt.close(fig)


# ---------------------------------------------------------------- executed FLOPs
def test_sparse_input_counts_replace_the_dense_gemm():
    n, nnz = 1000, 5000
    layers = layer_dims("gcn", 400, 16, 3)
    dense = model_counts(layers, n, 20000)
    ran = model_counts(layers, n, 20000, input_nnz=nnz)
    # GCN 400 -> 16 transforms first: x @ W.T as 2 nnz 16 FLOPs instead of 2 n 400 16
    assert dense["ApplyVertex"].flops - ran["ApplyVertex"].flops == 2 * n * 400 * 16 - 2 * nnz * 16
    assert ran["ApplyVertex"].bytes == (dense["ApplyVertex"].bytes - n * 400 * 4
                                        + nnz * 12 + (n + 1) * 8)
    assert all(ran[s] == dense[s] for s in ("Scatter", "ApplyEdge", "Gather"))
    # training: the backward of the sparse product is the weight gradient alone
    tr_dense = model_counts(layers, n, 20000, training=True)
    tr = model_counts(layers, n, 20000, training=True, input_nnz=nnz)
    diff = tr_dense["ApplyVertex"].flops - tr["ApplyVertex"].flops
    assert diff == 3 * 2 * n * 400 * 16 - 2 * 2 * nnz * 16
    # models whose layers never multiply x itself are unchanged
    gin = layer_dims("gin", 400, 16, 3)
    assert model_counts(gin, n, 20000, input_nnz=nnz) == model_counts(gin, n, 20000)


class _SparseFeatures:
    """The fields of a NodeDataset that :func:`prepare_workload` reads: 1,200 vertices,
    300 features of which ~1% are non-zero (1.4 MiB: above sparse_input.MIN_BYTES)."""

    name = "sparse"
    edge_type = None
    num_edge_types = 1
    num_classes = 3

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(1)
        n, f = 1200, 300
        ei = torch.randint(0, n, (2, 6 * n), generator=gen)
        self.graph = Graph.from_edge_index(torch.cat([ei, ei.flip(0)], 1), num_nodes=n)
        self.x = (torch.rand(n, f, generator=gen) < 0.01).float()
        self.y = torch.randint(0, 3, (n,), generator=gen)
        self.train_mask = torch.ones(n, dtype=torch.bool)


@pytest.mark.parametrize("model", ["gcn", "gat", "sage", "gin", "ggnn", "rgcn"])
@pytest.mark.parametrize("mode", ["inference", "training"])
def test_input_linears_match_the_sparse_products_ngra_runs(model, mode, monkeypatch):
    """:func:`input_linears` (what the executed counts assume) == the output widths of the
    Linears of ``x`` that ngra's layers ran through ``sparse_input.linear`` per iteration;
    the run records x's non-zeros where they did."""
    ds = _SparseFeatures()
    w = prepare_workload(ds, model, hidden=16)
    widths: list[int] = []
    real = sparse_input.linear

    def counting(x, weight, bias=None):
        if x is w.x:
            widths.append(weight.shape[0])
        return real(x, weight, bias)

    monkeypatch.setattr(sparse_input, "linear", counting)
    run_workload("ngra", w, mode, repeats=1, warmup=0, plain=False)  # x's CSR copy is made
    widths.clear()
    res = run_workload("ngra", w, mode, repeats=1, warmup=1, plain=False)  # 2 iterations
    assert res.status == "ok"
    if model == "ggnn":  # its input Linear (width 16) runs before the layers
        widths = [k for k in widths if k != w.hidden]
    assert sum(widths) == 2 * sum(input_linears(w.layers[0]).values())
    nnz = int(torch.count_nonzero(w.x))
    assert res.input_nnz == (nnz if input_linears(w.layers[0]) else 0)
    # PyG multiplies densely: its executed counts are the analytic ones
    assert run_workload("pyg", w, mode, repeats=1, warmup=0, plain=False).input_nnz == 0


def test_roofline_plots_executed_flops_under_the_roof(tmp_path):
    """A stage whose analytic FLOPs over its time are 10x the sgemm roof, but whose
    executed FLOPs (sparse input) are 1/10 of it, is plotted at the executed rate."""
    dims = layer_dims("gcn", 400, 16, 3)
    n, e, nnz = 2000, 20000, 8000
    dense = model_counts(dims, n, e, fused=True)["ApplyVertex"].flops
    t = dense / (10 * CEILINGS["flops"])
    stage_t = {s: t for s in STAGES}
    r = RunResult("ngra", "gcn", "cora", "inference", fwd=stage_t, total_s=5 * t,
                  fwd_total_s=5 * t, plain_s=5 * t, fused=[True, True], num_nodes=n,
                  num_edges=e, repeats=1, layers=[vars(d) for d in dims], input_nnz=nnz)
    rows = result_rows([r])
    av = next(x for x in rows if x["stage"] == "ApplyVertex")
    assert av["flop_rate"] > 9 * CEILINGS["flops"]  # useful FLOP/s: above the roof
    assert av["exec_flops"] / t < CEILINGS["flops"]
    write_csv(rows, tmp_path / "runs.csv")
    fig = roofline_figure(read_csv(tmp_path / "runs.csv"), CEILINGS)
    roof_ax = fig.axes[0]
    ys = [y for coll in roof_ax.collections for _, y in coll.get_offsets()]
    assert ys and max(ys) <= 1.5 * CEILINGS["flops"], max(ys)
    assert "executed" in roof_ax.get_ylabel()
    # a runs.csv from before exec_flops: analytic points, and the panel says so
    for row in rows:
        row.pop("exec_flops", None), row.pop("exec_bytes", None)
    fig_old = roofline_figure(rows, CEILINGS)
    texts = " ".join(t.get_text() for t in fig_old.axes[0].texts)
    assert "analytic FLOPs of the unfused" in texts
    ys_old = [y for coll in fig_old.axes[0].collections for _, y in coll.get_offsets()]
    assert max(ys_old) > 5 * CEILINGS["flops"]
    assert not math.isnan(max(ys_old))
