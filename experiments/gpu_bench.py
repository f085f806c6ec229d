"""ngra's Triton GPU path against PyG on the same GPU: training epochs, launches, memory,
bandwidth.

For GCN, GAT (4 heads x 16), G-GCN and MPNN: the median full-graph training epoch
(forward, backward, Adam step; 2 layers, hidden 64; the zoo's dropouts in both
frameworks) and the peak GPU memory allocated, ngra device-resident (``--device cuda``:
Triton kernels, the 1 x 1 grid) against PyG 2.8 on torch's own scatter ops, on

* ``rmat20``: R-MAT 2^20 vertices, edge factor 16, F = 64, 8 classes;
* ``arxiv``: an ogbn-arxiv-sized synthetic graph (R-MAT 2^17 = 131,072 vertices, edge
  factor 9: about ogbn-arxiv's 169k vertices and 1.17M edges), F = 128, 40 classes.

ngra is timed twice: eager, and replaying its step from a CUDA graph
(:class:`ngra.runtime.cuda_graph.GraphedStep`, capturable Adam, two warm-up steps; what
``ngra train --device cuda`` does by default), or the reason it was not captured. Every
step computes the loss over the training rows by index (found once), in both frameworks,
so no step waits on the host. Each framework's step is profiled once
(:func:`ngra.runtime.launches.count_launches`): device kernels, memcpy/memset, host launch
calls and host syncs per step. The last loss of each ngra variant is reported as a
sanity check of the replay (a frozen or broken graph shows as a loss that does not move
like the eager one's).

Also: the device's copy bandwidth and g-SpMM sum's effective bandwidth (bytes it must
move / time) on rmat20. Streaming from host memory is measured by
``experiments/gpu_streaming.py``. The issue's targets are checked in the report.

    python experiments/gpu_bench.py                      # needs CUDA; writes results/gpu.md
    python experiments/gpu_bench.py --dry-run            # CPU: tiny graph, Triton interpreter

``--dry-run`` runs every code path of the script that a CPU can (both frameworks, every
model, the graphed step's refusal path, the launch count's aten-op count, the bandwidth
probe) on a 64-vertex graph with CPU tensors and the gpu kernels in Triton's
interpreter; it writes ``--out`` (default: a temporary file, never the committed
results) and checks nothing about speed. On an H200 the full run takes about 3 minutes
(most of it Triton compiling and autotuning, generating R-MAT 2^20 and PyG's rmat20
epochs).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_util import gpu_or_dry_run  # noqa: E402

GRAPHS = {
    "rmat20": "rmat:scale=20,edge_factor=16,feat=64,classes=8,seed=0",
    "arxiv": "rmat:scale=17,edge_factor=9,feat=128,classes=40,seed=0",
}
DRY_GRAPH = "rmat:scale=6,edge_factor=4,feat=8,classes=4,seed=0"
MODELS = ("gcn", "gat", "ggcn", "mpnn")
TARGETS = ("arxiv-sized: GCN and GAT epoch <= 0.8x PyG; R-MAT 2^20: GCN, GAT, G-GCN, MPNN "
           "<= 0.5x PyG, G-GCN <= 0.25x; GCN peak device memory on R-MAT 2^20 <= 1.5 GiB; "
           "g-SpMM sum >= 70% of the device copy bandwidth")
#: ngra epoch / PyG epoch each (graph, model) must reach (issue 38)
TIME_TARGETS = {("arxiv", "gcn"): 0.8, ("arxiv", "gat"): 0.8, ("rmat20", "gcn"): 0.5,
                ("rmat20", "gat"): 0.5, ("rmat20", "ggcn"): 0.25, ("rmat20", "mpnn"): 0.5}
GCN_PEAK_MIB = 1.5 * 1024
SPMM_SHARE = 0.7
#: eager steps before a graphed step is captured
GRAPH_WARMUP = 2


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _median_epoch(step, dev, epochs: int, warm: bool = False) -> float:
    if not warm:
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


#: what each framework's step reads of a workload: only that goes to the device for its
#: run, so neither framework's peak memory holds the other's copy of the graph
FIELDS = {"ngra": ("graph", "edge_data", "x", "y", "train_mask"),
          "pyg": ("x", "y", "train_mask", "src", "dst", "weight", "etype", "norm")}


def _workload(name, ds, dev, framework: str = "ngra"):
    """``ds`` prepared for zoo model ``name`` (:func:`ngra.characterize.workloads.
    prepare_workload`: what the training benchmark and the characterization use), the
    tensors ``framework``'s step reads on ``dev`` (:data:`FIELDS`); GAT 4 heads x 16, the
    others hidden 64."""
    import dataclasses

    from ngra.characterize.workloads import prepare_workload
    from ngra.runtime.placement import move_to

    w = prepare_workload(ds, name, hidden=64, heads=4)
    fields = FIELDS[framework]
    moved = move_to(dev, *(getattr(w, f) for f in fields))
    return dataclasses.replace(w, **dict(zip(fields, moved)))


def _dropouts(name) -> tuple[float, float]:
    """The zoo model's dropout and GAT's attention dropout, used by both frameworks (the
    training benchmark's, without its overrides)."""
    from train_bench import _attention_dropout, _dropout

    return _dropout(name), _attention_dropout() if name == "gat" else 0.0


def _train_step(net, forward, w, capturable: bool = False):
    """A step of ``net`` (``forward()`` its output on workload ``w``) that returns the loss
    tensor and reads nothing on the host: Adam (lr 0.01), the loss over the training rows
    by index."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.Adam(net.parameters(), lr=0.01, capturable=capturable)
    rows = w.train_mask.nonzero().view(-1)
    y = w.y.index_select(0, rows)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward().index_select(0, rows), y)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _ngra_step(w, dev, capturable: bool = False):
    """A training step of the zoo model of workload ``w``, device-resident on ``dev``."""
    import torch

    from ngra.characterize.workloads import build_ngra

    torch.manual_seed(0)
    net = build_ngra(w, *_dropouts(w.model)).to(dev)
    return _train_step(net, lambda: net(w.graph, w.x, w.edge_data), w, capturable)


def _pyg_step(w, dev):
    """A training step of the PyG model of workload ``w``
    (:func:`ngra.characterize.pyg_models.build_pyg`: the same math and dropout)."""
    import torch

    from ngra.characterize.pyg_models import build_pyg

    torch.manual_seed(0)
    net = build_pyg(w, *_dropouts(w.model)).to(dev)
    return _train_step(net, lambda: net(w.x), w)


class Run:
    """One framework variant's figures on one (graph, model)."""

    def __init__(self, epoch=float("nan"), peak=float("nan"), launches=None, loss=float("nan"),
                 status="") -> None:
        self.epoch, self.peak, self.launches, self.loss, self.status = \
            epoch, peak, launches, loss, status


def _measure(step, dev, epochs: int, warm: bool = False) -> Run:
    """Median epoch, peak memory, one profiled step's launches, and the last loss
    (``warm``: ``step`` has run already, no warm-up call)."""
    from ngra.runtime.launches import count_launches

    if not warm:
        step()  # warm-up first: Triton's one-time compiles and autotuning (its timing
        # runs allocate a 256 MiB cache-flush buffer) are no part of a training step
    _peak_reset(dev)
    t = _median_epoch(step, dev, epochs, warm=True)
    peak = _peak_mib(dev)
    launches = count_launches(step, dev)
    return Run(t, peak, launches, float(step()))


def _graphed(w, dev, epochs: int) -> Run:
    """ngra's step replayed from a CUDA graph (capturable Adam, :data:`GRAPH_WARMUP`
    eager steps first), or the reason it was not captured (its steps then ran eagerly
    and are not timed: the eager row has them)."""
    from ngra.runtime.cuda_graph import CAPTURED, GraphedStep, capture_refusal

    refusal = capture_refusal(dev)  # the CPU's (dry run); Adam is capturable on devices only
    step = GraphedStep(_ngra_step(w, dev, capturable=refusal is None), dev,
                       warmup=GRAPH_WARMUP, refusal=refusal)
    if refusal is not None:  # refused up front: one (eager) call shows it runs
        return Run(status=step.describe(), loss=float(step()))
    for _ in range(GRAPH_WARMUP + 1):  # the warm-up, then the capture and its first replay
        step()
    if step.status != CAPTURED:
        return Run(status=step.describe(), loss=float(step()))
    run = _measure(step, dev, epochs, warm=True)
    run.status = CAPTURED
    return run


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
    ap.add_argument("--epochs", type=int, default=5, help="timed epochs a variant (default: 5)")
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

    dev, specs, epochs, out_path = gpu_or_dry_run(args.dry_run, GRAPHS, args.graphs, DRY_GRAPH,
                                                  args.out, RESULTS, "gpu.md", args.epochs)
    rows, notes, bandwidth = [], [], None
    started = time.perf_counter()
    versions = _versions(dev)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def write(done: bool) -> None:  # after every row: a run cut short keeps what it measured
        lines = _report(rows, notes, bandwidth, versions, args,
                        time.perf_counter() - started, done)
        out_path.write_text("\n".join(lines) + "\n")

    with use_backend("gpu" if args.dry_run else "auto"):
        for gname, spec in specs.items():
            ds = load(spec, progress=False)
            for name in args.models.split(","):
                w = _workload(name, ds, dev)  # one prepared graph for ngra's two variants
                eager = _measure(_ngra_step(w, dev), dev, epochs)
                try:
                    graphed = _graphed(w, dev, epochs)
                except Exception as err:  # noqa: BLE001 - reported in the row, not hidden
                    traceback.print_exc()
                    graphed = Run(status=f"error: {type(err).__name__}: "
                                         f"{str(err).splitlines()[0] if str(err) else ''}")
                    notes.append(f"ngra graphed {name} on {gname}: {graphed.status}")
                del w
                pyg = Run(status="skipped (--no-pyg)")
                if not args.no_pyg:
                    try:
                        pyg = _measure(_pyg_step(_workload(name, ds, dev, "pyg"), dev), dev,
                                       epochs)
                    except torch.OutOfMemoryError:
                        notes.append(f"PyG {name} on {gname}: out of GPU memory")
                        pyg = Run(status="out of GPU memory")
                        torch.cuda.empty_cache()
                rows.append((gname, name, eager, graphed, pyg))
                write(False)
                print(f"{gname:7s} {name:5s} ngra {eager.epoch:8.4f} s, graphed "
                      f"{graphed.epoch:8.4f} s ({graphed.status}) | pyg {pyg.epoch:8.4f} s "
                      f"[{time.perf_counter() - started:.0f} s]", flush=True)
            if gname in ("rmat20", "dry"):
                bandwidth = _bandwidth(ds, dev, max(epochs, 3))
                print(f"copy {bandwidth[0]:.1f} GB/s, gspmm sum {bandwidth[1]:.1f} GB/s",
                      flush=True)
            del ds
    write(True)
    print(f"wrote {out_path} [{time.perf_counter() - started:.0f} s]")
    return 0


def _ratio(a: float, b: float) -> str:
    return "n/a" if b != b or a != a or b == 0 else f"{a / b:.2f}x"


def _trained(eager: Run, graphed: Run) -> float:
    """The epoch ``ngra train`` would run: the graph's where captured, else eager."""
    return graphed.epoch if not math.isnan(graphed.epoch) else eager.epoch


def _launch_cell(run: Run) -> str:
    c = run.launches
    if c is None:
        return "-"
    if c.kernels is None:
        return f"{c.ops} ops"
    return f"{c.kernels} k / {c.memcpy + c.memset} cp / {c.launch_calls} calls / {c.syncs} syncs"


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else "met" if ok else "NOT met"


def _target_lines(rows, bandwidth) -> list[str]:
    out = []
    for g, m, eager, graphed, pyg in rows:
        limit = TIME_TARGETS.get((g, m))
        if limit is None:
            continue
        t = _trained(eager, graphed)
        ok = None if math.isnan(pyg.epoch) else t / pyg.epoch <= limit
        out.append(f"- {g} {m}: ngra {_ratio(t, pyg.epoch)} of PyG (target <= {limit}x): "
                   f"{_met(ok)}")
        if (g, m) == ("rmat20", "gcn"):
            out.append(f"- rmat20 gcn peak {eager.peak:,.0f} MiB (target <= "
                       f"{GCN_PEAK_MIB:,.0f} MiB): "
                       f"{_met(None if math.isnan(eager.peak) else eager.peak <= GCN_PEAK_MIB)}")
    if bandwidth is not None:
        copy_gbs, spmm_gbs = bandwidth
        out.append(f"- g-SpMM sum {_ratio(spmm_gbs, copy_gbs)} of the copy bandwidth (target "
                   f">= {SPMM_SHARE}x): {_met(spmm_gbs >= SPMM_SHARE * copy_gbs)}")
    return out


def _report(rows, notes, bandwidth, versions, args, seconds: float, done: bool) -> list[str]:
    lines = [
        "# ngra's Triton GPU path vs PyG on the same GPU",
        "",
        *([] if done else ["**Partial: the run stopped (or is running) after "
                           f"{len(rows)} row(s).**", ""]),
        "Median training epoch (forward, backward, Adam step; 2 layers, hidden 64, GAT 4 x 16; "
        f"the zoo's dropouts in both frameworks) over {args.epochs if not args.dry_run else 1} "
        "epochs after one warm-up epoch, and peak GPU memory allocated over them (the warm-up, "
        "with Triton's one-time compiling and autotuning, not counted). ngra eager, and "
        f"replayed from a CUDA graph ({GRAPH_WARMUP} eager warm-up steps, then captured; "
        "capturable Adam; what `ngra train --device cuda` runs) or why not. Graphs: "
        + "; ".join(f"`{k}` = `{v}`" for k, v in GRAPHS.items()) + ".",
        "",
        "Versions: " + ", ".join(versions) + ".",
        "",
        "| graph | model | ngra eager | ngra graphed | PyG | eager / PyG | graphed / PyG "
        "| ngra peak | PyG peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for g, m, eager, graphed, pyg in rows:
        lines.append(f"| {g} | {m} | {eager.epoch:.4f} s | {graphed.epoch:.4f} s | "
                     f"{pyg.epoch:.4f} s | {_ratio(eager.epoch, pyg.epoch)} | "
                     f"{_ratio(graphed.epoch, pyg.epoch)} | {eager.peak:,.0f} MiB | "
                     f"{pyg.peak:,.0f} MiB |")
    lines += [
        "",
        "Launches per step (one profiled step, `ngra.runtime.launches.count_launches`): "
        "device kernels (k), memcpy + memset (cp), host launch API calls (a replayed graph "
        "is one) and host synchronizations; on the CPU dry run, aten ops dispatched.",
        "",
        "| graph | model | ngra eager | ngra graphed | PyG |",
        "|---|---|---|---|---|",
    ]
    for g, m, eager, graphed, pyg in rows:
        lines.append(f"| {g} | {m} | {_launch_cell(eager)} | {_launch_cell(graphed)} | "
                     f"{_launch_cell(pyg)} |")
    lines += ["", "CUDA graph and last loss after the timed epochs (a check that the replay "
                  "trains like the eager step):", ""]
    for g, m, eager, graphed, pyg in rows:
        lines.append(f"- {g} {m}: {graphed.status}; loss eager {eager.loss:.4f}, graphed "
                     f"{graphed.loss:.4f}, PyG {pyg.loss:.4f}")
    if bandwidth is not None:
        copy_gbs, spmm_gbs = bandwidth
        lines += ["", f"Bandwidth: device copy {copy_gbs:.1f} GB/s; g-SpMM sum moves its bytes "
                      f"at {spmm_gbs:.1f} GB/s ({_ratio(spmm_gbs, copy_gbs)} of the copy)."]
    lines += [
        "",
        f"Targets (issue 38): {TARGETS}. ngra's epoch here is the graphed one where captured, "
        "else the eager one.",
        "",
        *_target_lines(rows, bandwidth),
        *[f"- {n}" for n in notes],
        "",
        f"The run took {seconds:.0f} s. Regenerate: `python experiments/gpu_bench.py"
        + (" --dry-run" if args.dry_run else "") + "`",
    ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
