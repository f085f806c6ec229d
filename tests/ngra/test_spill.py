"""Saved activations on disk (``ngra.spill.saved_on_disk``): same training, files gone after.

Checked: a zoo model's loss and every gradient under the spill equal those without it
(GCN, whose ReLU writes its input gradient over its saved output, and GAT); a tensor
saved twice is written once; an unpacked tensor is a private copy (a second backward over
a retained graph, after the first wrote over its unpack, gets the original values); the
scratch files are unlinked (nothing left in the folder) and small tensors stay in memory.
"""

from __future__ import annotations

import pytest
import torch

import ngra.spill as spill
from ngra.graph import Graph
from ngra.models.zoo import build_model, prepare
from ngra.spill import is_spilled, saved_on_disk


def _graph(n: int = 300, e: int = 2400, seed: int = 0) -> Graph:
    g = torch.Generator().manual_seed(seed)
    return Graph.from_edge_index(torch.randint(0, n, (2, e), generator=g), num_nodes=n)


@pytest.fixture
def written(monkeypatch):
    """The shapes of the tensors written to spill files."""
    shapes: list[tuple[int, ...]] = []
    real = spill._Spilled.__init__

    def spy(self, t, near):
        shapes.append(tuple(t.shape))
        real(self, t, near)

    monkeypatch.setattr(spill._Spilled, "__init__", spy)
    return shapes


def _step(name: str, graph: Graph, x: torch.Tensor, spilled: bool):
    torch.manual_seed(1)
    model = build_model(name, x.shape[1], 5, dropout=0.5)
    g, e = prepare(name, graph)
    with saved_on_disk(min_bytes=1) if spilled else torch.autograd.graph.saved_tensors_hooks(
            lambda t: t, lambda t: t):
        torch.manual_seed(2)
        loss = model(g, x, e).square().mean()
        loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("name", ["gcn", "gat"])
def test_spilled_training_step_equals_the_in_memory_one(name, written):
    graph = _graph()
    x = torch.randn(graph.num_nodes, 12, generator=torch.Generator().manual_seed(3))
    want = _step(name, graph, x, spilled=False)
    got = _step(name, graph, x, spilled=True)
    assert written, "nothing was spilled"
    assert got[0] == want[0]
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_tensor_saved_twice_is_written_once_and_unpacks_privately(written):
    """``y = relu(x)`` saved by the activation and by the matmul after it: one file.
    Backward writes the ReLU's input gradient over its unpacked ``y``; a second backward
    of the retained graph unpacks the file again and gets the same gradients."""
    from ngra.models.zoo import _relu

    x = torch.randn(64, 8, requires_grad=True)
    w = torch.randn(8, 3, requires_grad=True)
    seen = []
    real = spill._Spilled.unpack

    def spy(self):
        t = real(self)
        seen.append(is_spilled(t))
        return t

    spill._Spilled.unpack = spy
    try:
        with saved_on_disk(min_bytes=1):
            out = (_relu(x) @ w).sum()
        (gx1,) = torch.autograd.grad(out, x, retain_graph=True)
        (gx2,) = torch.autograd.grad(out, x)
    finally:
        spill._Spilled.unpack = real
    assert written == [(64, 8)]
    assert seen and all(seen)
    torch.testing.assert_close(gx1, gx2, rtol=0, atol=0)
    torch.testing.assert_close(gx1, (x > 0).float() * w.sum(1), rtol=0, atol=1e-6)


def test_files_are_unlinked_and_small_tensors_stay(tmp_path, monkeypatch, written):
    """The file goes beside the data (the folder ``near`` is mapped from) and is unlinked
    as soon as it is made."""
    import tempfile

    import ngra.mapped as mapped

    near = torch.zeros(1)
    real_file = mapped.mapped_file
    monkeypatch.setattr(mapped, "mapped_file", lambda t: str(tmp_path / "x.npy")
                        if t is near else real_file(t))
    folders = []
    real = tempfile.mkstemp

    def mkstemp(**kw):
        folders.append(kw.get("dir"))
        return real(**kw)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    x = torch.randn(1000, 16, requires_grad=True)
    with saved_on_disk(near=near, min_bytes=32_000):
        y = torch.sigmoid(x)  # saves its 64 KB output: spilled
        z = (x[:10] * 2).sigmoid()  # 640 bytes: kept
        assert not list(tmp_path.iterdir())  # made in tmp_path, unlinked at once
    (y.sum() + z.sum()).backward()
    assert written == [(1000, 16)] and folders == [str(tmp_path)]
    torch.testing.assert_close(x.grad[:10], (torch.sigmoid(x[:10]) * (1 - torch.sigmoid(
        x[:10]))).detach() + 2 * (z * (1 - z)).detach(), rtol=1e-6, atol=1e-6)
