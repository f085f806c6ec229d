"""Graph classification end to end: a SAGA layer compiles once over batches of any size,
and GIN + sum readout learns MUTAG from GraphLoader batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import ngra.compiler.driver as driver
from ngra.datasets import GraphDataset, GraphLoader, load_tu
from ngra.models import GINConv, SumPool


def count_compiles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    compile_ = driver._compile

    def counted(*args):
        calls[0] += 1
        return compile_(*args)

    monkeypatch.setattr(driver, "_compile", counted)
    return calls


def random_graphs(num_graphs: int, seed: int = 0) -> GraphDataset:
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 30, num_graphs)
    node_ptr = np.concatenate(([0], np.cumsum(counts)))
    m = counts * 2
    start = np.repeat(node_ptr[:-1], m)
    size = np.repeat(counts, m)
    src = start + (rng.random(m.sum()) * size).astype(np.int64)
    dst = start + (rng.random(m.sum()) * size).astype(np.int64)
    return GraphDataset.from_edges("random", src, dst, node_ptr, rng.integers(0, 2, num_graphs),
                                   rng.standard_normal((int(node_ptr[-1]), 5)))


def test_gin_traces_once_over_100_batches_of_different_sizes(monkeypatch):
    calls = count_compiles(monkeypatch)
    layer = GINConv(5, 8)
    loader = GraphLoader(random_graphs(400), batch_size=4, shuffle=True, seed=0)
    sizes = set()
    for batch in loader:
        out = layer(batch.graph, batch.x)
        out.sum().backward()
        sizes.add(batch.num_nodes)
    assert len(loader) == 100 and len(sizes) > 30
    assert calls[0] == 1, f"GINConv compiled {calls[0]} times over {len(sizes)} batch sizes"
    assert driver.compile_layer(layer, batch.graph, batch.x, None).kind == "compiled"


class GIN(nn.Module):
    def __init__(self, num_features: int, num_classes: int, hidden: int = 32) -> None:
        super().__init__()
        self.conv1, self.conv2 = GINConv(num_features, hidden), GINConv(hidden, hidden)
        self.pool, self.out = SumPool(), nn.Linear(hidden, num_classes)

    def forward(self, batch) -> torch.Tensor:
        h = torch.relu(self.conv1(batch.graph, batch.x))
        h = torch.relu(self.conv2(batch.graph, h))
        return self.out(self.pool(h, batch.ptr))


def test_gin_sum_pool_learns_mutag(shared_data: Path):
    folder = shared_data / "tu" / "MUTAG"
    if not (folder / "MUTAG_A.txt").is_file():
        pytest.skip(f"MUTAG not found under {folder}")
    ds = load_tu(folder)
    torch.manual_seed(0)
    model = GIN(ds.num_features, ds.num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = GraphLoader(ds, batch_size=32, shuffle=True, seed=0)
    losses = []
    for _ in range(8):
        total = 0.0
        for batch in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(batch), batch.y)
            loss.backward()
            opt.step()
            total += loss.item() * batch.num_graphs
        losses.append(total / len(ds))
    assert losses[-1] < 0.8 * losses[0], losses
    model.eval()
    with torch.no_grad():
        everything = next(iter(GraphLoader(ds, batch_size=len(ds))))
        acc = (model(everything).argmax(1) == everything.y).float().mean()
    assert acc > 0.7, float(acc)
