"""Manual timing check (not a test): ngra.kernels.gspmm vs DGL update_all on R-MAT graphs.

    .venv/bin/python tests/kernels/perf_gspmm_vs_dgl.py --scale 16 --feat 64 --reps 21

Runs every candidate in turn, ``reps`` rounds, and prints min and median wall
time per call (2 threads unless ``--threads``) and the median process CPU time
(all threads; less sensitive than wall time to other load on a shared machine). Same setting for both
frameworks: ``THP_MEM_ALLOC_ENABLE=1`` (torch huge-page allocator; set it to 0
in the environment to compare without), fresh output tensors each call, DGL
graph formats created up front, ngra given the reverse CSR (``rev``) the way
a layer holding an ``ngra.Graph`` passes ``graph.csr()``. The benchmark proper
is ``experiments/kernels_bench.py``; this is the kernel owner's quick check.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# Before torch is imported: huge pages for torch's allocator, as experiments/ use.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import numpy as np
import torch

from ngra.compat import import_dgl
from ngra.kernels import gspmm, transpose_csc


def rmat(scale: int, avg_deg: int, gen: np.random.Generator, a=0.57, b=0.19, c=0.19):
    """R-MAT edges (src, dst) on 2^scale vertices (Graph500 parameters)."""
    n, m = 1 << scale, (1 << scale) * avg_deg
    src = np.zeros(m, np.int64)
    dst = np.zeros(m, np.int64)
    for bit in range(scale):
        r = gen.random(m)
        src |= (r >= a + b).astype(np.int64) << bit
        dst |= (((r >= a) & (r < a + b)) | (r >= a + b + c)).astype(np.int64) << bit
    return torch.from_numpy(src), torch.from_numpy(dst), n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=int, default=16)
    p.add_argument("--degree", type=int, default=16)
    p.add_argument("--feat", type=int, default=64)
    p.add_argument("--reps", type=int, default=21)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--only", default="", help="comma-separated candidate names")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dgl = import_dgl()
    import dgl.function as fn

    src, dst, n = rmat(args.scale, args.degree, np.random.default_rng(0))
    perm = torch.argsort(dst, stable=True)
    indices = src[perm].contiguous()
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(dst, minlength=n), 0, out=indptr[1:])
    indices32 = indices.int()
    num_edges = indices.numel()
    rev = transpose_csc(indptr, indices, n)
    g = dgl.graph((src, dst), num_nodes=n)
    g.create_formats_()

    x = torch.randn(n, args.feat)
    w = torch.randn(num_edges)  # CSC order (ngra)
    w_dgl = torch.empty_like(w)
    w_dgl[perm] = w  # original edge order (DGL)
    xg, wg, wdg = (t.clone().requires_grad_() for t in (x, w, w_dgl))
    ones = torch.ones(n, args.feat)

    def dgl_run(h, e, backward):
        g.srcdata["h"] = h
        if e is None:
            g.update_all(fn.copy_u("h", "m"), fn.sum("m", "o"))
        else:
            g.edata["w"] = e.unsqueeze(1)  # [E, 1]: DGL's broadcast form
            g.update_all(fn.u_mul_e("h", "w", "m"), fn.sum("m", "o"))
        out = g.dstdata["o"]
        if backward:
            out.backward(ones)
        return out

    def ngra_run(h, e, backward, idx=indices, r=rev):
        out = gspmm(indptr, idx, h, e, rev=r)
        if backward:
            out.backward(ones)
        return out

    with torch.no_grad():
        torch.testing.assert_close(
            ngra_run(x, w, False), dgl_run(x, w_dgl, False), rtol=1e-4, atol=1e-4
        )

    cands = {
        "dgl copy_u sum fwd": lambda: dgl_run(x, None, False),
        "ngra copy sum fwd": lambda: ngra_run(x, None, False),
        "ngra copy sum fwd int32": lambda: ngra_run(x, None, False, indices32),
        "dgl u_mul_e sum fwd": lambda: dgl_run(x, w_dgl, False),
        "ngra u_mul_e sum fwd": lambda: ngra_run(x, w, False),
        "dgl copy_u sum fwd+bwd": lambda: dgl_run(xg, None, True),
        "ngra copy sum fwd+bwd": lambda: ngra_run(xg, None, True),
        "ngra copy sum fwd+bwd (no rev)": lambda: ngra_run(xg, None, True, r=None),
        "dgl u_mul_e sum fwd+bwd": lambda: dgl_run(xg, wdg, True),
        "ngra u_mul_e sum fwd+bwd": lambda: ngra_run(xg, wg, True),
    }
    if args.only:
        keep = args.only.split(",")
        cands = {k: v for k, v in cands.items() if any(s in k for s in keep)}
    times: dict[str, list[float]] = {k: [] for k in cands}
    cpu: dict[str, list[float]] = {k: [] for k in cands}
    for name, f in cands.items():  # warm up: compile, allocate
        with torch.no_grad() if "bwd" not in name else torch.enable_grad():
            f()
    for _ in range(args.reps):
        for name, f in cands.items():
            for t in (xg, wg, wdg):
                t.grad = None
            with torch.no_grad() if "bwd" not in name else torch.enable_grad():
                c0, t0 = time.process_time(), time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
    gathered = num_edges * args.feat * 4 + n * args.feat * 4 + num_edges * 8
    print(
        f"R-MAT scale {args.scale}: N={n} E={num_edges} F={args.feat}, "
        f"{torch.get_num_threads()} threads, {args.reps} reps"
    )
    for name, ts in times.items():
        best, med = min(ts) * 1e3, statistics.median(ts) * 1e3
        cpu_med = statistics.median(cpu[name]) * 1e3
        gbs = f"  {gathered / best / 1e6:5.1f} GB/s" if "fwd+bwd" not in name else ""
        print(f"  {name:32s} min {best:8.2f} ms  median {med:8.2f} ms  cpu {cpu_med:8.2f} ms{gbs}")


if __name__ == "__main__":
    main()
