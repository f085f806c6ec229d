"""ngra's Triton GPU path against PyG on the same GPU: training epochs, memory, bandwidth.

For GCN, GAT (4 heads x 16), G-GCN and MPNN: the median full-graph training epoch
(forward, backward, Adam step; 2 layers, hidden 64) and the peak GPU memory allocated,
ngra device-resident (``--device cuda``: Triton kernels, the 1 x 1 grid) against PyG
2.8 on torch's own scatter ops, on

* ``rmat20``: R-MAT 2^20 vertices, edge factor 16, F = 64, 8 classes;
* ``arxiv``: an ogbn-arxiv-sized synthetic graph (R-MAT 2^17 = 131,072 vertices, edge
  factor 9: about ogbn-arxiv's 169k vertices and 1.17M edges), F = 128, 40 classes.

Also: the device's copy bandwidth and g-SpMM sum's effective bandwidth (bytes it must
move / time) on rmat20; and GCN trained with streaming (host data, tiles staged to the
GPU under a budget the graph does not fit) against the resident epoch, per edge. The
issue's targets are checked in the report.

    python experiments/gpu_bench.py                      # needs CUDA; writes results/gpu.md
    python experiments/gpu_bench.py --dry-run            # CPU: tiny graph, Triton interpreter

``--dry-run`` runs every code path of the script (both frameworks, every model, the
bandwidth probe, streaming) on a 64-vertex graph with CPU tensors and the gpu kernels
in Triton's interpreter; it writes ``--out`` (default: a temporary file, never the
committed results) and checks nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))

GRAPHS = {
    "rmat20": "rmat:scale=20,edge_factor=16,feat=64,classes=8,seed=0",
    "arxiv": "rmat:scale=17,edge_factor=9,feat=128,classes=40,seed=0",
}
DRY_GRAPH = "rmat:scale=6,edge_factor=4,feat=8,classes=4,seed=0"
MODELS = ("gcn", "gat", "ggcn", "mpnn")
TARGETS = ("GCN epoch <= 1.0x PyG; GAT epoch <= 0.6x PyG at <= 0.3x its peak memory; "
           "G-GCN >= 5x faster than PyG; GCN peak memory on R-MAT 2^20 <= 1.5 GiB; "
           "g-SpMM sum >= 50% of the measured bandwidth; streaming within 2x of the "
           "resident epoch time per edge")


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _median_epoch(step, dev, epochs: int) -> float:
    step()  # warm-up: Triton compiles and autotunes, PyG's first-call work
    ts = []
    for _ in range(epochs):
        _sync(dev)
        t0 = time.perf_counter()
        step()
        _sync(dev)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _peak_reset(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def _peak_mib(dev) -> float:
    import torch

    return torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else float("nan")


def _workload(name, ds, dev):
    """``ds`` prepared for zoo model ``name`` (:func:`ngra.characterize.workloads.
    prepare_workload`: what the training benchmark and the characterization use), every
    tensor on ``dev``; GAT 4 heads x 16, the others hidden 64."""
    import dataclasses

    from ngra.characterize.workloads import prepare_workload
    from ngra.runtime.placement import move_to

    w = prepare_workload(ds, name, hidden=64, heads=4)
    fields = ("graph", "edge_data", "x", "y", "train_mask", "src", "dst", "weight", "etype",
              "norm")
    moved = move_to(dev, *(getattr(w, f) for f in fields))
    return dataclasses.replace(w, **dict(zip(fields, moved)))


def _dropouts(name) -> tuple[float, float]:
    """The zoo model's dropout and GAT's attention dropout, used by both frameworks (the
    training benchmark's, without its overrides)."""
    from train_bench import _attention_dropout, _dropout

    return _dropout(name), _attention_dropout() if name == "gat" else 0.0


def _ngra_step(name, ds, dev, budget=None):
    """A training step of zoo model ``name``: resident on ``dev`` (``budget`` None) or with
    host data streamed to it under ``budget`` bytes."""
    import torch
    import torch.nn.functional as F

    from ngra.characterize.workloads import build_ngra
    from ngra.runtime.placement import Placement, placed

    w = _workload(name, ds, dev if budget is None else torch.device("cpu"))
    torch.manual_seed(0)
    net = build_ngra(w, *_dropouts(name))
    if budget is None:
        net = net.to(dev)
        place = Placement(dev, True, None, 0, None)
    else:
        place = Placement(dev, False, budget, 0, budget)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    graph, x, edata, y, mask = w.graph, w.x, w.edge_data, w.y, w.train_mask

    def step() -> None:
        opt.zero_grad()
        with placed(place):
            out = net(graph, x, edata)
            F.cross_entropy(out[mask], y[mask]).backward()
        opt.step()

    return step, graph.num_edges


def _pyg_step(name, ds, dev):
    """A training step of the PyG model of ``name``
    (:func:`ngra.characterize.pyg_models.build_pyg`: the same math and dropout)."""
    import torch
    import torch.nn.functional as F

    from ngra.characterize.pyg_models import build_pyg

    w = _workload(name, ds, dev)
    torch.manual_seed(0)
    net = build_pyg(w, *_dropouts(name)).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(net(w.x)[w.train_mask], w.y[w.train_mask]).backward()
        opt.step()

    return step


def _bandwidth(ds, dev, reps: int) -> tuple[float, float]:
    """``(copy GB/s, g-SpMM sum effective GB/s)``: a large device copy (read + write), and
    the bytes g-SpMM sum must move (one gathered source row per edge, its index, one
    output row per vertex) over its time."""
    import torch

    from ngra import kernels

    n = 1 << (26 if dev.type == "cuda" else 12)
    a = torch.empty(n, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    t_copy = _median_epoch(lambda: b.copy_(a), dev, reps)
    g = ds.graph.to(dev)
    x = ds.x.to(dev)
    t_spmm = _median_epoch(lambda: kernels.gspmm(g.indptr, g.indices, x), dev, reps)
    moved = (g.num_edges * (x.shape[1] * 4 + g.indices.element_size())
             + g.num_nodes * (x.shape[1] * 4 + 8))
    return 2 * n * 4 / t_copy / 1e9, moved / t_spmm / 1e9


def _versions(dev) -> list[str]:
    import torch

    lines = [f"torch {torch.__version__}", f"python {platform.python_version()}"]
    try:
        import triton

        lines.append(f"triton {triton.__version__}")
    except ImportError:
        lines.append("triton: not installed")
    try:
        import torch_geometric

        lines.append(f"torch_geometric {torch_geometric.__version__}")
    except ImportError:
        lines.append("torch_geometric: not installed")
    if dev.type == "cuda":
        lines.append(f"device {torch.cuda.get_device_name(dev)}, CUDA {torch.version.cuda}")
        try:
            drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,"
                                  "noheader"], capture_output=True, text=True, timeout=30).stdout
            lines.append(f"driver {drv.strip().splitlines()[0]}")
        except (OSError, subprocess.SubprocessError, IndexError):
            lines.append("driver: nvidia-smi unavailable")
    else:
        lines.append("device: CPU tensors, Triton interpreter (dry run: no timing meaning)")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default="rmat20,arxiv")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--stream-parts", type=int, default=4,
                    help="streaming budget = resident GCN peak / this (default: 4)")
    ap.add_argument("--no-pyg", action="store_true", help="skip the PyG baseline")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny graph on CPU, gpu kernels in Triton's interpreter")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before ngra.kernels.gpu is imported
    import torch

    from ngra.datasets import load
    from ngra.kernels import use_backend

    if args.dry_run:
        dev, specs, epochs = torch.device("cpu"), {"dry": DRY_GRAPH}, 1
        out_path = args.out or Path(tempfile.mkdtemp(prefix="ngra-gpu-bench-")) / "gpu.md"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gpu_bench.py needs a CUDA device (or --dry-run on CPU).")
        dev, epochs = torch.device("cuda"), args.epochs
        specs = {k: GRAPHS[k] for k in args.graphs.split(",")}
        out_path = args.out or RESULTS / "gpu.md"
    rows, notes = [], []
    # auto: the gpu kernels on CUDA tensors, the CPU ones on the host rows streaming keeps
    with use_backend("gpu" if args.dry_run else "auto"):
        for gname, spec in specs.items():
            ds = load(spec, progress=False)
            for name in args.models.split(","):
                step, _ = _ngra_step(name, ds, dev)
                _peak_reset(dev)
                t_ngra = _median_epoch(step, dev, epochs)
                m_ngra = _peak_mib(dev)
                del step
                t_pyg = m_pyg = float("nan")
                if not args.no_pyg:
                    try:
                        pstep = _pyg_step(name, ds, dev)
                        _peak_reset(dev)
                        t_pyg = _median_epoch(pstep, dev, epochs)
                        m_pyg = _peak_mib(dev)
                        del pstep
                    except torch.OutOfMemoryError:
                        notes.append(f"PyG {name} on {gname}: out of GPU memory")
                        torch.cuda.empty_cache()
                rows.append((gname, name, t_ngra, m_ngra, t_pyg, m_pyg))
                print(f"{gname:7s} {name:5s} ngra {t_ngra:8.4f} s {m_ngra:9.1f} MiB | "
                      f"pyg {t_pyg:8.4f} s {m_pyg:9.1f} MiB", flush=True)
            if gname in ("rmat20", "dry"):
                copy_gbs, spmm_gbs = _bandwidth(ds, dev, max(epochs, 3))
                gcn = next(r for r in rows if r[0] == gname and r[1] == "gcn")
                budget = int(max(gcn[3], 1.0) * 2**20 / args.stream_parts) if dev.type == "cuda" \
                    else 1 << 20
                step, edges = _ngra_step("gcn", ds, dev, budget=budget)
                t_stream = _median_epoch(step, dev, epochs)
                stream = (budget, t_stream, gcn[2])
                print(f"copy {copy_gbs:.1f} GB/s, gspmm sum {spmm_gbs:.1f} GB/s; streaming GCN "
                      f"{t_stream:.4f} s vs resident {gcn[2]:.4f} s", flush=True)
    lines = _report(rows, notes, copy_gbs, spmm_gbs, stream, _versions(dev), args)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("\n".join(lines) + "\n")
    print(f"wrote {out_path}")
    return 0


def _ratio(a: float, b: float) -> str:
    return "n/a" if b != b or a != a or b == 0 else f"{a / b:.2f}x"


def _report(rows, notes, copy_gbs, spmm_gbs, stream, versions, args) -> list[str]:
    budget, t_stream, t_res = stream
    lines = [
        "# ngra's Triton GPU path vs PyG on the same GPU",
        "",
        "Median training epoch (forward, backward, Adam step; 2 layers, hidden 64, GAT 4 x 16) "
        f"after one warm-up epoch, and peak GPU memory allocated. Graphs: "
        + "; ".join(f"`{k}` = `{v}`" for k, v in GRAPHS.items()) + ".",
        "",
        "Versions: " + ", ".join(versions) + ".",
        "",
        "| graph | model | ngra epoch | PyG epoch | ngra / PyG time | ngra peak | PyG peak "
        "| ngra / PyG memory |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g, m, tn, mn, tp, mp in rows:
        lines.append(f"| {g} | {m} | {tn:.4f} s | {tp:.4f} s | {_ratio(tn, tp)} | "
                     f"{mn:,.0f} MiB | {mp:,.0f} MiB | {_ratio(mn, mp)} |")
    lines += [
        "",
        f"Bandwidth: device copy {copy_gbs:.1f} GB/s; g-SpMM sum moves its bytes at "
        f"{spmm_gbs:.1f} GB/s ({_ratio(spmm_gbs, copy_gbs)} of the copy).",
        "",
        f"Streaming: GCN with host data and tiles staged to the device within "
        f"{budget / 2**20:,.0f} MiB: {t_stream:.4f} s per epoch against {t_res:.4f} s "
        f"resident ({_ratio(t_stream, t_res)} per edge: the same edges).",
        "",
        f"Targets (issue 17): {TARGETS}.",
        *[f"- {n}" for n in notes],
        "",
        "Regenerate: `python experiments/gpu_bench.py"
        + (" --dry-run" if args.dry_run else "") + "`",
    ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
