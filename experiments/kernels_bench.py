"""Sparse-kernel benchmark: ngra vs DGL vs PyG / torch.sparse on R-MAT graphs.

Cases (all "sum" aggregation over each destination's in-edges):

* ``spmm_copy``   g-SpMM ``copy_u``, forward.
* ``spmm_umule``  g-SpMM ``u_mul_e`` with a scalar weight per edge, forward.
* ``spmm_umule_fb`` the same, forward + backward (grads to features and weights).
* ``gat_fwd`` / ``gat_fb``  GAT attention, H=4 heads x D=32: ``leaky_relu(s_src[u] +
  s_dst[v])``, edge softmax, weighted sum of ``value[u]``; forward, and forward +
  backward (grads to both scores and the values). ngra: one ``softmax_aggregate``;
  DGL: ``u_add_v`` + ``edge_softmax`` + ``u_mul_e_sum`` (GATConv's ops); PyG:
  ``GATConv``'s formulation (index_select, ``utils.softmax``, ``utils.scatter``).

Frameworks: ``ngra`` (``ngra.kernels``), ``dgl_update_all`` (``update_all`` with
builtins), ``dgl_ops`` (``dgl.ops``), ``pyg_scatter`` (gathered ``[E, F]`` messages +
``torch_geometric.utils.scatter``), ``torch_sparse`` (``torch.sparse.mm`` on a CSR
adjacency). Every framework gets the same graph (destination-sorted edges) and the
same inputs; reverse/transposed graph formats are built before timing by everyone
(DGL ``create_formats_``, ngra ``transpose_csc``), as a training loop would cache them.

Timing: median wall time of ``--repeat`` runs after ``--warmup`` runs, all
frameworks in this process, ``--threads`` threads. Peak memory: in a fresh child
process per (case, framework): inputs are built, the op runs once (warm-up), then
the kernel high-water mark is reset and the op runs again; the peak resident memory
above the post-setup level is reported (``_bench_util.PeakRSS``). Bandwidth: bytes a
forward kernel must move (see ``_bytes_moved``) over its median time, against this
machine's measured copy bandwidth.

Usage::

    python experiments/kernels_bench.py                 # full run (~10 min)
    python experiments/kernels_bench.py --quick         # small smoke run
    python experiments/kernels_bench.py --scales 16 --feats 64 --cases gat_fb
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_util as bu

log = logging.getLogger("kernels_bench")

RESULTS = Path(__file__).resolve().parent / "results"
CASES = ("spmm_copy", "spmm_umule", "spmm_umule_fb", "gat_fwd", "gat_fb")
SPMM_FRAMEWORKS = ("ngra", "dgl_update_all", "dgl_ops", "pyg_scatter", "torch_sparse")
GAT_FRAMEWORKS = ("ngra", "dgl_ops", "pyg_scatter")
GAT_HEADS, GAT_DIM = 4, 32
DGL = ("dgl_update_all", "dgl_ops")
PYG = ("pyg_scatter", "torch_sparse")


def frameworks_for(case: str) -> tuple[str, ...]:
    return GAT_FRAMEWORKS if case.startswith("gat") else SPMM_FRAMEWORKS


# ---------------------------------------------------------------------------------- graph
def make_graph(scale: int, edge_factor: int, seed: int, path: Path) -> dict[str, Any]:
    """R-MAT graph (Graph500 a, b, c) as destination-sorted CSC, saved to ``path``.

    Uses ``ngra.datasets`` (loops and duplicate edges removed, ids randomly
    relabeled), then adds one self-loop per node (GAT's convention; no node
    without in-edges).
    """
    import torch

    from ngra.datasets import load

    t0 = time.perf_counter()
    ds = load(f"rmat:scale={scale},edge_factor={edge_factor},feat=1,classes=2,seed={seed}",
              cache=False, progress=False)
    graph = ds.graph.add_self_loops()
    torch.save({"indptr": graph.indptr, "indices": graph.indices, "num_nodes": graph.num_nodes},
               path)
    deg = graph.in_degrees()
    return {"scale": scale, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
            "max_in_degree": int(deg.max()), "max_out_degree": int(graph.out_degrees().max()),
            "build_s": time.perf_counter() - t0, "path": str(path)}


def _load_graph(path: str):
    import torch

    g = torch.load(path)
    indptr, indices, n = g["indptr"], g["indices"], g["num_nodes"]
    dst = torch.repeat_interleave(torch.arange(n), indptr[1:] - indptr[:-1])
    return indptr, indices, dst, n


# ---------------------------------------------------------------------------------- cases
def setup_case(graph_path: str, case: str, framework: str, feat: int, seed: int = 0):
    """Build inputs for one (case, framework) and return a zero-argument runner.

    Module-level so that child processes can call it (peak-memory runs).
    """
    import torch

    torch.manual_seed(seed)
    indptr, indices, dst, n = _load_graph(graph_path)
    if framework != "ngra":  # the baselines' own int64 ids (ngra's graph keeps int32)
        indptr, indices, dst = indptr.long(), indices.long(), dst.long()
    num_edges = indices.numel()
    backward = case.endswith("_fb")
    gen = torch.Generator().manual_seed(seed)
    if case.startswith("gat"):
        h, d = GAT_HEADS, GAT_DIM
        tensors = [torch.randn(n, h, generator=gen), torch.randn(n, h, generator=gen),
                   torch.randn(n, h, d, generator=gen)]
        grad_out = torch.randn(n, h, d, generator=gen)
        op = _gat_op(framework, indptr, indices, dst, n)
    else:
        tensors = [torch.randn(n, feat, generator=gen)]
        if case != "spmm_copy":
            tensors.append(torch.rand(num_edges, generator=gen) + 0.5)
        grad_out = torch.randn(n, feat, generator=gen)
        op = _spmm_op(framework, indptr, indices, dst, n, weighted=case != "spmm_copy",
                      backward=backward)
    if not backward:
        def run():
            with torch.no_grad():
                return op(*tensors)
        return run
    for t in tensors:
        t.requires_grad_()

    def run_fb():
        for t in tensors:
            t.grad = None
        op(*tensors).backward(grad_out)

    return run_fb


def _dgl_graph(indices, dst, n):
    from ngra.compat import import_dgl

    dgl = import_dgl()
    g = dgl.graph((indices, dst), num_nodes=n)  # edge ids = CSC positions
    g.create_formats_()  # coo, csr, csc built now, not inside the timed runs
    return dgl, g


def _spmm_op(framework, indptr, indices, dst, n, *, weighted, backward):
    import torch

    if framework == "ngra":
        from ngra.kernels import gspmm, transpose_csc

        rev = transpose_csc(indptr, indices, n) if backward else None
        if weighted:
            return lambda x, w: gspmm(indptr, indices, x, w, rev=rev)
        return lambda x: gspmm(indptr, indices, x, rev=rev)
    if framework == "dgl_update_all":
        dgl, g = _dgl_graph(indices, dst, n)
        import dgl.function as fn

        def run(x, w=None):
            with g.local_scope():
                g.srcdata["x"] = x
                if w is None:
                    g.update_all(fn.copy_u("x", "m"), fn.sum("m", "h"))
                else:
                    g.edata["w"] = w.unsqueeze(1)
                    g.update_all(fn.u_mul_e("x", "w", "m"), fn.sum("m", "h"))
                return g.dstdata["h"]
        return run
    if framework == "dgl_ops":
        dgl, g = _dgl_graph(indices, dst, n)
        if weighted:
            return lambda x, w: dgl.ops.u_mul_e_sum(g, x, w.unsqueeze(1))
        return lambda x: dgl.ops.copy_u_sum(g, x)
    if framework == "pyg_scatter":
        from torch_geometric.utils import scatter

        if weighted:
            return lambda x, w: scatter(x.index_select(0, indices) * w.unsqueeze(1), dst, 0,
                                        dim_size=n, reduce="sum")
        return lambda x: scatter(x.index_select(0, indices), dst, 0, dim_size=n, reduce="sum")
    if framework == "torch_sparse":
        import warnings

        warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
        if weighted:
            # Built per call so the gradient reaches the edge weights.
            return lambda x, w: torch.sparse.mm(
                torch.sparse_csr_tensor(indptr, indices, w, (n, n)), x)
        adj = torch.sparse_csr_tensor(indptr, indices, torch.ones(indices.numel()), (n, n))
        return lambda x: torch.sparse.mm(adj, x)
    raise ValueError(f"unknown framework {framework!r}")


def _gat_op(framework, indptr, indices, dst, n):
    import torch.nn.functional as F

    if framework == "ngra":
        from ngra.kernels import softmax_aggregate, transpose_csc

        rev = transpose_csc(indptr, indices, n)
        return lambda ss, sd, v: softmax_aggregate(indptr, indices, ss, sd, v, rev=rev)
    if framework == "dgl_ops":
        dgl, g = _dgl_graph(indices, dst, n)

        def run(ss, sd, v):
            e = F.leaky_relu(dgl.ops.u_add_v(g, ss, sd), 0.2)  # [E, H]
            a = dgl.ops.edge_softmax(g, e)
            return dgl.ops.u_mul_e_sum(g, v, a.unsqueeze(-1))
        return run
    if framework == "pyg_scatter":
        from torch_geometric.utils import scatter, softmax

        def run(ss, sd, v):
            alpha = F.leaky_relu(ss.index_select(0, indices) + sd.index_select(0, dst), 0.2)
            alpha = softmax(alpha, dst, num_nodes=n)
            msg = v.index_select(0, indices) * alpha.unsqueeze(-1)  # [E, H, D]
            return scatter(msg, dst, 0, dim_size=n, reduce="sum")
        return run
    raise ValueError(f"unknown framework {framework!r}")


def _edge_tensor_bytes(case: str, num_edges: int, feat: int) -> int:
    """Size of one [E, ...] message tensor a materializing baseline allocates."""
    if case.startswith("gat"):
        return num_edges * GAT_HEADS * GAT_DIM * 4
    return num_edges * feat * 4


def _bytes_moved(case: str, n: int, num_edges: int, feat: int) -> int | None:
    """Bytes a forward kernel must move at least (float32, int64 ids), reads + writes.

    Gathered source rows are counted once per edge (a cache can only help), rows
    written once per destination: copy-sum ``E*8 + E*F*4 + N*F*4 + (N+1)*8``;
    ``u_mul_e`` adds ``E*4`` weights; GAT forward reads ``E*8`` ids, ``E*H*4`` source
    scores and ``E*H*D*4`` value rows, ``N*H*4`` destination scores and writes
    ``N*H*D*4`` outputs (ngra also writes ``N*H*8`` log-sum-exp).
    """
    ids = num_edges * 8 + (n + 1) * 8
    if case == "spmm_copy":
        return ids + num_edges * feat * 4 + n * feat * 4
    if case == "spmm_umule":
        return ids + num_edges * 4 + num_edges * feat * 4 + n * feat * 4
    if case == "gat_fwd":
        h, d = GAT_HEADS, GAT_DIM
        return ids + num_edges * h * 4 + num_edges * h * d * 4 + n * h * 4 + n * h * d * 4
    return None


# ----------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scales", type=int, nargs="+", default=[16, 18],
                   help="R-MAT scales (2**scale nodes) (default: 16 18)")
    p.add_argument("--edge-factor", type=int, default=16, help="R-MAT edges per node (default: 16)")
    p.add_argument("--feats", type=int, nargs="+", default=[16, 64, 256],
                   help="feature widths for the g-SpMM cases (default: 16 64 256)")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--frameworks", nargs="+", default=None,
                   help=f"subset of {SPMM_FRAMEWORKS} (default: all)")
    p.add_argument("--threads", type=int, default=2, help="threads for every framework (default: 2)")
    p.add_argument("--thp", type=int, choices=(0, 1), default=1,
                   help="THP_MEM_ALLOC_ENABLE for torch's allocator (default: 1)")
    p.add_argument("--omp-wait", choices=("passive", "active"), default="passive",
                   help="OMP_WAIT_POLICY for every framework (default passive: DGL's and "
                        "torch's OpenMP threads otherwise spin after each op and take a core "
                        "from whatever runs next on 2 cores)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--max-seconds", type=float, default=20.0,
                   help="stop repeating (after 3 runs) once a case's timed runs exceed this")
    p.add_argument("--memory", choices=("none", "fb", "all"), default="fb",
                   help="peak-memory child runs: none, forward+backward cases only, all (default: fb)")
    p.add_argument("--memory-feats", type=int, nargs="+", default=[64],
                   help="g-SpMM widths that get peak-memory runs (default: 64)")
    p.add_argument("--max-edge-gb", type=float, default=2.5,
                   help="skip materializing baselines whose [E, F] message exceeds this (GB)")
    p.add_argument("--quick", action="store_true",
                   help="small smoke run: scale 13, feats 16 64, 3 repeats")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None,
                   help="markdown output; a CSV with the same stem is written beside it "
                        "(default: experiments/results/kernels.md, kernels_quick.md with --quick)")
    args = p.parse_args(argv)
    if args.quick:
        args.scales, args.feats, args.repeat, args.memory_feats = [13], [16, 64], 3, [64]
    if args.out is None:
        args.out = RESULTS / ("kernels_quick.md" if args.quick else "kernels.md")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    env = bu.pin_environment(args.threads, bool(args.thp),
                             {"OMP_WAIT_POLICY": args.omp_wait.upper()})
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import psutil
    from tqdm import tqdm

    import ngra.kernels  # noqa: F401  (registers the backends; imports numba)

    try:
        from ngra.compat import import_dgl

        import_dgl()
        import torch_geometric  # noqa: F401
    except ImportError as exc:  # baselines are optional extras
        log.warning("baseline missing (%s): its rows will be skipped", exc)

    gc.collect()
    gc.freeze()  # the imported libraries' objects: later collections skip them
    started = time.perf_counter()
    log.info("measuring memory bandwidth ...")
    bw = bu.measure_bandwidth()
    log.info("copy %.1f GB/s, read %.1f GB/s", bw["copy_gbps"], bw["read_gbps"])
    tmp = Path(tempfile.mkdtemp(prefix="ngra_kbench_"))
    graphs = {}
    for scale in args.scales:
        log.info("building R-MAT scale %d ...", scale)
        graphs[scale] = make_graph(scale, args.edge_factor, args.seed, tmp / f"rmat{scale}.pt")

    bw_samples = [bw["copy_gbps"]]
    jobs = []
    for scale in args.scales:
        for case in args.cases:
            for feat in ([GAT_HEADS * GAT_DIM] if case.startswith("gat") else args.feats):
                for fw in frameworks_for(case):
                    if args.frameworks is None or fw in args.frameworks:
                        jobs.append((scale, case, feat, fw))
    rows = []
    for scale, case, feat, fw in tqdm(jobs, desc="kernels", unit="case"):
        g = graphs[scale]
        row = {"scale": scale, "nodes": g["num_nodes"], "edges": g["num_edges"], "case": case,
               "feat": feat, "framework": fw}
        rows.append(row)
        edge_bytes = _edge_tensor_bytes(case, g["num_edges"], feat)
        if fw == "pyg_scatter" and edge_bytes > args.max_edge_gb * 1e9:
            row["note"] = f"skipped: [E, F] message is {bu.fmt_bytes(edge_bytes)}"
            continue
        if fw == "pyg_scatter" and 5 * edge_bytes > psutil.virtual_memory().available:
            # A few [E, F] tensors live at once (messages, their gradients): do not
            # push the shared machine into the OOM killer.
            row["note"] = (f"skipped: needs ~{bu.fmt_bytes(5 * edge_bytes)}, only "
                           f"{bu.fmt_bytes(psutil.virtual_memory().available)} available")
            continue
        if fw == "torch_sparse" and case == "spmm_umule_fb" and g["num_nodes"] > 1 << 14:
            # Its gradient w.r.t. the sparse values is a dense [N, N] product, masked
            # afterwards: 17 GB at 2^16 nodes (killed by the OOM killer here).
            row["note"] = "skipped: backward to the sparse values forms a dense N x N matrix"
            continue
        try:
            run = setup_case(g["path"], case, fw, feat, args.seed)
        except ImportError as exc:
            row["note"] = f"skipped: {exc}"
            continue
        try:
            t = bu.time_fn(run, warmup=args.warmup, repeat=args.repeat, max_seconds=args.max_seconds)
        except Exception as exc:  # noqa: BLE001  (a failing baseline must not end the run)
            row["note"] = f"failed: {type(exc).__name__}: {exc}"
            log.warning("%s/%s/%s failed: %s", case, feat, fw, exc)
            continue
        finally:
            del run
        row.update(median_s=t.median, min_s=t.min, repeats=len(t.times))
        moved = _bytes_moved(case, g["num_nodes"], g["num_edges"], feat)
        if moved is not None:
            row["bytes_moved"] = moved
            row["gbps"] = moved / t.median / 1e9
            if fw == "ngra":
                # The machine is shared and its bandwidth drifts: compare against a copy
                # measured right after this case, not only the one at the start.
                now = bu.measure_bandwidth(nbytes=256 << 20, repeat=5)["copy_gbps"]
                bw_samples.append(now)
                row["copy_gbps_now"] = now
                row["bw_fraction"] = row["gbps"] / now
        want_mem = args.memory == "all" or (args.memory == "fb" and case.endswith("_fb"))
        if want_mem and (case.startswith("gat") or feat in args.memory_feats):
            try:
                mem = bu.peak_rss_in_child(setup_case, g["path"], case, fw, feat, args.seed)
                row["peak_bytes"] = mem["peak_bytes"]
                row["memory_method"] = mem["method"]
            except RuntimeError as exc:
                row["note"] = f"memory run failed: {str(exc).splitlines()[0]}"
    elapsed = time.perf_counter() - started
    bw["samples"] = bw_samples
    write_results(args, rows, graphs, bw, env, elapsed)


# ------------------------------------------------------------------------------- reporting
def _best(rows, names):
    cands = [r for r in rows if r["framework"] in names and "median_s" in r]
    return min(cands, key=lambda r: r["median_s"]) if cands else None


def summarize(rows: list[dict]) -> list[dict]:
    """One line per (scale, case, feat): ngra vs the fastest DGL and PyG/torch variants."""
    out = []
    keys = sorted({(r["scale"], CASES.index(r["case"]), r["feat"]) for r in rows})
    for scale, ci, feat in keys:
        case = CASES[ci]
        group = [r for r in rows if (r["scale"], r["case"], r["feat"]) == (scale, case, feat)]
        ngra = next((r for r in group if r["framework"] == "ngra" and "median_s" in r), None)
        dgl, pyg = _best(group, DGL), _best(group, PYG)
        pyg_mem = next((r for r in group if r["framework"] == "pyg_scatter"), {})
        dgl_mem = max((r.get("peak_bytes", -1) for r in group if r["framework"] in DGL),
                      default=-1)
        s = {"scale": scale, "case": case, "feat": feat}
        if ngra:
            s["ngra_s"] = ngra["median_s"]
            s["ngra_gbps"] = ngra.get("gbps")
            s["ngra_bw_fraction"] = ngra.get("bw_fraction")
            s["ngra_peak"] = ngra.get("peak_bytes")
        if dgl:
            s.update(dgl_s=dgl["median_s"], dgl_best=dgl["framework"])
        if pyg:
            s.update(pyg_s=pyg["median_s"], pyg_best=pyg["framework"])
        s["dgl_peak"] = dgl_mem if dgl_mem >= 0 else None
        s["pyg_peak"] = pyg_mem.get("peak_bytes")
        if ngra and dgl:
            s["ratio_dgl"] = ngra["median_s"] / dgl["median_s"]
        if ngra and pyg:
            s["ratio_pyg"] = ngra["median_s"] / pyg["median_s"]
        if s.get("ngra_peak") is not None and s.get("pyg_peak"):
            s["mem_ratio_pyg"] = s["ngra_peak"] / s["pyg_peak"]
        out.append(s)
    return out


def _targets(summary: list[dict]) -> list[str]:
    """The targets this benchmark is judged by, each marked met / missed / not measured."""
    lines = []

    def mark(ok):
        return "not measured" if ok is None else ("met" if ok else "**missed**")

    for s in summary:
        tag = f"2^{s['scale']} {s['case']} F={s['feat']}"
        r = s.get("ratio_dgl")
        if s["case"] in ("spmm_copy", "spmm_umule") and s["feat"] >= 64:
            frac = s.get("ngra_bw_fraction")
            lines.append(f"- {tag}: time <= 0.8x DGL: {mark(None if r is None else r <= 0.8)} "
                         f"({bu.fmt_ratio(r)}); >= 50% of copy bandwidth: "
                         f"{mark(None if frac is None else frac >= 0.5)} "
                         f"({'—' if frac is None else f'{100 * frac:.0f}%'})")
        if s["case"] in ("spmm_umule_fb", "gat_fb"):
            m = s.get("mem_ratio_pyg")
            lines.append(f"- {tag}: time <= 0.5x DGL: {mark(None if r is None else r <= 0.5)} "
                         f"({bu.fmt_ratio(r)}); peak <= 1/4 of PyG: "
                         f"{mark(None if m is None else m <= 0.25)} ({bu.fmt_ratio(m)})")
    return lines


def write_results(args, rows, graphs, bw, env, elapsed) -> None:
    summary = summarize(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    bu.write_csv(rows, args.out.with_suffix(".csv"))
    info = bu.machine_info()
    method = next((r["memory_method"] for r in rows if "memory_method" in r), "not measured")
    cmd = "python experiments/kernels_bench.py " + " ".join(sys.argv[1:])
    md = [
        "# Sparse kernels: ngra vs DGL vs PyG / torch.sparse",
        "",
        (f"Command: `{cmd.strip()}` ({elapsed / 60:.1f} min). Generated by "
        "`experiments/kernels_bench.py`; raw rows in "
        f"`{args.out.with_suffix('.csv').name}`."),
        "",
        "## Setup",
        "",
        (f"- Machine: {info['cpu']}, {info['cores']} cores; Python {info['python']}, torch "
        f"{info.get('torch', '?')}, numba {info.get('numba', '?')}, DGL {info.get('dgl', '—')}, "
        f"PyG {info.get('torch_geometric', '—')}; {info['date']}, git {info['git']}; "
        f"1-min load average at the end: {info.get('load_avg_1m', '?')} "
        "(the machine is shared: medians and ratios are the robust numbers)."),
        (f"- Threads: {args.threads} for every framework (`torch.set_num_threads`, "
        f"OMP/MKL/NUMBA_NUM_THREADS={env['NUMBA_NUM_THREADS']}). Allocator: "
        f"`THP_MEM_ALLOC_ENABLE={env['THP_MEM_ALLOC_ENABLE']}` for all frameworks (it affects "
        "allocations made through torch's CPU allocator); "
        f"`OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']}` for all frameworks."),
        (f"- Memory bandwidth ({args.threads} threads): at the start, 1 GiB buffers: copy "
        f"{bw['copy_gbps']:.1f} GB/s (read + write bytes / time), read {bw['read_gbps']:.1f} GB/s; "
        f"copy re-measured (256 MiB) right after each ngra forward case: "
        f"min {min(bw['samples']):.1f} / median {statistics.median(bw['samples']):.1f} / max "
        f"{max(bw['samples']):.1f} GB/s over {len(bw['samples'])} samples. The % column uses "
        "the sample taken next to that case. (For scale: DESIGN.md's ceilings measured on "
        "an idle machine are 26-29 GB/s copy, 13-15 GB/s random 512-byte row gather.)"),
        (f"- Timing: {args.warmup} warm-up run(s), then the median of {args.repeat} runs "
        f"(fewer if a case's runs exceed {args.max_seconds:.0f} s). Peak memory: fresh child "
        f"process per case, {method}; bytes above the post-setup level during one run "
        "after a warm-up run (outputs and gradients included)."),
        "- Graphs: R-MAT (a=0.57, b=c=0.19) from `ngra.datasets` (self-loops and duplicates "
        "removed, ids randomly relabeled), plus one self-loop per node; int64 ids, float32 "
        "features. " + "; ".join(
            f"2^{s}: {g['num_nodes']:,} nodes, {g['num_edges']:,} edges, max in-degree "
            f"{g['max_in_degree']:,}" for s, g in graphs.items()) + ".",
        (f"- GAT: H={GAT_HEADS} heads, D={GAT_DIM} (F column = H*D). ngra and DGL get the "
        "reverse graph prebuilt (transpose_csc / create_formats_). PyG rows are skipped "
        f"where one [E, F] message tensor would exceed {args.max_edge_gb:g} GB."),
        "",
        "## Summary",
        "",
        ("Ratios are ngra time / the faster DGL variant and ngra time / the faster of PyG "
        "scatter and torch.sparse.mm (< 1: ngra faster). BW: ngra's achieved bandwidth "
        "(bytes it must move / median time) and its fraction of the copy bandwidth measured "
        "next to it. Peak memory is measured for the forward+backward cases at "
        f"F={'/'.join(map(str, args.memory_feats))} and GAT."),
        "",
    ]
    table = []
    for s in summary:
        table.append({
            "graph": f"2^{s['scale']}", "case": s["case"], "F": s["feat"],
            "ngra": bu.fmt_seconds(s.get("ngra_s")),
            "dgl": (bu.fmt_seconds(s.get("dgl_s")) + f" ({s['dgl_best'].replace('dgl_', '')})")
            if s.get("dgl_s") else "—",
            "pyg": (bu.fmt_seconds(s.get("pyg_s")) + f" ({s['pyg_best']})")
            if s.get("pyg_s") else "—",
            "r_dgl": bu.fmt_ratio(s.get("ratio_dgl")), "r_pyg": bu.fmt_ratio(s.get("ratio_pyg")),
            "bw": "—" if s.get("ngra_gbps") is None else
            f"{s['ngra_gbps']:.1f} GB/s ({100 * s['ngra_bw_fraction']:.0f}%)",
            "mem": " / ".join(bu.fmt_bytes(s.get(k)) for k in ("ngra_peak", "dgl_peak", "pyg_peak")),
            "mem_r": bu.fmt_ratio(s.get("mem_ratio_pyg")),
        })
    md.append(bu.markdown_table(table, [
        ("graph", "graph"), ("case", "case"), ("F", "F"), ("ngra", "ngra"), ("dgl", "DGL best"),
        ("pyg", "PyG/torch best"), ("r_dgl", "ngra/DGL"), ("r_pyg", "ngra/PyG"),
        ("bw", "ngra BW (% copy)"), ("mem", "peak ngra / DGL / PyG"), ("mem_r", "mem ngra/PyG"),
    ]))
    md += ["", "## Targets", "", *(_targets(summary) or ["- (no target cases in this run)"]), ""]
    md += ["## All rows", ""]
    detail = []
    for r in rows:
        detail.append({
            "graph": f"2^{r['scale']}", "case": r["case"], "F": r["feat"], "fw": r["framework"],
            "median": bu.fmt_seconds(r.get("median_s")), "min": bu.fmt_seconds(r.get("min_s")),
            "n": r.get("repeats"), "gbps": None if r.get("gbps") is None else f"{r['gbps']:.1f}",
            "peak": bu.fmt_bytes(r.get("peak_bytes")) if "peak_bytes" in r else None,
            "note": r.get("note"),
        })
    md.append(bu.markdown_table(detail, [
        ("graph", "graph"), ("case", "case"), ("F", "F"), ("fw", "framework"),
        ("median", "median"), ("min", "min"), ("n", "runs"), ("gbps", "GB/s"),
        ("peak", "peak mem"), ("note", "note"),
    ]))
    args.out.write_text("\n".join(md) + "\n")
    log.info("wrote %s and %s", args.out, args.out.with_suffix(".csv"))


if __name__ == "__main__":
    main()
