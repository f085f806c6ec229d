"""Kernel probes quoted in issue notes (interleaved rounds, so noise hits every variant).

    python experiments/kernel_probes.py PROBE [--threads 2] [--data-root DIR]

    gspmm-output    copy-sum g-SpMM: fresh vs reused output, vs DGL
    dropout         ngra.kernels.dropout vs F.dropout, 19,717 x 500
    dropout-linear  Linear(dropout(x)) vs dropout_linear, same x
    fused-edge-bwd  G-GCN gate forward + backward: two walks, one walk, dst partials
    gat-memory      a zoo GAT step on R-MAT 2^18: live tensors vs RSS
    ggcn-floor      the G-GCN showcase step against its GEMMs and fused edge stages alone
    attention-dropout  zoo GAT steps with and without attention dropout, interleaved

``gspmm-output`` runs on R-MAT 2^18 (edge factor 16, self-loops), F=64: ngra's
``gspmm`` as called, its numba kernel into a reused output buffer, the same
kernel into a fresh ``torch.empty`` output, and DGL's ``copy_u_sum``; it prints
median times and the median of per-round ratios to DGL.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch


def _rounds(cands: dict, base: str, rounds: int = 9) -> None:
    res = {k: [] for k in cands}
    for f in cands.values():
        f(), f()
    for _ in range(rounds):
        for k, f in cands.items():
            t = time.perf_counter()
            f()
            res[k].append(time.perf_counter() - t)
    for k, ts in res.items():
        ratio = statistics.median(a / b for a, b in zip(ts, res[base]))
        print(f"{k:20s} median {statistics.median(ts) * 1e3:7.1f} ms   vs {base}: {ratio:.2f}x")


def gspmm_output(data_root: str | None) -> None:
    import ngra.kernels as K
    from ngra.compat import import_dgl
    from ngra.datasets import load
    from ngra.kernels.cpu.util import prefetch_distance, run_rows
    from ngra.kernels.cpu.gspmm import _spmm_sum

    dgl = import_dgl()
    g = load("rmat:scale=18,edge_factor=16,feat=1,classes=2,seed=0", root=data_root).graph
    g = g.add_self_loops()
    ip, ind, n = g.indptr.contiguous(), g.indices.contiguous(), g.num_nodes
    x = torch.randn(n, 64)
    xn, ipn, indn = x.numpy(), ip.numpy(), ind.numpy()
    pf = prefetch_distance(xn.strides[0])
    reused = np.empty_like(xn)

    def kernel(out: np.ndarray) -> None:
        run_rows(_spmm_sum, ipn, ipn, indn, np.zeros(1, np.int64), xn, np.zeros((1, 1), np.float32),
                 np.zeros((1, 1), np.int64), out, 1, 0, False, False, pf, row_bytes=xn.strides[0])

    dg = dgl.graph((ind, g.dst_index()), num_nodes=n)
    dg.create_formats_()
    _rounds({"ngra gspmm": lambda: K.gspmm(ip, ind, x, reduce="sum"),
             "kernel reused": lambda: kernel(reused),
             "kernel fresh": lambda: kernel(torch.empty(n, 64).numpy()),
             "dgl": lambda: dgl.ops.copy_u_sum(dg, x)}, "dgl")


def dropout() -> None:
    import torch.nn.functional as F

    from ngra.kernels import dropout as ngra_dropout

    x = torch.randn(19717, 500, requires_grad=True)
    _rounds({"F.dropout": lambda: F.dropout(x, 0.5, True),
             "ngra dropout": lambda: ngra_dropout(x, 0.5),
             "F fwd+bwd": lambda: F.dropout(x, 0.5, True).sum().backward(),
             "ngra fwd+bwd": lambda: ngra_dropout(x, 0.5).sum().backward()}, "F.dropout")


def dropout_linear() -> None:
    """A GAT first layer's input transform on PubMed's input (500 -> 64, p = 0.6), forward +
    weight gradient: the dropped copy saved by the Linear, against the fused kernel."""
    import torch.nn.functional as F

    from ngra.kernels import dropout as ngra_dropout
    from ngra.kernels import dropout_linear as fused

    x = torch.randn(19717, 500)
    w = torch.randn(64, 500, requires_grad=True)
    g = torch.randn(19717, 64)
    _rounds({"unfused fwd": lambda: F.linear(ngra_dropout(x, 0.6), w),
             "fused fwd": lambda: fused(x, [w], None, 0.6),
             "unfused f+b": lambda: F.linear(ngra_dropout(x, 0.6), w).backward(g),
             "fused f+b": lambda: fused(x, [w], None, 0.6)[0].backward(g)}, "unfused f+b")


def fused_edge_bwd(data_root: str | None) -> None:
    """The G-GCN gate ``sum_u sigmoid(a[v] + b[u]) * c[u]`` on R-MAT 2^16 (edge factor 16),
    F = 64, forward + backward of every term by three routes: the destination walk +
    source walk, the one-pass source walk (``bwd_all``, per-thread dst-gradient buffers),
    and dst partials (the forward sums ``d expr / d a``; backward is ``g * K`` and the
    source walk); also without ``c``'s gradient (a first layer, whose ``c`` is the input)."""
    import ngra.kernels.cpu.fused_edge as cpu_fe
    import ngra.kernels.fused_edge as fe
    from ngra.datasets import load
    from ngra.kernels.edge_expr import E
    from ngra.kernels.fused_edge import fused_edge_aggregate

    g = load("rmat:scale=16,edge_factor=16,feat=1,classes=2,seed=0", root=data_root).graph
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(g.num_nodes, 64, generator=gen).requires_grad_() for _ in range(3))
    expr, rev = E.sigmoid(E.dst(0) + E.src(1)) * E.src(0), g.csr()

    def step(route: str, need_c: bool):
        def f() -> None:
            fe.DST_PARTIALS = "always" if route == "partials" else "never"
            cpu_fe.ONE_PASS_BACKWARD = route == "one walk"
            out = fused_edge_aggregate(g.indptr, g.indices, expr,
                                       [c if need_c else c.detach(), b], [a], rev=rev)
            torch.autograd.grad(out, [a, b, c] if need_c else [a, b], torch.ones_like(out))
        return f

    routes = ("two walks", "one walk", "partials")
    _rounds({f"{r}{'' if need_c else ', no c'}": step(r, need_c)
             for need_c in (True, False) for r in routes}, "two walks", rounds=15)
    fe.DST_PARTIALS, cpu_fe.ONE_PASS_BACKWARD = None, True


def gat_memory(data_root: str | None) -> None:
    """One training step of the zoo GAT (2 layers, 4 heads x 16, dropout 0.6, Adam) on
    train_bench's R-MAT 2^18 x 128 features: the peak of live tensors (torch's memory
    profiler) and the peak RSS above the step's start (what train_bench's ``train MB``
    reads), each in units of one N x 64 float32 tensor. The difference is allocator
    slack; run it under ``MALLOC_MMAP_THRESHOLD_=1048576`` to see glibc's share."""
    import torch.nn.functional as F

    from ngra.datasets import load
    from ngra.memstat import peak_rss_bytes, reset_peak_rss, rss_bytes, tensor_peak_bytes
    from ngra.models import build_model, prepare

    ds = load("rmat:scale=18,edge_factor=16,feat=128,classes=8", root=data_root)
    graph, edata = prepare("gat", ds.graph)
    model = build_model("gat", ds.num_features, ds.num_classes, hidden=16, heads=4, dropout=0.6)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = model(graph, ds.x, edata)
        F.cross_entropy(out[ds.train_mask], ds.y[ds.train_mask]).backward()
        opt.step()

    unit = graph.num_nodes * 64 * 4
    step(), step()
    rss = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        reset_peak_rss()
        start = rss_bytes()
        step()
        rss.append(peak_rss_bytes() - start)
    live = tensor_peak_bytes(step)
    print(f"live tensors peak {live / 1e6:7.1f} MB = {live / unit:.2f} x N x 64 float32")
    print(f"RSS peak above step start (median of 3) {statistics.median(rss) / 1e6:7.1f} MB = "
          f"{statistics.median(rss) / unit:.2f} x")


def ggcn_floor(data_root: str | None) -> None:
    """Where the G-GCN showcase step goes (train_bench's: two GGCNConv 64 -> 64 on R-MAT
    2^16 x 16, forward + backward of ``out.sum()``): the step as the benchmark runs it;
    its 16 matrix products (6 forward linears; 4 input and 6 weight gradients) into
    preallocated outputs, i.e. at the BLAS's speed without page faults; and the two
    layers' fused edge stages (forward + backward, as ngra runs them, allocations
    included). The sum of the last two is a floor under any schedule of this math in
    float32 here; the step minus it is everything else (element-wise ops, bias sums,
    gradient accumulation, page faults)."""
    from ngra.datasets import load
    from ngra.kernels.edge_expr import E
    from ngra.kernels.fused_edge import fused_edge_aggregate
    from ngra.models import GGCNConv

    ds = load("rmat:scale=16,edge_factor=16,feat=64,classes=8", root=data_root)
    g, x = ds.graph, ds.x
    n, f = x.shape
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([GGCNConv(f, f), GGCNConv(f, f)])

    def step() -> None:
        for p in layers.parameters():
            p.grad = None
        h = x
        for layer in layers:
            h = layer(g, h)
        h.sum().backward()

    w, b = torch.randn(f, f), torch.randn(f)
    acts = [torch.randn(n, f) for _ in range(2)]
    outs = [torch.empty(n, f) for _ in range(2)]
    wout = torch.empty(f, f)

    def gemms() -> None:
        for _ in range(6):
            torch.addmm(b, acts[0], w.t(), out=outs[0])
        for _ in range(4):
            torch.mm(acts[0], w, out=outs[1])
        for _ in range(6):
            torch.mm(acts[1].t(), acts[0], out=wout)

    gen = torch.Generator().manual_seed(0)
    a1, b1, a2, b2, c2 = (torch.randn(n, f, generator=gen).requires_grad_() for _ in range(5))
    expr, rev = E.sigmoid(E.dst(0) + E.src(1)) * E.src(0), g.csr()

    def edges() -> None:
        for a, bb, c in ((a1, b1, x), (a2, b2, c2)):  # layer 1's c is the input x
            out = fused_edge_aggregate(g.indptr, g.indices, expr, [c, bb], [a], rev=rev)
            out.sum().backward()

    _rounds({"step": step, "16 GEMMs": gemms, "2 edge stages": edges}, "step", rounds=9)


def attention_dropout(data_root: str | None) -> None:
    """The zoo GAT (train_bench's: 8 heads x 8, dropout 0.6 on the inputs) with attention
    dropout 0.6 and without, on train_bench's Cora, PubMed and R-MAT 2^18: training steps
    of the two models interleaved in one process (so load hits both alike), the median
    step and the median per-round ratio, and each step's peak RSS above its start (median
    of the rounds)."""
    import torch.nn.functional as F

    from ngra.datasets import load
    from ngra.memstat import peak_rss_bytes, reset_peak_rss, rss_bytes
    from ngra.models import build_model, prepare

    graphs = {"cora": ("cora", 15), "pubmed": ("pubmed:structure", 15),
              "rmat18": ("rmat:scale=18,edge_factor=16,feat=128,classes=8", 5)}
    for name, (spec, rounds) in graphs.items():
        ds = load(spec, root=data_root, progress=False)
        graph, edata = prepare("gat", ds.graph)
        steps = {}
        for p in (0.0, 0.6):
            torch.manual_seed(0)
            model = build_model("gat", ds.num_features, ds.num_classes, attention_dropout=p)
            opt = torch.optim.Adam(model.parameters(), lr=0.005)

            def step(model=model, opt=opt, graph=graph, ds=ds, edata=edata) -> None:
                opt.zero_grad(set_to_none=True)
                out = model(graph, ds.x, edata)
                F.cross_entropy(out[ds.train_mask], ds.y[ds.train_mask]).backward()
                opt.step()

            step(), step()
            steps[p] = step
        times, peaks = {p: [] for p in steps}, {p: [] for p in steps}
        for _ in range(rounds):
            for p, step in steps.items():
                reset_peak_rss()
                start = rss_bytes()
                t = time.perf_counter()
                step()
                times[p].append(time.perf_counter() - t)
                peaks[p].append(peak_rss_bytes() - start)
        ratio = statistics.median(a / b for a, b in zip(times[0.6], times[0.0]))
        print(f"{name} ({graph.num_edges:,} edges, perm stored: {graph.has_perm}): step "
              f"{statistics.median(times[0.0]) * 1e3:.1f} ms without, "
              f"{statistics.median(times[0.6]) * 1e3:.1f} ms with (ratio {ratio:.2f}x); "
              f"step peak above start {statistics.median(peaks[0.0]) / 1e6:.0f} / "
              f"{statistics.median(peaks[0.6]) / 1e6:.0f} MB")


# every probe takes the --data-root (those on synthetic data ignore it)
PROBES = {"gspmm-output": gspmm_output, "dropout": lambda _root: dropout(),
          "dropout-linear": lambda _root: dropout_linear(), "fused-edge-bwd": fused_edge_bwd,
          "gat-memory": gat_memory, "ggcn-floor": ggcn_floor,
          "attention-dropout": attention_dropout}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probe", choices=tuple(PROBES))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data-root", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    PROBES[args.probe](args.data_root)


if __name__ == "__main__":
    main()
