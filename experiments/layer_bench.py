"""Training epochs of the conformance layers (issue 39): ngra (compiled, and the generic
UDF executor) vs PyG's and DGL's built-in layers of the same definition, and where the
step's time goes in every cell that misses its target.

Usage::

    .venv/bin/python experiments/layer_bench.py                      # cora, pubmed, rmat16
    .venv/bin/python experiments/layer_bench.py --graphs rmat18 --layers gatv2,transformer
    .venv/bin/python experiments/layer_bench.py --quick              # cora only, 3 epochs
    .venv/bin/python experiments/layer_bench.py --layers pna,pna_split --merge  # PNA: 1 vs 3 walks
    .venv/bin/python experiments/layer_bench.py --graphs cora --frameworks ngra,pyg,dgl --merge

Writes ``experiments/results/layers.md`` and ``layers.csv`` (``--name`` to change).

What is measured
    One full-graph training epoch (forward, cross-entropy on the training nodes,
    backward, Adam step) of a 2-layer model, hidden 64 (attention: 4 heads x 16), ReLU
    between the layers, no dropout, for each layer of the conformance suite
    (``tests/conformance_layers.py``: the layers the tests check against a plain-torch
    reference and against PyG; this script imports them from there so that it measures
    exactly what is tested). PyG runs its built-in layer with the weights' shapes and
    math of the ngra layer (``GATv2Conv``, ``TransformerConv``, ``GINEConv``,
    ``PNAConv``, ``EdgeConv`` with the same MLP, ``SGConv``, ``APPNP``, ``GCNConv``
    with learned edge weights); ``edge_mlp_norm`` (an edge MLP with a LayerNorm, which
    ngra runs on its generic plan on purpose: the chunked generic path) runs against a
    PyG ``MessagePassing`` with the same message; GatedGCN has no PyG built-in and runs
    on ngra only.
    Both frameworks train on the same graph (self-loops added where the layer wants
    them, as the tests do) with edges in the same (CSC) order; PyG gets ``edge_index``.
    GINE gets 8 random edge features per edge.
    DGL (``--frameworks ...,dgl``) runs its built-in layer where it has one of the same
    definition (``tests/conformance_layers.py`` ``DGL_BUILDERS``, checked against the
    ngra layers by ``test_layer_matches_dgl``: ``GATv2Conv``, ``GINEConv`` after the
    edge linear, ``EdgeConv``, ``GatedGCNConv`` without batch norm, ``SGConv``,
    ``APPNPConv``, ``GraphConv`` with learned edge weights) on a DGL graph of the same
    edges in the same order; it has no TransformerConv, its ``PNAConv`` is another
    definition, and it has no layer for the two-layer EdgeConv MLP or the LayerNorm
    edge MLP: those get "no DGL built-in". DGL's ``APPNPConv`` normalizes the source
    side by out-degree: the same layer on Cora and PubMed (symmetric), the same cost
    and another normalization on a directed R-MAT.

How
    Each (layer, graph, framework) runs in a fresh child process (this file with
    ``--child``): one warm-up epoch (numba compiles, plans), then ``--epochs`` timed
    epochs; ``time`` is their median, ``min`` the fastest. ``train MB`` is the peak RSS
    above the level after warm-up during the timed epochs (``_bench_util.PeakRSS``:
    activations and temporaries, not parameters or the graph). Threads: 2 for torch,
    OpenMP, MKL and numba, ``THP_MEM_ALLOC_ENABLE=1`` and ``OMP_WAIT_POLICY=PASSIVE``
    for every framework. A case over ``--time-cap`` seconds or ``--mem-cap-gb`` of RSS
    is killed and recorded as skipped. The machine is shared and noisy: read ratios,
    and rerun a case before trusting a small difference; the report gives the load
    average at the start and the end of the run.

Where the step goes (``split_*`` columns)
    After its timed epochs each child runs one more, instrumented, epoch with the
    characterization probes of ``ngra characterize`` (``ngra.characterize.measure``:
    ngra's stage probes, split by SAGA stage in forward and backward; for PyG and DGL
    ``torch.profiler`` with each layer call in the ``LAYER_RANGE`` record range, ops
    mapped to stages by ``ngra.characterize.stages``), then times the optimizer step
    alone. ``split_fwd`` + ``split_bwd`` + ``split_opt`` is that epoch (the
    instrumentation makes it slower than ``time``, the profiler much more so for PyG
    and DGL: read its shares, not its seconds). For every cell that misses its target
    (time above 0.8x PyG's epoch, 1.0x on Cora and for ``edge_mlp_norm``, the fallback
    layer whose target is the same layer as a PyG ``MessagePassing``; train memory
    above PyG's), the report has a section saying by how much and where each
    framework's step goes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_util as bu  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA_ROOT = os.environ.get("NGRA_DATA") or str(REPO.parent / "shared" / "data")
GRAPHS = {
    "cora": "cora",
    "pubmed": "pubmed:structure",
    "rmat16": "rmat:scale=16,edge_factor=16,feat=64,classes=8",
    "rmat18": "rmat:scale=18,edge_factor=16,feat=64,classes=8",
}
LAYERS = ("gatv2", "transformer", "gine", "pna", "edgeconv", "edgeconv_mlp", "edge_mlp_norm",
          "gatedgcn", "sgc", "appnp", "learned_gcn")
# not run by default: PNA written as three SagaLayers (moments, max, min: three walks), the
# form before per-field gathers, against ``pna`` (one walk) in the same run; ngra only
# (PyG's layer is ``pna``'s)
NGRA_ONLY = ("pna_split",)
FRAMEWORKS = ("ngra", "pyg", "dgl", "ngra-generic")
BASELINES = ("pyg", "dgl")
HIDDEN, HEADS, HEAD_DIM, EDGE_DIM = 64, 4, 16, 8
THREADS = 2
LR = 0.01


# ============================================================================ child
def _models(layer: str, f_in: int, classes: int, graph, edge_dim: int, framework: str):
    """``(ngra model, the baseline model or None, the graph to train on)`` of a 2-layer
    model; the baseline is ``framework``'s (``pyg`` or ``dgl``; None for ngra or where
    the framework has no built-in of the layer), made from the ngra model's weights."""
    import copy

    import torch
    from torch import nn
    from torch.autograd.profiler import record_function

    from ngra.characterize.stages import LAYER_RANGE

    sys.path.append(str(REPO / "tests"))  # after ngra: tests/ngra must not shadow it
    import conformance_layers as C

    def conv(kind: str, m, first, second, e):
        """One layer call; a baseline's inside the characterization's layer range."""
        if kind == "ngra":  # (graph, x, edge data); timed by ngra's probes
            return m(first, second, e)
        with record_function(LAYER_RANGE):
            if kind == "dgl":  # DGL's order is ngra's: (graph, x, edge data)
                return m(first, second, e)
            x, ei = first, second  # PyG's order: (x, edge_index, edge data)
            return m(x, ei) if e is None else m(x, ei, e)

    class Two(nn.Module):
        def __init__(self, a, b, kind: str = "ngra") -> None:
            super().__init__()
            self.a, self.b, self.kind = a, b, kind

        def forward(self, first, second, e):
            h = torch.relu(conv(self.kind, self.a, first, second, e))
            if self.kind == "pyg":
                return conv("pyg", self.b, h, second, e)
            return conv(self.kind, self.b, first, h, e)

    class Whole(nn.Module):
        """A baseline model called whole (SGC, APPNP) inside the layer range."""

        def __init__(self, m, kind: str) -> None:
            super().__init__()
            self.m, self.kind = m, kind

        def forward(self, first, second, e):
            return conv(self.kind, self.m, first, second, e)

    def pair(a, b):
        """``(ngra, baseline)`` 2-layer models of ngra layers ``a``, ``b``."""
        if framework == "pyg":
            build = getattr(C, _PYG_BUILDERS.get(layer, f"pyg_{layer}"))
        else:
            build = C.DGL_BUILDERS.get(layer) if framework == "dgl" else None
        base = Two(build(a), build(b), framework) if build is not None else None
        return Two(a, b), base

    h = HIDDEN
    if layer == "gatv2":
        g = graph.add_self_loops(order="csc")
        return (*pair(C.GATv2(f_in, HEAD_DIM, HEADS), C.GATv2(h, classes, 1)), g)
    if layer == "transformer":
        return (*pair(C.Transformer(f_in, HEAD_DIM, HEADS), C.Transformer(h, classes, 1)),
                graph)
    if layer == "gine":
        return (*pair(C.GINE(f_in, h, edge_dim), C.GINE(h, classes, edge_dim)), graph)
    if layer in ("pna", "pna_split"):
        avg = C.avg_log_degree(graph)
        hist = C.degree_histogram(graph)
        one = layer == "pna"
        a, b = C.PNA(f_in, h, avg, one_walk=one), C.PNA(h, classes, avg, one_walk=one)
        pyg_ok = one and framework == "pyg"  # DGL's PNAConv is another definition
        base = Two(C.pyg_pna(a, hist), C.pyg_pna(b, hist), "pyg") if pyg_ok else None
        return Two(a, b), base, graph
    if layer in ("edgeconv", "edgeconv_mlp"):
        cls = C.EdgeConv if layer == "edgeconv" else C.EdgeConvMLP
        return (*pair(cls(f_in, h), cls(h, classes)), graph)
    if layer == "edge_mlp_norm":  # the generic plan on purpose; PyG: a MessagePassing
        return (*pair(C.EdgeMLPNorm(f_in, h), C.EdgeMLPNorm(h, classes)), graph)
    if layer == "gatedgcn":
        class Gated(nn.Module):
            def __init__(self, like=None) -> None:
                super().__init__()
                if like is None:  # the ngra model
                    self.inp, self.a, self.b = nn.Linear(f_in, h), C.GatedGCN(h), C.GatedGCN(h)
                    self.e_in, self.out = nn.Linear(edge_dim, h), nn.Linear(h, classes)
                    self.kind = "ngra"
                else:  # DGL's GatedGCNConv with ``like``'s weights
                    self.inp, self.e_in, self.out = (copy.deepcopy(m) for m in
                                                     (like.inp, like.e_in, like.out))
                    self.a, self.b = C._DglGatedGCN(like.a), C._DglGatedGCN(like.b)
                    self.kind = "dgl"

            def forward(self, g, x, e):
                x, e = self.inp(x), self.e_in(e)
                if self.kind == "dgl":  # DGL's layer returns both updates
                    x, e = conv("dgl", self.a, g, x, e)
                    return self.out(conv("dgl", self.b, g, x, e)[0])
                x, e = self.a(g, x, e), self.a.edge_update(g, x, e)
                return self.out(self.b(g, x, e))

        model = Gated()
        return model, Gated(model) if framework == "dgl" else None, graph
    if layer in ("sgc", "appnp"):
        gg = graph.gcn_norm(order="csc")
        model = C.SGC(f_in, classes, k=2) if layer == "sgc" else C.APPNP(f_in, classes, k=2)
        build = {"pyg": C._PygSGC if layer == "sgc" else C._PygAPPNP,
                 "dgl": C.DGL_BUILDERS[layer]}.get(framework)
        return model, Whole(build(model), framework) if build else None, gg
    if layer == "learned_gcn":
        return (*pair(C.LearnedEdgeGCN(f_in, h), C.LearnedEdgeGCN(h, classes)), graph)
    raise SystemExit(f"unknown layer {layer!r}; choose from {LAYERS + NGRA_ONLY}")


# PyG builders of tests/conformance_layers.py not named ``pyg_<layer>``
_PYG_BUILDERS = {"edgeconv_mlp": "pyg_edgeconv", "learned_gcn": "_PygLearnedGCN"}


def run_child(layer: str, gname: str, framework: str, epochs: int, split: bool = True) -> dict:
    import torch
    import torch.nn.functional as F

    import ngra
    import ngra.datasets as D

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    ds = D.load(GRAPHS[gname], root=DATA_ROOT, progress=False)
    x, y, mask = ds.x, ds.y, ds.train_mask
    ngra_model, base_model, g = _models(layer, ds.num_features, ds.num_classes, ds.graph,
                                        EDGE_DIM, framework)
    e = None  # edge data in CSC order (ngra gets it in the graph's original order)
    if layer in ("gine", "gatedgcn"):
        e = torch.randn(g.num_edges, EDGE_DIM)
    elif layer in ("sgc", "appnp"):
        src, dst = g.edge_index(order="csc")
        deg = torch.bincount(dst, minlength=g.num_nodes).float().pow(-0.5)
        e = deg[src] * deg[dst]
    elif layer == "learned_gcn":
        e = torch.nn.Parameter(torch.zeros(g.num_edges))
    plan = ""
    if framework == "pyg":
        if base_model is None:
            return {"status": "no PyG built-in"}
        model, ei = base_model, g.edge_index(order="csc")

        def forward():  # edge data in CSC order, as edge_index
            return model(x, ei, e)
    elif framework == "dgl":
        if base_model is None:
            return {"status": "no DGL built-in"}
        from ngra.compat import import_dgl

        dgl = import_dgl()
        model = base_model
        src, dst = g.edge_index(order="csc")
        dg = dgl.graph((src, dst), num_nodes=g.num_nodes)
        dg.create_formats_()  # CSC/CSR once, outside the timed epochs

        def forward():  # edge data in CSC order, as the DGL graph's edges
            return model(dg, x, e)
    else:
        ngra.compiler.set_enabled(framework == "ngra")
        model = ngra_model
        e_orig = None if e is None else g.to_original_order(e.detach()).requires_grad_(
            e.requires_grad)
        if isinstance(e, torch.nn.Parameter):
            e_orig = torch.nn.Parameter(e_orig.detach())
        e_use = e_orig
        first = next((m for m in model.modules() if isinstance(m, ngra.SagaLayer)), None)
        if framework == "ngra" and first is not None:
            with torch.no_grad():
                x0 = x
                if layer == "gatedgcn":
                    x0 = model.inp(x)
                    text = ngra.explain(first, g, x0, model.e_in(e_use))
                elif layer == "appnp":
                    h0 = model.lin(x)
                    text = ngra.explain(first, g, {"h": h0, "h0": h0}, e_use)
                else:
                    text = ngra.explain(first, g, x0, e_use)
            plan = next((ln.split(":", 1)[1].strip() for ln in text.splitlines()
                         if ln.startswith("plan:")), "")

        def forward():
            return model(g, x, e_use)

    params = list(model.parameters())
    if framework not in BASELINES and isinstance(e_use, torch.nn.Parameter):
        params.append(e_use)
    elif framework in BASELINES and isinstance(e, torch.nn.Parameter):
        params.append(e)
    opt = torch.optim.Adam(params, lr=LR)

    def step():
        opt.zero_grad(set_to_none=True)
        out = forward()
        F.cross_entropy(out[mask], y[mask]).backward()
        opt.step()

    step()  # warm-up
    bu.malloc_trim()
    times = []
    with bu.PeakRSS() as peak:
        for _ in range(epochs):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    res = {"status": "ok", "time": statistics.median(times), "min": min(times),
           "train_mb": peak.delta / 2**20, "plan": plan, "edges": g.num_edges,
           "nodes": g.num_nodes}
    if split:
        res.update(_split_epoch(model, forward, opt, framework, layer, y, mask, g.num_edges))
    return res


@dataclasses.dataclass(frozen=True)
class _StepData:
    """What ``ngra.characterize.measure``'s training step reads of its workload."""

    train_mask: object
    y: object
    model: str  # the characterization's model rule (which stage a baseline's linears are)
    num_edges: int


# layers whose linears before the first sparse op are edge-side (attention projections,
# GINE's edge linear runs per edge): the characterization's rule of its GAT / GIN
_STAGE_RULE = {"gatv2": "gat", "transformer": "gat", "gine": "gin"}


def _split_epoch(model, forward, opt, framework: str, layer: str, y, mask,
                 num_edges: int) -> dict:
    """One instrumented epoch (see "Where the step goes" in the module docstring):
    ``split_fwd``, ``split_bwd``, ``split_opt`` seconds and ``split_{fwd,bwd}_<stage>``
    per SAGA stage (what no stage holds is the rest of ``split_fwd`` / ``split_bwd``)."""
    from ngra.characterize import measure  # the probes `ngra characterize` runs

    step = measure._Step(model, forward, _StepData(mask, y, _STAGE_RULE.get(layer, layer),
                                                   num_edges), True)
    if framework in BASELINES:
        total, ftot, fwd, bwd, _ = measure._profile_iteration(step, framework)
    else:
        total, ftot, fwd, bwd, _ = measure._ngra_iteration(step)
    t0 = time.perf_counter()
    opt.step()
    out = {"split_fwd": ftot, "split_bwd": total - ftot,
           "split_opt": time.perf_counter() - t0}
    for phase, stages in (("fwd", fwd), ("bwd", bwd)):
        out.update({f"split_{phase}_{k}": v for k, v in stages.items()})
    return out


# ============================================================================ parent
def _env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[k] = str(THREADS)
    env.update(THP_MEM_ALLOC_ENABLE="1", OMP_WAIT_POLICY="PASSIVE", TQDM_DISABLE="1")
    return env


def run_case(layer: str, gname: str, fw: str, epochs: int, time_cap: float,
             mem_cap_mb: float, split: bool = True) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", layer, gname, fw,
           str(epochs)] + ([] if split else ["--no-split"])
    found, status, peak = bu.run_capped(cmd, time_cap, mem_cap_mb, env=_env(), cwd=str(REPO))
    res = found if found is not None else {"status": status}
    res.update(layer=layer, graph=gname, framework=fw)
    return res


_KEY = ("layer", "graph", "framework")
_STAGES = ("Scatter", "ApplyEdge", "Gather", "ApplyVertex")  # ngra.characterize.stages
_SPLIT_COLS = ("split_fwd", "split_bwd", "split_opt") + tuple(
    f"split_{p}_{st}" for p in ("fwd", "bwd") for st in _STAGES)


def _read_rows(path: Path) -> list[dict]:
    return bu.read_csv(path, numbers=("time", "min", "train_mb") + _SPLIT_COLS)


def _git_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, cwd=REPO, check=False)
    return out.stdout.strip() or "unknown"


def _ok(r: dict) -> bool:
    return r.get("status") == "ok"


def _ratio(a: dict, b: dict, k: str) -> float | None:
    return a[k] / b[k] if _ok(a) and _ok(b) and b[k] else None


def time_target(layer: str, gname: str) -> float:
    """Issue 39's time target, ngra / PyG: 1.0x on Cora and for the layer that falls
    back to the generic path (against the same layer as a PyG ``MessagePassing``),
    0.8x elsewhere (R-MAT 2^18 and PubMed; R-MAT 2^16 is held to R-MAT 2^18's)."""
    return 1.0 if gname == "cora" or layer == "edge_mlp_norm" else 0.8


def missed(rows: list[dict]) -> list[tuple[str, str, list[str]]]:
    """``(layer, graph, what was missed)`` of every cell over its time or memory target."""
    by = {tuple(r[k] for k in _KEY): r for r in rows}
    out = []
    for (layer, gname, fw), n in by.items():
        p = by.get((layer, gname, "pyg"), {})
        if fw != "ngra" or not (_ok(n) and _ok(p)):
            continue
        what = []
        t, m, target = _ratio(n, p, "time"), _ratio(n, p, "train_mb"), time_target(layer, gname)
        if t is not None and t > target:
            what.append(f"time {t:.2f}x PyG's (target {target:.1f}x: missed by "
                        f"{t - target:.2f}x)")
        if m is not None and m > 1.0:
            what.append(f"train memory {m:.2f}x PyG's (target 1.0x: missed by {m - 1:.2f}x)")
        if what:
            out.append((layer, gname, what))
    return out


def describe_split(r: dict) -> str:
    """Where one row's instrumented epoch went, in shares of that epoch."""
    if not _ok(r):
        return r.get("status", "not run")
    if r.get("split_fwd") is None:
        return f"{r['time']:.3f} s an epoch; no stage split (a row of an earlier run)"
    fwd, bwd, opt = r["split_fwd"], r["split_bwd"], r["split_opt"]
    total = fwd + bwd + opt

    def pct(v: float) -> str:
        return f"{100 * v / total:.0f}%" if total > 0 else "-"

    def stages(phase: str, whole: float) -> str:
        vals = {st: r.get(f"split_{phase}_{st}") or 0.0 for st in _STAGES}
        parts = [f"{st} {pct(v)}" for st, v in vals.items() if v > 0.005 * total]
        parts.append(f"rest {pct(max(whole - sum(vals.values()), 0.0))}")
        return ", ".join(parts)

    return (f"{r['time']:.3f} s an epoch ({total:.3f} s instrumented): forward {pct(fwd)} "
            f"({stages('fwd', fwd)}), backward {pct(bwd)} ({stages('bwd', bwd)}), "
            f"optimizer {pct(opt)}")


def write_report(rows: list[dict], path: Path, meta: dict) -> None:
    by = {tuple(r[k] for k in _KEY): r for r in rows}
    order = list(GRAPHS)  # merged rows: the graphs in GRAPHS's order, then any other
    graphs = sorted(dict.fromkeys(r["graph"] for r in rows),
                    key=lambda g: order.index(g) if g in order else len(order))
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    lines = ["# Conformance layers: training epoch, ngra vs PyG and DGL", "",
             f"Generated by `{meta['command']}` at commit {meta['commit']} on {meta['date']}"
             + (" (--merge: rows of earlier runs, possibly of earlier commits, kept; the CSV "
                "lists them first)" if "--merge" in meta["command"] else "") + "; "
             f"{THREADS} threads, THP on, median of {meta['epochs']} epochs after one warm-up "
             "(each case in its own process). Ratios are ngra / PyG and ngra / DGL (below 1: "
             "ngra faster or smaller). The machine is shared: treat differences under ~20% "
             f"as noise (load average {meta['load']}).", ""]

    def s(r):
        return f"{r['time']:.3f}" if _ok(r) else r.get("status", "-")

    def mb(r):
        return f"{r['train_mb']:.0f}" if _ok(r) else "-"

    def ratio(a, b, k):
        v = _ratio(a, b, k)
        return "-" if v is None else f"{v:.2f}x"

    head = ["layer", "ngra plan (first layer)", "ngra s", "PyG s", "time ngra/PyG",
            "ngra train MB", "PyG train MB", "memory ngra/PyG", "DGL s", "time ngra/DGL",
            "DGL train MB", "memory ngra/DGL", "ngra-generic s"]
    for gname in graphs:
        body = []
        for layer in layers:
            n, p, d, gen = (by.get((layer, gname, fw), {}) for fw in
                            ("ngra", "pyg", "dgl", "ngra-generic"))
            if layer in NGRA_ONLY and not n:
                continue  # a comparison row only where it was run
            body.append([layer, n.get("plan", "") or "-", s(n), s(p), ratio(n, p, "time"),
                         mb(n), mb(p), ratio(n, p, "train_mb"), s(d), ratio(n, d, "time"),
                         mb(d), ratio(n, d, "train_mb"), s(gen)])
        table = bu.markdown_table([dict(enumerate(r)) for r in body], list(enumerate(head)))
        lines += [f"## {gname}", "", table, ""]
    miss = sorted(missed(rows), key=lambda m: graphs.index(m[1]))
    lines += ["## Missed targets: where the step goes", "",
              "Targets (issue 39): ngra's epoch at most 0.8x PyG's (1.0x on Cora and for "
              "`edge_mlp_norm`, the fallback layer, against the same layer as a PyG "
              "MessagePassing), train memory at most PyG's. Each framework's split is one "
              "more, instrumented, epoch of the same child (ngra: the characterization's "
              "stage probes; PyG and DGL: torch.profiler with the characterization's op-to-"
              "stage mapping, whose overhead inflates their instrumented epoch): shares of "
              "that epoch; `rest` is what no SAGA stage holds (the loss, activations between "
              "layers, framework overhead, and for ngra the backward between probe markers). "
              "As in `ngra characterize`, ngra's fused edge kernels count as Gather, and a "
              "generic plan's edge stage (the chunked path: `edge_mlp_norm`) has no inner "
              "probes and is left in `rest`.",
              ""]
    if not miss:
        lines += ["Every measured cell meets its targets.", ""]
    for layer, gname, what in miss:
        lines += [f"### {layer} on {gname}", "", "Missed: " + "; ".join(what) + ".", ""]
        for fw, label in (("ngra", "ngra"), ("pyg", "PyG"), ("dgl", "DGL")):
            r = by.get((layer, gname, fw))
            if r is not None:
                lines.append(f"- {label}: {describe_split(r)}")
        lines.append("")
    path.write_text("\n".join(lines) + "\n")


def _load() -> str:
    return ", ".join(f"{v:.1f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=4, metavar=("LAYER", "GRAPH", "FRAMEWORK", "EPOCHS"))
    ap.add_argument("--graphs", default="cora,pubmed,rmat16")
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="cora only, 3 epochs")
    ap.add_argument("--time-cap", type=float, default=600.0)
    ap.add_argument("--mem-cap-gb", type=float, default=16.0)
    ap.add_argument("--name", default="layers")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of <name>.csv that this run does not measure again")
    ap.add_argument("--no-split", action="store_true",
                    help="skip the instrumented epoch that splits the step by stage")
    args = ap.parse_args(argv)
    if args.child:
        layer, gname, fw, epochs = args.child
        res = run_child(layer, gname, fw, int(epochs), split=not args.no_split)
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    for fw in args.frameworks.split(","):
        if fw not in FRAMEWORKS:
            raise SystemExit(f"unknown framework {fw!r}; choose from {FRAMEWORKS}")
    graphs = ["cora"] if args.quick else args.graphs.split(",")
    epochs = 3 if args.quick else args.epochs
    load_start = _load()
    rows = []
    for gname in graphs:
        for layer in args.layers.split(","):
            for fw in args.frameworks.split(","):
                if layer in NGRA_ONLY and fw != "ngra":
                    continue
                r = run_case(layer, gname, fw, epochs, args.time_cap, args.mem_cap_gb * 1024,
                             split=not args.no_split)
                print(json.dumps(r), flush=True)
                rows.append(r)
    out = REPO / "experiments" / "results"
    if args.merge and (out / f"{args.name}.csv").exists():
        rows = bu.merge_rows(_read_rows(out / f"{args.name}.csv"), rows, _KEY)
    bu.write_csv(rows, out / f"{args.name}.csv")
    meta = {"command": "python experiments/layer_bench.py " + " ".join(argv or sys.argv[1:]),
            "commit": _git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "epochs": epochs, "load": f"1/5/15 min: {load_start} at the start, {_load()} at "
                                      "the end, on 2 cores"}
    write_report(rows, out / f"{args.name}.md", meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
