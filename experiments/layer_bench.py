"""Training epochs of the conformance layers (issue 39): ngra (compiled, and the generic
UDF executor) vs PyG's built-in layer of the same definition.

Usage::

    .venv/bin/python experiments/layer_bench.py                      # cora, pubmed, rmat16
    .venv/bin/python experiments/layer_bench.py --graphs rmat18 --layers gatv2,transformer
    .venv/bin/python experiments/layer_bench.py --quick              # cora only, 3 epochs
    .venv/bin/python experiments/layer_bench.py --layers pna,pna_split --merge  # PNA: 1 vs 3 walks

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

How
    Each (layer, graph, framework) runs in a fresh child process (this file with
    ``--child``): one warm-up epoch (numba compiles, plans), then ``--epochs`` timed
    epochs; ``time`` is their median, ``min`` the fastest. ``train MB`` is the peak RSS
    above the level after warm-up during the timed epochs (``_bench_util.PeakRSS``:
    activations and temporaries, not parameters or the graph). Threads: 2 for torch,
    OpenMP, MKL and numba, ``THP_MEM_ALLOC_ENABLE=1`` and ``OMP_WAIT_POLICY=PASSIVE``
    for every framework. A case over ``--time-cap`` seconds or ``--mem-cap-gb`` of RSS
    is killed and recorded as skipped. The machine is shared and noisy: read ratios,
    and rerun a case before trusting a small difference.
"""

from __future__ import annotations

import argparse
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
FRAMEWORKS = ("ngra", "pyg", "ngra-generic")
HIDDEN, HEADS, HEAD_DIM, EDGE_DIM = 64, 4, 16, 8
THREADS = 2
LR = 0.01


# ============================================================================ child
def _models(layer: str, f_in: int, classes: int, graph, edge_dim: int):
    """``(ngra model, pyg model or None, the graph to train on)`` of a 2-layer model."""
    import torch
    from torch import nn

    sys.path.append(str(REPO / "tests"))  # after ngra: tests/ngra must not shadow it
    import conformance_layers as C

    class Two(nn.Module):
        def __init__(self, a, b, pyg: bool = False) -> None:
            super().__init__()
            self.a, self.b, self.pyg = a, b, pyg

        def forward(self, first, second, e):
            if self.pyg:  # PyG's order: (x, edge_index, edge data)
                x, ei = first, second
                return self._call(self.b, torch.relu(self._call(self.a, x, ei, e)), ei, e)
            g, x = first, second
            return self.b(g, torch.relu(self.a(g, x, e)), e)

        @staticmethod
        def _call(m, x, ei, e):
            return m(x, ei) if e is None else m(x, ei, e)

    h = HIDDEN
    if layer == "gatv2":
        g = graph.add_self_loops(order="csc")
        a, b = C.GATv2(f_in, HEAD_DIM, HEADS), C.GATv2(h, classes, 1)
        return Two(a, b), Two(C.pyg_gatv2(a), C.pyg_gatv2(b), True), g
    if layer == "transformer":
        a, b = C.Transformer(f_in, HEAD_DIM, HEADS), C.Transformer(h, classes, 1)
        return Two(a, b), Two(C.pyg_transformer(a), C.pyg_transformer(b), True), graph
    if layer == "gine":
        a, b = C.GINE(f_in, h, edge_dim), C.GINE(h, classes, edge_dim)
        return Two(a, b), Two(C.pyg_gine(a), C.pyg_gine(b), True), graph
    if layer in ("pna", "pna_split"):
        avg = C.avg_log_degree(graph)
        hist = C.degree_histogram(graph)
        one = layer == "pna"
        a, b = C.PNA(f_in, h, avg, one_walk=one), C.PNA(h, classes, avg, one_walk=one)
        pyg = Two(C.pyg_pna(a, hist), C.pyg_pna(b, hist), True) if one else None
        return Two(a, b), pyg, graph
    if layer in ("edgeconv", "edgeconv_mlp"):
        cls = C.EdgeConv if layer == "edgeconv" else C.EdgeConvMLP
        a, b = cls(f_in, h), cls(h, classes)
        return Two(a, b), Two(C.pyg_edgeconv(a), C.pyg_edgeconv(b), True), graph
    if layer == "edge_mlp_norm":  # the generic plan on purpose; PyG: a MessagePassing
        a, b = C.EdgeMLPNorm(f_in, h), C.EdgeMLPNorm(h, classes)
        return Two(a, b), Two(C.pyg_edge_mlp_norm(a), C.pyg_edge_mlp_norm(b), True), graph
    if layer == "gatedgcn":
        class Gated(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inp, self.a, self.b = nn.Linear(f_in, h), C.GatedGCN(h), C.GatedGCN(h)
                self.e_in, self.out = nn.Linear(edge_dim, h), nn.Linear(h, classes)

            def forward(self, g, x, e):
                x, e = self.inp(x), self.e_in(e)
                x, e = self.a(g, x, e), self.a.edge_update(g, x, e)
                return self.out(self.b(g, x, e))

        return Gated(), None, graph
    if layer in ("sgc", "appnp"):
        gg = graph.gcn_norm(order="csc")
        model = C.SGC(f_in, classes, k=2) if layer == "sgc" else C.APPNP(f_in, classes, k=2)
        pyg = C._PygSGC(model) if layer == "sgc" else C._PygAPPNP(model)
        return model, pyg, gg
    if layer == "learned_gcn":
        a, b = C.LearnedEdgeGCN(f_in, h), C.LearnedEdgeGCN(h, classes)
        return Two(a, b), Two(C._PygLearnedGCN(a), C._PygLearnedGCN(b), True), graph
    raise SystemExit(f"unknown layer {layer!r}; choose from {LAYERS + NGRA_ONLY}")


def run_child(layer: str, gname: str, framework: str, epochs: int) -> dict:
    import torch
    import torch.nn.functional as F

    import ngra
    import ngra.datasets as D

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    ds = D.load(GRAPHS[gname], root=DATA_ROOT, progress=False)
    x, y, mask = ds.x, ds.y, ds.train_mask
    ngra_model, pyg_model, g = _models(layer, ds.num_features, ds.num_classes, ds.graph,
                                       EDGE_DIM)
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
        if pyg_model is None:
            return {"status": "no PyG built-in"}
        model, ei = pyg_model, g.edge_index(order="csc")

        def forward():  # edge data in CSC order, as edge_index
            return model(x, ei, e)
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
    if framework != "pyg" and isinstance(e_use, torch.nn.Parameter):
        params.append(e_use)
    elif framework == "pyg" and isinstance(e, torch.nn.Parameter):
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
    return {"status": "ok", "time": statistics.median(times), "min": min(times),
            "train_mb": peak.delta / 2**20, "plan": plan, "edges": g.num_edges,
            "nodes": g.num_nodes}


# ============================================================================ parent
def _env() -> dict[str, str]:
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[k] = str(THREADS)
    env.update(THP_MEM_ALLOC_ENABLE="1", OMP_WAIT_POLICY="PASSIVE", TQDM_DISABLE="1")
    return env


def run_case(layer: str, gname: str, fw: str, epochs: int, time_cap: float,
             mem_cap_mb: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", layer, gname, fw,
           str(epochs)]
    found, status, peak = bu.run_capped(cmd, time_cap, mem_cap_mb, env=_env(), cwd=str(REPO))
    res = found if found is not None else {"status": status}
    res.update(layer=layer, graph=gname, framework=fw)
    return res


def _read_rows(path: Path) -> list[dict]:
    import csv

    rows = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            for k in ("time", "min", "train_mb"):
                if r.get(k):
                    r[k] = float(r[k])
            rows.append(r)
    return rows


def _merge(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` with each (layer, graph, framework) that ``new`` measured replaced."""
    key = lambda r: (r["layer"], r["graph"], r["framework"])  # noqa: E731
    fresh = {key(r) for r in new}
    return [r for r in old if key(r) not in fresh] + new


def _git_commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, cwd=REPO, check=False)
    return out.stdout.strip() or "unknown"


def write_report(rows: list[dict], path: Path, meta: dict) -> None:
    by = {(r["layer"], r["graph"], r["framework"]): r for r in rows}
    graphs = list(dict.fromkeys(r["graph"] for r in rows))
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    lines = ["# Conformance layers: training epoch, ngra vs PyG", "",
             f"Generated by `{meta['command']}` at commit {meta['commit']} on {meta['date']}"
             + (" (--merge: rows of earlier runs, possibly of earlier commits, kept; the CSV "
                "lists them first)" if "--merge" in meta["command"] else "") + "; "
             f"{THREADS} threads, THP on, median of {meta['epochs']} epochs after one warm-up "
             "(each case in its own process). Ratios are ngra / PyG (below 1: ngra faster "
             "or smaller). The machine is shared: treat differences under ~20% as noise.", ""]
    for gname in graphs:
        head = ["layer", "ngra plan (first layer)", "ngra s", "PyG s", "time ngra/PyG",
                "ngra train MB", "PyG train MB", "memory ngra/PyG", "ngra-generic s"]
        body = []
        for layer in layers:
            n = by.get((layer, gname, "ngra"), {})
            p = by.get((layer, gname, "pyg"), {})
            gen = by.get((layer, gname, "ngra-generic"), {})
            if layer in NGRA_ONLY and not n:
                continue  # a comparison row only where it was run

            def s(r):
                return f"{r['time']:.3f}" if r.get("status") == "ok" else r.get("status", "-")

            def mb(r):
                return f"{r['train_mb']:.0f}" if r.get("status") == "ok" else "-"

            def ratio(a, b, k):
                ok = a.get("status") == "ok" and b.get("status") == "ok" and b[k] > 0
                return f"{a[k] / b[k]:.2f}x" if ok else "-"

            body.append([layer, n.get("plan", "") or "-", s(n), s(p), ratio(n, p, "time"),
                         mb(n), mb(p), ratio(n, p, "train_mb"), s(gen)])
        table = bu.markdown_table([dict(enumerate(r)) for r in body], list(enumerate(head)))
        lines += [f"## {gname}", "", table, ""]
    path.write_text("\n".join(lines) + "\n")


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
    args = ap.parse_args(argv)
    if args.child:
        layer, gname, fw, epochs = args.child
        print("RESULT " + json.dumps(run_child(layer, gname, fw, int(epochs))), flush=True)
        return 0
    graphs = ["cora"] if args.quick else args.graphs.split(",")
    epochs = 3 if args.quick else args.epochs
    rows = []
    for gname in graphs:
        for layer in args.layers.split(","):
            for fw in args.frameworks.split(","):
                if layer in NGRA_ONLY and fw != "ngra":
                    continue
                r = run_case(layer, gname, fw, epochs, args.time_cap, args.mem_cap_gb * 1024)
                print(json.dumps(r), flush=True)
                rows.append(r)
    out = REPO / "experiments" / "results"
    if args.merge and (out / f"{args.name}.csv").exists():
        rows = _merge(_read_rows(out / f"{args.name}.csv"), rows)
    bu.write_csv(rows, out / f"{args.name}.csv")
    meta = {"command": "python experiments/layer_bench.py " + " ".join(argv or sys.argv[1:]),
            "commit": _git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "epochs": epochs}
    write_report(rows, out / f"{args.name}.md", meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
