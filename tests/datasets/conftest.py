"""Fixtures for ngra.datasets tests: the shared data folder, an isolated cache, no network."""

from __future__ import annotations

import os
import urllib.error
from pathlib import Path

import pytest
import torch

from ngra.datasets import NodeDataset

REPO = Path(__file__).resolve().parents[2]


def shared_data_dir() -> Path:
    """``$NGRA_DATA`` if set, else ``<repo>/../shared/data``."""
    env = os.environ.get("NGRA_DATA")
    return Path(env).resolve() if env else (REPO / ".." / "shared" / "data").resolve()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    root = shared_data_dir()
    if not (root / "planetoid").is_dir():
        pytest.skip(f"shared data not found under {root} (set NGRA_DATA)")
    return root


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own cache folder (the shared data folder is read-only)."""
    cache = tmp_path / "ngra-cache"
    monkeypatch.setenv("NGRA_CACHE", str(cache))
    return cache


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never touch the network: any download attempt fails at once."""

    def refuse(*args, **kwargs):
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr("ngra.datasets.download.urllib.request.urlopen", refuse)


@pytest.fixture
def assert_same():
    """The :func:`assert_same_dataset` checker (fixtures avoid importing between test modules)."""
    return assert_same_dataset


def assert_same_dataset(a: NodeDataset, b: NodeDataset) -> None:
    """Equal data (graph in original edge order, features, labels, split, edge types)."""
    assert a.name == b.name
    assert a.num_nodes == b.num_nodes and a.num_classes == b.num_classes
    assert torch.equal(a.graph.edge_index(), b.graph.edge_index())
    assert torch.equal(a.graph.indptr, b.graph.indptr)
    assert torch.equal(a.graph.indices, b.graph.indices)
    wa, wb = a.graph.edge_weight_original(), b.graph.edge_weight_original()
    assert (wa is None) == (wb is None) and (wa is None or torch.equal(wa, wb))
    for field in ("x", "y", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert (a.edge_type is None) == (b.edge_type is None)
    if a.edge_type is not None:
        assert torch.equal(a.edge_type, b.edge_type)
    assert a.num_edge_types == b.num_edge_types
