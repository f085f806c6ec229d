"""Where the GPU path's time and memory go: the figures issue 38's missed targets need.

Three probes, each on R-MAT 2^20 (edge factor 16, F = 64, 8 classes; the GPU
benchmarks' graph), written to ``results/gpu_profile.md``:

* **streamed epoch** (GCN, GAT 4 x 16; the 4 x 4 schedule of ``gpu_streaming.py``): one
  training epoch under ``torch.profiler`` after a warm-up. The report splits the epoch's
  wall time into the streamed layers' phases (the ``ngra.stream.*`` ranges of
  :mod:`ngra.runtime.device_stream`), and the device's timeline into kernels, copies each
  way, both at once and idle; it lists the host calls that wait for the device and the
  ops and kernels that take the most time. The Chrome traces go to ``$OUT`` (gzipped).
* **g-SpMM sum** forward over configurations: the tuned kernel's (each of its autotune
  configurations, forced) and a variant that gives each program several destinations,
  as effective bandwidth over the device copy's (target 0.7x), each checked against
  ``index_add``.
* **device peaks**: one training step with the allocator's history recorded (resident
  GCN, and streamed MPNN and GAT under the 4 x 4 budget, whose peaks exceed the priced
  budget); the blocks live at the peak, grouped by the ngra source line that allocated
  them.

    python experiments/gpu_profile.py              # needs CUDA -> results/gpu_profile.md
    python experiments/gpu_profile.py --dry-run    # CPU stand-in, tiny graph (profile only)
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_util import gpu_or_dry_run  # noqa: E402

GRAPHS = {"rmat20": "rmat:scale=20,edge_factor=16,feat=64,classes=8,seed=0"}
DRY_GRAPH = "rmat:scale=8,edge_factor=8,feat=16,classes=4,seed=0"
WAITS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize",
         "cudaMemcpy", "cudaStreamWaitEvent", "cudaHostAlloc", "cudaFreeHost", "cudaMalloc",
         "cudaFree", "cudaHostRegister")


def _union(spans: list[tuple[float, float]]) -> float:
    """Total length covered by ``spans`` (start, end)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    return _union(a) + _union(b) - _union(a + b)


def _trace_summary(path: Path, wall_us: float) -> list[str]:
    """The device timeline and host waits of one exported Chrome trace, as report lines."""
    events = json.loads(path.read_text())
    events = events.get("traceEvents", events)
    by_cat: dict[str, list[dict]] = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            by_cat[e.get("cat", "")].append(e)

    def spans(evs):
        return [(e["ts"], e["ts"] + e["dur"]) for e in evs]

    kern = spans(by_cat["kernel"])
    h2d = spans([e for e in by_cat["gpu_memcpy"] if "HtoD" in e["name"]])
    d2h = spans([e for e in by_cat["gpu_memcpy"] if "DtoH" in e["name"]])
    other = spans([e for e in by_cat["gpu_memcpy"] if "HtoD" not in e["name"]
                   and "DtoH" not in e["name"]] + by_cat["gpu_memset"])
    busy = _union(kern + h2d + d2h + other)
    ms = 1e-3
    lines = [
        f"- wall {wall_us * ms:.1f} ms; device busy (anything) {busy * ms:.1f} ms "
        f"({busy / wall_us:.0%}), idle {max(wall_us - busy, 0) * ms:.1f} ms",
        f"- kernels {_union(kern) * ms:.1f} ms ({len(kern)} launches); host->device copies "
        f"{_union(h2d) * ms:.1f} ms ({len(h2d)}); device->host {_union(d2h) * ms:.1f} ms "
        f"({len(d2h)}); device copies and memsets {_union(other) * ms:.1f} ms ({len(other)})",
        f"- overlap: kernels with host->device copies {_intersect(kern, h2d) * ms:.1f} ms, "
        f"with device->host {_intersect(kern, d2h) * ms:.1f} ms",
    ]
    ranges: dict[str, list[float]] = collections.defaultdict(list)
    for e in by_cat["user_annotation"]:
        if e["name"].startswith("ngra.stream"):
            ranges[e["name"]].append(e["dur"])
    if ranges:
        lines.append("- host time in the streamed layers' phases: " + "; ".join(
            f"{k.removeprefix('ngra.stream.')} {sum(v) * ms:.1f} ms ({len(v)})"
            for k, v in sorted(ranges.items())))
    runtime: dict[str, list[float]] = collections.defaultdict(list)
    for e in by_cat["cuda_runtime"] + by_cat["cuda_driver"]:
        runtime[e["name"]].append(e["dur"])
    top = sorted(runtime.items(), key=lambda kv: -sum(kv[1]))[:10]
    if top:
        lines.append("- host runtime calls (total ms, count): " + "; ".join(
            f"{k} {sum(v) * ms:.1f} ({len(v)})" for k, v in top))
    waits = {k: v for k, v in runtime.items() if k in WAITS}
    if waits:
        lines.append("- of which waiting or allocating: " + "; ".join(
            f"{k} {sum(v) * ms:.1f} ms ({len(v)})" for k, v in sorted(waits.items())))
    kt: dict[str, list[float]] = collections.defaultdict(list)
    for e in by_cat["kernel"]:
        kt[e["name"][:70]].append(e["dur"])
    lines += ["", "| kernel | ms | launches |", "|---|---|---|"]
    for k, v in sorted(kt.items(), key=lambda kv: -sum(kv[1]))[:12]:
        lines.append(f"| `{k}` | {sum(v) * ms:.2f} | {len(v)} |")
    return lines


def streamed_profile(ds, dev, models, out_dir: Path) -> list[str]:
    """Profile one streamed epoch per model (after a warm-up epoch)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from gpu_streaming import PARTS, _budget_for, _setup, _step, _sync
    from ngra.runtime.device_schedule import device_streaming

    lines = ["## Streamed epoch", ""]
    for name in models:
        w, net, opt = _setup(name, ds, dev)
        budget, scheds = _budget_for(net, w, dev, PARTS)
        step = _step(w, net, opt, dev, lambda: device_streaming(dev, budget=budget, parts=PARTS))
        step()
        ts = []
        for _ in range(2):
            _sync(dev)
            t0 = time.perf_counter()
            step()
            _sync(dev)
            ts.append(time.perf_counter() - t0)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        _sync(dev)
        with profile(activities=acts) as prof:
            t0 = time.perf_counter()
            step()
            _sync(dev)
            wall = time.perf_counter() - t0
        trace = out_dir / f"trace_{name}.json"
        prof.export_chrome_trace(str(trace))
        lines += [f"### {name}: epoch {statistics.median(ts):.4f} s unprofiled, "
                  f"{wall:.4f} s profiled; schedules "
                  + ", ".join(f"{s.k}x{s.k} ({s.cache})" for s in scheds), ""]
        lines += _trace_summary(trace, wall * 1e6)
        key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18,
                                          max_name_column_width=50)
        lines += ["", "Host ops by self time:", "", "```", table.strip(), "```", ""]
        if dev.type == "cuda":
            table = prof.key_averages().table(sort_by=key, row_limit=12,
                                              max_name_column_width=50)
            lines += ["Ops by device time:", "", "```", table.strip(), "```", ""]
        scaling = []
        for parts in (2, 8):  # how the epoch grows with the number of tiles
            budget, _ = _budget_for(net, w, dev, parts)
            step = _step(w, net, opt, dev,
                         lambda: device_streaming(dev, budget=budget, parts=parts))
            step()
            _sync(dev)
            t0 = time.perf_counter()
            step()
            _sync(dev)
            scaling.append(f"{parts}x{parts}: {time.perf_counter() - t0:.4f} s")
        lines += ["Epoch at other schedules (one timed epoch each): " + "; ".join(scaling), ""]
        with open(trace, "rb") as f, gzip.open(str(trace) + ".gz", "wb") as g:
            shutil.copyfileobj(f, g)
        trace.unlink()
        print("\n".join(lines[-40:]), flush=True)
        del net, opt, w
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return lines


def _rows_kernel():
    """g-SpMM sum with ``R`` destinations per program: an ``[R, BLOCK_E, F]`` tile of
    gathered rows per step, reduced over the edge axis."""
    import triton
    import triton.language as tl

    @triton.jit
    def spmm_rows(indptr, indices, src, out, N, F: tl.constexpr, R: tl.constexpr,
                  BLOCK_E: tl.constexpr):
        v = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
        vmask = v < N
        start = tl.load(indptr + v, mask=vmask, other=0)
        end = tl.load(indptr + v + 1, mask=vmask, other=0)
        deg = end - start
        cols = tl.arange(0, F)
        acc = tl.zeros([R, F], tl.float32)
        steps = tl.max(deg, axis=0)
        for j in range(0, steps, BLOCK_E):
            eo = j + tl.arange(0, BLOCK_E)
            emask = eo[None, :] < deg[:, None]                       # [R, BE]
            e = start[:, None] + eo[None, :]
            u = tl.load(indices + e, mask=emask, other=0).to(tl.int64)
            x = tl.load(src + u[:, :, None] * F + cols[None, None, :],
                        mask=emask[:, :, None], other=0.0)         # [R, BE, F]
            acc += tl.sum(x, axis=1)
        tl.store(out + v[:, None] * F + cols[None, :], acc, mask=vmask[:, None])

    return spmm_rows


def spmm_sweep(ds, dev) -> list[str]:
    """g-SpMM sum forward over configurations, against the device copy's bandwidth."""
    import torch
    import triton
    from triton.testing import do_bench

    from ngra.kernels.gpu import gspmm as g

    graph = ds.graph.to(dev)
    x = ds.x.to(dev).float().contiguous()
    n, f = x.shape
    indptr, indices = graph.indptr, graph.indices
    dst = torch.repeat_interleave(torch.arange(n, device=dev), indptr.diff())
    ref = torch.zeros_like(x).index_add_(0, dst, x[indices.long()])
    moved = graph.num_edges * (f * 4 + indices.element_size()) + n * (f * 4 + 8)
    a = torch.empty(1 << 26, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    copy_gbs = 2 * a.numel() * 4 / do_bench(lambda: b.copy_(a), return_mode="median") / 1e6
    lines = ["## g-SpMM sum forward", "",
             f"R-MAT 2^20, F = {f}, {graph.num_edges:,} edges, indices "
             f"{indices.dtype}; device copy {copy_gbs:.0f} GB/s (read + write); bytes "
             f"counted: {moved / 1e9:.2f} GB", "",
             "| variant | config | ms | GB/s | of copy | max error (relative) |",
             "|---|---|---|---|---|---|"]
    src3 = x.view(n, 1, f)

    def row(variant, cfg, fn):
        out = fn()
        err = float((out.view(n, f) - ref).abs().max() / ref.abs().max())
        ms = do_bench(fn, return_mode="median")
        gbs = moved / ms / 1e6
        lines.append(f"| {variant} | {cfg} | {ms:.3f} | {gbs:.0f} | {gbs / copy_gbs:.2f}x | "
                     f"{err:.1e} |")
        print(lines[-1], flush=True)

    row("tuned (autotune's pick)", "-", lambda: g.spmm(indptr, indices, src3, None, "sum")[0])
    kern = g._spmm.fn
    for be, bf, nw, ns in [(16, 64, 2, 2), (32, 64, 2, 3), (64, 32, 1, 1), (64, 32, 1, 2),
                           (64, 32, 1, 3), (32, 32, 1, 2), (128, 32, 1, 2), (128, 32, 2, 2),
                           (64, 16, 1, 2), (32, 16, 1, 2), (128, 64, 2, 2), (64, 64, 1, 2)]:
        out = torch.empty_like(x)

        def fn(be=be, bf=bf, nw=nw, ns=ns, out=out):
            kern[(n, triton.cdiv(f, bf))](
                indptr, indices, indices, x, x, out, x, x, out, out, f, f, 1,
                g._avg_degree(indptr, indices.numel()), REDUCE=g._CODES["sum"],
                EDGE=g.NO_EDGE.value, HAS_PERM=False, MASKED=False, SCALED=False,
                BLOCK_E=be, BLOCK_F=bf, num_warps=nw, num_stages=ns)
            return out
        try:
            row("per destination", f"E{be} F{bf} w{nw} s{ns}", fn)
        except Exception as exc:  # a configuration the compiler refuses
            lines.append(f"| per destination | E{be} F{bf} w{nw} s{ns} | failed: "
                         f"{type(exc).__name__} | | | |")
    rows_k = _rows_kernel()
    for r, be, nw in [(2, 16, 2), (4, 16, 4)]:
        out = torch.empty_like(x)

        def fn(r=r, be=be, nw=nw, out=out):
            rows_k[(triton.cdiv(n, r),)](indptr, indices, x, out, n, F=f, R=r, BLOCK_E=be,
                                         num_warps=nw)
            return out
        try:
            row("rows per program", f"R{r} E{be} w{nw}", fn)
        except Exception as exc:
            lines.append(f"| rows per program | R{r} E{be} w{nw} | failed: "
                         f"{type(exc).__name__}: {str(exc)[:60]} | | | |")
    return lines + [""]


def _resident_step(ds, dev, model):
    from gpu_bench import _ngra_step, _workload

    return _ngra_step(_workload(model, ds, dev), dev), None


def _streamed_step(ds, dev, model):
    """A streamed step of ``model`` under gpu_streaming's 4 x 4 budget, and the budget."""
    from gpu_streaming import PARTS, _budget_for, _setup, _step
    from ngra.runtime.device_schedule import device_streaming

    w, net, opt = _setup(model, ds, dev)
    budget, _ = _budget_for(net, w, dev, PARTS)
    return _step(w, net, opt, dev, lambda: device_streaming(dev, budget=budget,
                                                            parts=PARTS)), budget


def peak_breakdown(ds, dev, model: str = "gcn", streamed: bool = False) -> list[str]:
    """The blocks live at a training step's peak (resident, or streamed under the 4 x 4
    budget), by the ngra line that allocated them."""
    import torch

    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    step, budget = (_streamed_step if streamed else _resident_step)(ds, dev, model)
    step()  # the warm-up: Triton's compiling and autotuning
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    begin = len(torch.cuda.memory._snapshot()["device_traces"][0])
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    peak = torch.cuda.max_memory_allocated()
    # replay the recorded history: the blocks live when the second step began, then the
    # largest total during it
    live: dict[int, tuple[int, list]] = {}
    trace = snap["device_traces"][0]
    total, best, best_live = 0, 0, {}
    for i, ev in enumerate(trace):
        if i == begin:
            best, best_live = total, dict(live)
        if ev["action"] == "alloc":
            live[ev["addr"]] = (ev["size"], ev.get("frames", []))
            total += ev["size"]
            if i >= begin and total > best:
                best, best_live = total, dict(live)
        elif ev["action"] == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]

    def where(frames):
        own = [f for f in frames if "/ngra/" in f.get("filename", "")
               or "/experiments/" in f.get("filename", "")]
        own = own[:2] or frames[:1]  # the allocating line and its caller
        if not own:
            return "(no frames)"
        return " < ".join(f"{f['filename'].split('/ngra/')[-1].split('/experiments/')[-1]}:"
                          f"{f['line']} {f['name']}" for f in own)

    groups: dict[str, list[int]] = collections.defaultdict(list)
    for size, frames in best_live.values():
        groups[where(frames)].append(size)
    mib = 2**20
    title = (f"Streamed {model.upper()} step (4 x 4 budget {budget / mib:,.0f} MiB)"
             if streamed else f"Resident {model.upper()} step")
    lines = [f"## {title}: memory live at the peak", "",
             f"max_memory_allocated {peak / mib:,.0f} MiB; replayed peak {best / mib:,.0f} "
             f"MiB ({len(best_live)} blocks)", "", "| allocated at | MiB | blocks |",
             "|---|---|---|"]
    for k, v in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:20]:
        lines.append(f"| `{k}` | {sum(v) / mib:,.1f} | {len(v)} |")
    print("\n".join(lines), flush=True)
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="gcn,gat")
    ap.add_argument("--dry-run", action="store_true", help="tiny graph, CPU stand-in")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    from ngra.datasets import load

    dev, specs, _, out_path = gpu_or_dry_run(args.dry_run, GRAPHS, "rmat20", DRY_GRAPH,
                                             args.out, RESULTS, "gpu_profile.md", 1)
    out_dir = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="ngra-profile-"))
    ds = load(next(iter(specs.values())), progress=False)
    lines = ["# Where the GPU path's time and memory go (issue 38)", ""]
    if dev.type == "cuda":
        import torch

        lines += [f"Device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}.", ""]
    probes = [lambda: streamed_profile(ds, dev, args.models.split(","), out_dir)]
    if dev.type == "cuda":
        probes += [lambda: spmm_sweep(ds, dev), lambda: peak_breakdown(ds, dev),
                   lambda: peak_breakdown(ds, dev, "mpnn", streamed=True),
                   lambda: peak_breakdown(ds, dev, "gat", streamed=True)]
    for probe in probes:
        try:
            lines += probe()
        except Exception as exc:  # one failing probe must not lose the others' figures
            traceback.print_exc()
            lines += [f"- failed: {type(exc).__name__}: {exc}", ""]
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text("\n".join(lines) + "\nRegenerate: `python experiments/"
                            "gpu_profile.py`\n")
    print(f"wrote {out_path}; traces in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
