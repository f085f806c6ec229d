"""Link prediction on Cora: ngra against PyG's ``examples/link_pred.py`` definition.

Both frameworks train the same model on the same split and negatives:

* the split: :func:`ngra.datasets.split_edges` (5 % validation, 10 % test, each with as
  many fixed negatives; both directions of a held-out edge leave the message-passing
  graph), the seed of each run;
* the model: a 2-layer GCN encoder (1433 -> 128 -> 64, ReLU between, no dropout) on
  row-normalized features, a dot-product decoder, Adam (lr 0.01, no weight decay), binary
  cross-entropy on the training edges and one uniform negative each, drawn per epoch
  (PyG: ``negative_sampling``; ngra: its seeded sampler), 100 epochs;
* selection: the epoch with the best validation ROC-AUC; the test ROC-AUC there
  (:func:`ngra.metrics.roc_auc` for both).

Writes ``experiments/results/link.md`` and ``link.csv``: test ROC-AUC mean and std over
seeds, and the median epoch time, per framework::

    python experiments/link_bench.py --seeds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _bench_util as bu  # noqa: E402

import ngra
from ngra.datasets import load, split_edges
from ngra.metrics import roc_auc

RESULTS = Path(__file__).resolve().parent / "results"


def ngra_run(root: str, seed: int, epochs: int) -> tuple[float, float]:
    """ngra's test ROC-AUC at the best validation epoch, and its median epoch seconds."""
    r = ngra.fit("gcn", "cora", task="link", epochs=epochs, seed=seed, data_root=root,
                 progress=False, hidden=128, embedding_dim=64, dropout=0.0, weight_decay=0.0,
                 lr=0.01, val=0.05, test=0.1)
    return r.summary["test_acc"], r.summary["epoch_time_s"]


def pyg_run(root: str, seed: int, epochs: int) -> tuple[float, float] | None:
    """PyG's GCNConv model on ngra's split of the same seed (None without PyG)."""
    try:
        from torch_geometric.nn import GCNConv
        from torch_geometric.utils import negative_sampling
    except ImportError:
        return None
    ds = load("cora", root=root)
    x = ds.x / ds.x.sum(1, keepdim=True).clamp(min=1)  # NormalizeFeatures
    split = split_edges(ds, val=0.05, test=0.1, seed=seed)
    mp = split.graph.edge_index()
    torch.manual_seed(seed)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = GCNConv(x.shape[1], 128), GCNConv(128, 64)

        def forward(self, x, ei):
            return self.conv2(self.conv1(x, ei).relu(), ei)

    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def score(z, pairs):
        return (z[pairs[0]] * z[pairs[1]]).sum(-1)

    best_val, test_at_best, times = -1.0, float("nan"), []
    for _ in range(epochs):
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad()
        z = model(x, mp)
        neg = negative_sampling(mp, num_nodes=ds.num_nodes,
                                num_neg_samples=split.train_pos.shape[1])
        s = torch.cat([score(z, split.train_pos), score(z, neg)])
        y = torch.cat([torch.ones(split.train_pos.shape[1]), torch.zeros(neg.shape[1])])
        torch.nn.functional.binary_cross_entropy_with_logits(s, y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        model.eval()
        with torch.no_grad():
            z = model(x, mp)
            val = roc_auc(score(z, split.val_pos), score(z, split.val_neg))
            if val > best_val:
                best_val = val
                test_at_best = roc_auc(score(z, split.test_pos), score(z, split.test_neg))
    return test_at_best, statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--data-root", default=str(Path(__file__).resolve().parents[2] / "shared"
                                               / "data"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    rows = []
    for name, fn in (("ngra", ngra_run), ("pyg", pyg_run)):
        runs = [fn(args.data_root, s, args.epochs) for s in range(args.seeds)]
        if any(r is None for r in runs):
            print(f"{name}: not installed, skipped")
            continue
        aucs = [r[0] for r in runs]
        rows.append({"framework": name, "seeds": args.seeds, "epochs": args.epochs,
                     "test_auc_mean": statistics.fmean(aucs),
                     "test_auc_std": statistics.stdev(aucs) if len(aucs) > 1 else 0.0,
                     "epoch_ms_median": 1e3 * statistics.median(r[1] for r in runs)})
        print(rows[-1])
    RESULTS.mkdir(exist_ok=True)
    bu.write_csv(rows, RESULTS / "link.csv")
    table = bu.markdown_table(
        [{**r, "auc": f"{r['test_auc_mean']:.4f} +- {r['test_auc_std']:.4f}",
          "ms": f"{r['epoch_ms_median']:.1f}"} for r in rows],
        [("framework", "framework"), ("seeds", "seeds"), ("epochs", "epochs"),
         ("auc", "test ROC-AUC (mean +- std)"), ("ms", "epoch (median ms)")])
    lines = ["# Link prediction on Cora: ngra vs PyG (examples/link_pred.py definition)", "",
             "Same split, model, optimizer and selection for both (module docstring of "
             "`experiments/link_bench.py`); 2 threads, this machine shared and noisy.", "",
             table, "", f"Regenerate: `python experiments/link_bench.py --seeds {args.seeds} "
              f"--epochs {args.epochs}`"]
    (RESULTS / "link.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
