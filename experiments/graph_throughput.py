"""Graph-classification training throughput: ngra's GIN against PyG's, 100,000 small graphs.

The data (seeded, built in a few vectorized numpy passes): ``--graphs`` graphs (100,000)
of ``n ~ U{10..60}`` vertices each, every graph ``round(n * degree / 2)`` random vertex
pairs stored in both directions (so an average in-degree of about ``degree``, 4),
``N(0, 1)`` node features ``--features`` (32) wide, and a label that depends on the
graph (its size bucket: 4 classes), so that the loss falls and both models do real work.

The model (what ``ngra.fit(task="graph", model="gin")`` builds, with PyG's definition
beside it): ``--layers`` (3) GIN layers ``MLP((1 + eps) h_v + sum_u h_u)``, MLP ``Linear ->
ReLU -> Linear`` 64 wide, learnable eps, ReLU between layers, sum readout, a Linear to the
classes; Adam (lr 0.01), cross-entropy, batches of 128 graphs reshuffled every epoch.

* ngra: :class:`ngra.datasets.GraphLoader` batches (one vectorized gather per batch) into
  :class:`ngra.training.graph_task.GraphModel` over the zoo's GIN encoder, the step the
  training loop takes (zero_grad, forward, loss, a finiteness check, backward, step);
* PyG: ``torch_geometric.loader.DataLoader`` over a list of ``Data`` (views of the same
  arrays) into ``GINConv`` layers and ``global_add_pool``, the same step.

Measuring: after ``--warmup`` batches each, the two alternate in rounds of ``--window``
batches (so that load from other processes on the machine falls on both alike); a round's
figure is its graphs over its wall-clock seconds, loader time included (batching is part
of training). The table gives the median and range over ``--rounds`` rounds, and the
median over rounds of ngra's rate over PyG's in the same round (robust to a load that
changes between rounds). One process,
2 threads and the allocator setting pinned for both (``_bench_util.pin_environment``).
Writes ``experiments/results/graph_throughput.md`` and ``.csv``::

    python experiments/graph_throughput.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_util as bu  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
HIDDEN, LR, CLASSES = 64, 0.01, 4


def synthetic_graphs(num_graphs: int, features: int, degree: float, seed: int) -> dict:
    """``src``, ``dst`` (global ids, in graph order), ``node_ptr``, ``x``, ``y``."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(10, 61, num_graphs)
    node_ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    pairs = np.rint(counts * degree / 2).astype(np.int64)
    start, size = np.repeat(node_ptr[:-1], pairs), np.repeat(counts, pairs)
    a = start + (rng.random(pairs.sum()) * size).astype(np.int64)
    b = start + (rng.random(pairs.sum()) * size).astype(np.int64)
    # both directions of each pair, each graph's edges together (PyG's Data slices)
    edge_ptr = np.concatenate(([0], np.cumsum(2 * pairs)))
    pair_ptr = np.concatenate(([0], np.cumsum(pairs)))
    order = np.arange(2 * int(pairs.sum()))
    graph_of = np.repeat(np.arange(num_graphs), 2 * pairs)
    local = order - edge_ptr[graph_of]
    first = local < pairs[graph_of]
    k = pair_ptr[graph_of] + np.where(first, local, local - pairs[graph_of])
    src, dst = np.where(first, a[k], b[k]), np.where(first, b[k], a[k])
    x = rng.standard_normal((int(node_ptr[-1]), features), dtype=np.float32)
    y = np.digitize(counts, [23, 36, 48]).astype(np.int64)
    return {"src": src, "dst": dst, "node_ptr": node_ptr, "edge_ptr": edge_ptr, "x": x, "y": y}


# ----------------------------------------------------------------------------- ngra
def ngra_runner(data: dict, layers: int, batch: int, seed: int) -> Callable[[], Iterator[int]]:
    import torch
    import torch.nn.functional as F

    from ngra.datasets import GraphDataset, GraphLoader
    from ngra.models import build_model
    from ngra.training.graph_task import GraphModel

    t0 = time.perf_counter()
    ds = GraphDataset.from_edges("synthetic", data["src"], data["dst"], data["node_ptr"],
                                 data["y"], torch.from_numpy(data["x"]))
    print(f"ngra dataset built in {time.perf_counter() - t0:.1f} s: {ds}")
    torch.manual_seed(seed)
    encoder = build_model("gin", ds.num_features, HIDDEN, hidden=HIDDEN, num_layers=layers,
                          dropout=0.0)
    model = GraphModel(encoder, HIDDEN, ds.num_classes, "sum")
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    loader = GraphLoader(ds, batch, shuffle=True, seed=seed)

    def steps() -> Iterator[int]:
        model.train()
        while True:
            for b in loader:
                opt.zero_grad()
                loss = F.cross_entropy(model(b.graph, b.x, b.ptr), b.y)
                bool(torch.isfinite(loss.detach()))
                loss.backward()
                opt.step()
                steps.loss = float(loss.detach())
                yield b.num_graphs

    return steps


# ------------------------------------------------------------------------------ PyG
def pyg_runner(data: dict, layers: int, batch: int, seed: int) -> Callable[[], Iterator[int]]:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch_geometric.data import Data
    from torch_geometric.loader import DataLoader
    from torch_geometric.nn import GINConv, global_add_pool

    t0 = time.perf_counter()
    x = torch.from_numpy(data["x"])
    ei = torch.from_numpy(np.stack([data["src"], data["dst"]]))
    node_ptr, edge_ptr = data["node_ptr"], data["edge_ptr"]
    y = torch.from_numpy(data["y"])
    graphs = [Data(x=x[node_ptr[g]:node_ptr[g + 1]],
                   edge_index=ei[:, edge_ptr[g]:edge_ptr[g + 1]] - int(node_ptr[g]),
                   y=y[g:g + 1]) for g in range(len(node_ptr) - 1)]
    print(f"PyG Data list built in {time.perf_counter() - t0:.1f} s: {len(graphs)} graphs")

    class Net(nn.Module):
        def __init__(self, f_in: int) -> None:
            super().__init__()
            widths = [f_in] + [HIDDEN] * layers
            self.convs = nn.ModuleList(
                GINConv(nn.Sequential(nn.Linear(a, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, b)),
                        train_eps=True) for a, b in zip(widths[:-1], widths[1:]))
            self.head = nn.Linear(HIDDEN, CLASSES)

        def forward(self, x, edge_index, batch_vec):
            for i, conv in enumerate(self.convs):
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    x = x.relu()
            return self.head(global_add_pool(x, batch_vec))

    torch.manual_seed(seed)
    model = Net(x.shape[1])
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    loader = DataLoader(graphs, batch_size=batch, shuffle=True,
                        generator=torch.Generator().manual_seed(seed))

    def steps() -> Iterator[int]:
        model.train()
        while True:
            for b in loader:
                opt.zero_grad()
                loss = F.cross_entropy(model(b.x, b.edge_index, b.batch), b.y)
                bool(torch.isfinite(loss.detach()))
                loss.backward()
                opt.step()
                steps.loss = float(loss.detach())
                yield b.num_graphs

    return steps


# ----------------------------------------------------------------------------- main
def run_window(it: Iterator[int], batches: int) -> tuple[int, float]:
    t0, graphs = time.perf_counter(), 0
    for _ in range(batches):
        graphs += next(it)
    return graphs, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", type=int, default=100_000)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--degree", type=float, default=4.0)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=20, help="untimed batches per framework")
    ap.add_argument("--window", type=int, default=50, help="batches per timed round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=("ngra", "pyg"), default=None)
    ap.add_argument("--no-write", action="store_true", help="print only (a profiling run)")
    args = ap.parse_args()
    bu.pin_environment(args.threads, thp=True)

    t0 = time.perf_counter()
    data = synthetic_graphs(args.graphs, args.features, args.degree, args.seed)
    n, e = int(data["node_ptr"][-1]), int(data["src"].size)
    print(f"{args.graphs} graphs, {n} nodes, {e} directed edges, built in "
          f"{time.perf_counter() - t0:.1f} s")
    runners: dict[str, Callable[[], Iterator[int]]] = {}
    for name, make in (("ngra", ngra_runner), ("pyg", pyg_runner)):
        if args.only not in (None, name):
            continue
        try:
            runners[name] = make(data, args.layers, args.batch_size, args.seed)
        except ImportError as err:
            print(f"{name}: not installed ({err}), skipped")
    load_before = os.getloadavg()[0]
    iters = {name: steps() for name, steps in runners.items()}
    for name, it in iters.items():
        run_window(it, args.warmup)
    rates: dict[str, list[float]] = {name: [] for name in iters}
    for r in range(args.rounds):
        for name, it in iters.items():
            graphs, secs = run_window(it, args.window)
            rates[name].append(graphs / secs)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{k} {v[-1]:.0f} graphs/s (loss {runners[k].loss:.3f})" for k, v in rates.items()))

    rows: list[dict[str, Any]] = []
    for name, v in rates.items():
        rows.append({"framework": name, "graphs": args.graphs, "batch_size": args.batch_size,
                     "layers": args.layers, "features": args.features, "hidden": HIDDEN,
                     "rounds": args.rounds, "batches_per_round": args.window,
                     "graphs_per_s_median": statistics.median(v), "graphs_per_s_min": min(v),
                     "graphs_per_s_max": max(v), "final_loss": runners[name].loss})
    for r in rows:  # per round: the two ran back to back under the same load
        ratios = [a / b for a, b in zip(rates[r["framework"]], rates.get("pyg", []))]
        r["vs_pyg"] = statistics.median(ratios) if ratios else float("nan")
    table = bu.markdown_table(
        [{**r, "rate": f"{r['graphs_per_s_median']:.0f}",
          "range": f"{r['graphs_per_s_min']:.0f} - {r['graphs_per_s_max']:.0f}",
          "ratio": bu.fmt_ratio(r["vs_pyg"]), "loss": f"{r['final_loss']:.3f}"} for r in rows],
        [("framework", "framework"), ("rate", "graphs/s (median)"), ("range", "min - max"),
         ("ratio", "vs PyG (median of rounds)"), ("loss", "last batch loss")])
    machine = bu.machine_info()
    load = max(load_before, os.getloadavg()[0])
    loaded = ([f"**Measured on a loaded machine** (1-minute load average up to {load:.1f} on "
               f"{os.cpu_count()} cores: other processes took the cores): the rates are far "
               "below a quiet machine's and vary from round to round; the per-round ratio, "
               "both frameworks back to back under the same load, is the figure to compare.",
               ""] if load > (os.cpu_count() or 1) else [])
    cmd = "python experiments/graph_throughput.py" + "".join(
        f" --{k.replace('_', '-')} {v}" for k, v in vars(args).items()
        if v != ap.get_default(k) and k != "no_write")
    lines = ["# Graph-classification training throughput: ngra GIN vs PyG GINConv", "",
             f"{args.graphs:,} synthetic graphs of 10-60 vertices ({n:,} nodes, {e:,} directed "
             f"edges, {args.features} features, {CLASSES} classes), {args.layers} GIN layers "
             f"{HIDDEN} wide, sum readout, Adam; batches of {args.batch_size} graphs, loader "
             f"included. Median over {args.rounds} alternating rounds of {args.window} batches "
             f"after {args.warmup} warm-up batches (module docstring of "
             "`experiments/graph_throughput.py`).", "",
             table, "", *loaded,
             "Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()), "",
             f"Regenerate: `{cmd}`"]
    print("\n".join(lines))
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        bu.write_csv(rows, RESULTS / "graph_throughput.csv")
        (RESULTS / "graph_throughput.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
