"""Graph classification on MUTAG: ngra's GIN against PyG's ``GINConv``, 10-fold CV.

The protocol (Xu et al.'s GIN paper, as PyG's ``mutag_gin.py`` and most tables run it):

* folds: the 188 graphs shuffled by the seed and cut into 10 folds; each fold is the test
  set once, the other nine train;
* the model: two GIN layers (``MLP((1 + eps) h_v + sum_u h_u)``, MLP ``Linear -> ReLU ->
  Linear``, 32 wide, learnable eps), ReLU between them, sum readout, a Linear to the two
  classes; Adam (lr 0.01), cross-entropy, batches of 32 graphs shuffled every epoch, 100
  epochs;
* the figure: each fold's test accuracy after the last epoch; mean and std over folds.

ngra runs ``ngra.models.GINConv`` on ``ngra.datasets.GraphLoader`` batches with
``ngra.models.readout``; PyG its ``GINConv`` on ``torch_geometric.loader.DataLoader``
batches of the same graphs with ``global_add_pool``, in the same order. Writes
``experiments/results/graph.md`` and ``graph.csv``::

    python experiments/graph_bench.py --seeds 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ngra.datasets import GraphLoader, load_tu
from ngra.models import GINConv, readout

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_util as bu  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
WIDTH, EPOCHS, BATCH, LR = 32, 100, 32, 0.01


class NgraGIN(nn.Module):
    def __init__(self, f_in: int, classes: int) -> None:
        super().__init__()
        self.c1, self.c2 = GINConv(f_in, WIDTH, WIDTH), GINConv(WIDTH, WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, classes)

    def forward(self, graph, x, ptr):
        return self.head(readout(self.c2(graph, torch.relu(self.c1(graph, x))), ptr, "sum"))


def folds(n: int, seed: int, k: int = 10) -> list[np.ndarray]:
    return np.array_split(np.random.default_rng(seed).permutation(n), k)


def ngra_fold(ds, train: np.ndarray, test: np.ndarray, seed: int) -> float:
    torch.manual_seed(seed)
    model = NgraGIN(ds.num_features, ds.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    loader = GraphLoader(ds.subset(np.sort(train)), BATCH, shuffle=True, seed=seed)
    for _ in range(EPOCHS):
        model.train()
        for b in loader:
            opt.zero_grad()
            F.cross_entropy(model(b.graph, b.x, b.ptr), b.y).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(b.graph, b.x, b.ptr).argmax(-1) == b.y).sum())
                      for b in GraphLoader(ds.subset(np.sort(test)), 256))
    return correct / len(test)


def pyg_fold(ds, train: np.ndarray, test: np.ndarray, seed: int) -> float | None:
    try:
        from torch_geometric.data import Data
        from torch_geometric.nn import GINConv as PygGIN
        from torch_geometric.nn import global_add_pool
    except ImportError:
        return None

    def data(i: int) -> Data:
        b = ds[int(i)]
        return Data(x=b.x, edge_index=b.graph.edge_index(), y=b.y)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()

            def mlp(a: int) -> nn.Module:
                return nn.Sequential(nn.Linear(a, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))

            self.c1 = PygGIN(mlp(ds.num_features), train_eps=True)
            self.c2 = PygGIN(mlp(WIDTH), train_eps=True)
            self.head = nn.Linear(WIDTH, ds.num_classes)

        def forward(self, x, ei, batch):
            return self.head(global_add_pool(self.c2(self.c1(x, ei).relu(), ei), batch))

    from torch_geometric.data import Batch

    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    train_sorted = np.sort(train)
    order_loader = GraphLoader(ds.subset(train_sorted), BATCH, shuffle=True, seed=seed)
    graphs = {int(i): data(i) for i in np.concatenate([train, test])}
    for _ in range(EPOCHS):
        model.train()
        order = order_loader.order()  # the same shuffles as ngra's loader
        order_loader.epoch += 1
        for s in range(0, len(order), BATCH):
            b = Batch.from_data_list([graphs[int(train_sorted[j])] for j in order[s:s + BATCH]])
            opt.zero_grad()
            F.cross_entropy(model(b.x, b.edge_index, b.batch), b.y).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        b = Batch.from_data_list([graphs[int(i)] for i in np.sort(test)])
        return int((model(b.x, b.edge_index, b.batch).argmax(-1) == b.y).sum()) / len(test)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"
                                          / "tu" / "MUTAG"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    ds = load_tu(args.data)
    rows = []
    for name, fn in (("ngra", ngra_fold), ("pyg", pyg_fold)):
        accs, t0 = [], time.perf_counter()
        for seed in range(args.seeds):
            parts = folds(len(ds), seed)
            for k, test in enumerate(parts):
                train = np.concatenate([p for j, p in enumerate(parts) if j != k])
                acc = fn(ds, train, test, seed)
                if acc is None:
                    break
                accs.append(acc)
        if not accs:
            print(f"{name}: not installed, skipped")
            continue
        rows.append({"framework": name, "seeds": args.seeds, "folds": len(accs),
                     "test_acc_mean": statistics.fmean(accs), "test_acc_std": statistics.stdev(accs),
                     "seconds": time.perf_counter() - t0})
        print(rows[-1])
    RESULTS.mkdir(exist_ok=True)
    bu.write_csv(rows, RESULTS / "graph.csv")
    table = bu.markdown_table(
        [{**r, "acc": f"{r['test_acc_mean']:.4f} +- {r['test_acc_std']:.4f}",
          "s": f"{r['seconds']:.0f}"} for r in rows],
        [("framework", "framework"), ("seeds", "seeds"), ("folds", "folds"),
         ("acc", "test accuracy (mean +- std over folds)"), ("s", "seconds")])
    lines = ["# Graph classification on MUTAG: ngra GIN vs PyG GINConv, 10-fold CV", "",
             "Same folds, model, batches (in the same order), optimizer and epochs (module "
             "docstring of `experiments/graph_bench.py`); 2 threads, a shared machine.", "",
             table, "", f"Regenerate: `python experiments/graph_bench.py --seeds {args.seeds}`"]
    (RESULTS / "graph.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
