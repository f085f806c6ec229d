"""Damaged cache entries, chunked CSC building, and the memory-mapped store."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

import ngra.datasets.builder as builder_mod
from ngra.datasets import load, rmat
from ngra.datasets.base import csc_graph
from ngra.datasets.builder import CSCBuilder
from ngra.datasets.cache import CacheError, load_cached
from ngra.datasets.store import GraphStore, choose_storage
from ngra.mapped import is_mapped

SPEC = "rmat:scale=10,feat=8"


def _entry(ds) -> Path:
    return Path(ds.info["cache_dir"])


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # flip bytes in the middle of the data: the header still parses
        mid = len(data) // 2
        data[mid:mid + 8] = bytes(255 - b for b in data[mid:mid + 8])
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "corrupted"])
@pytest.mark.parametrize("name", ["x", "indices"])
@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_damaged_cache_file_is_reported_and_rebuilt(name, how, storage, caplog):
    first = load(SPEC)
    entry = _entry(first)
    _damage(entry / f"{name}.npy", how)
    meta = json.loads((entry / "meta.json").read_text())
    with pytest.raises(CacheError, match=f"{name}.npy"):
        load_cached(entry, meta["spec"])  # never read as garbage
    with caplog.at_level(logging.WARNING, logger="ngra.datasets"):
        again = load(SPEC, storage=storage)
    assert f"{name}.npy" in caplog.text and "rebuilding" in caplog.text
    assert again.info["cache"] == "miss"
    assert torch.equal(again.x, first.x) and torch.equal(again.graph.indices, first.graph.indices)
    assert load(SPEC).info["cache"] == "hit"


def test_builder_spills_and_matches_csc_graph(monkeypatch, tmp_path):
    monkeypatch.setattr(builder_mod, "SPILL_EDGES", 1000)
    monkeypatch.setattr(builder_mod, "BUCKET_EDGES", 700)
    rng = np.random.default_rng(3)
    n = 500
    src, dst = rng.integers(0, n, 6000), rng.integers(0, n, 6000)
    b = CSCBuilder(n, 6000, scratch=tmp_path)
    assert b.spill and b.num_buckets > 4
    for lo in range(0, 6000, 1100):
        b.add(src[lo:lo + 1100], dst[lo:lo + 1100])
    g = b.finish()
    want = csc_graph(src, dst, n)
    assert torch.equal(g.indptr, want.indptr) and torch.equal(g.indices, want.indices)
    assert g.indptr.dtype == g.indices.dtype == torch.int32
    assert not list(tmp_path.iterdir())  # scratch buckets removed


def test_rmat_chunked_equals_in_memory():
    built = load("rmat:scale=11,feat=4")  # generated into the cache entry, then mapped back
    direct = rmat(scale=11, feat=4)
    assert torch.equal(built.graph.indices, direct.graph.indices)
    assert torch.equal(built.x, direct.x) and torch.equal(built.y, direct.y)


def test_disk_storage_maps_and_partitions():
    ds = load(SPEC, storage="disk")
    assert ds.info["storage"] == "disk" and is_mapped(ds.x) and is_mapped(ds.graph.indices)
    mem = load(SPEC)
    assert mem.info["storage"] == "memory" and not is_mapped(mem.x)
    store = GraphStore.of(ds)
    lo, hi = 100, 300
    part = store.in_edges(lo, hi)
    g = mem.graph
    a, b = int(g.indptr[lo]), int(g.indptr[hi])
    assert part.edge_lo == a and torch.equal(part.indices, g.indices[a:b])
    assert torch.equal(part.indptr, (g.indptr[lo:hi + 1] - a).long())
    assert is_mapped(part.indices)  # a slice of the mapped file, nothing read
    assert torch.equal(store.rows("x", lo, hi), mem.x[lo:hi])
    ids = torch.tensor([5, 900, 17])
    assert torch.equal(store.gather("x", ids), mem.x[ids])
    with pytest.raises(ValueError, match="not inside"):
        store.in_edges(0, 10**6)
    with pytest.raises(ValueError, match="storage='disk'"):
        GraphStore.of(mem)


def test_auto_storage_weighs_data_against_budget_and_memory():
    assert choose_storage("auto", 10, budget=5) == "disk"
    assert choose_storage("auto", 10, budget=50) == "memory"
    assert choose_storage("auto", 1 << 60) == "disk"
    assert choose_storage("memory", 1 << 60) == "memory"
    with pytest.raises(ValueError, match="storage must be one of"):
        choose_storage("ram", 1)


def test_self_loops_of_a_mapped_graph_are_written_beside_it(monkeypatch):
    """GCN's graph (self-loops, normalization) of a graph mapped from disk goes to disk a
    block at a time (never a whole copy in memory): the same graph as in memory, mapped,
    its file unlinked (nothing left in the entry), the entry's own files unchanged."""
    import ngra.kernels.cpu.util as cpu_util
    from ngra.mapped import mapped_file
    from ngra.models.zoo import prepare

    monkeypatch.setattr(cpu_util, "MAPPED_BLOCK_EDGES", 100)
    ds, mem = load(SPEC, storage="disk"), load(SPEC)
    files = sorted(p.name for p in _entry(ds).iterdir())
    before = (_entry(ds) / "indices.npy").read_bytes()
    got, _ = prepare("gcn", ds.graph)
    want, _ = prepare("gcn", mem.graph)
    assert is_mapped(got.indices) and is_mapped(got.indptr)
    assert Path(mapped_file(got.indices)).parent == _entry(ds)
    assert torch.equal(got.indices, want.indices) and torch.equal(got.indptr, want.indptr)
    assert got.indices.dtype == want.indices.dtype and got.indptr.dtype == want.indptr.dtype
    src, dst = got.edge_factors.src, got.edge_factors.dst
    assert torch.equal(src, want.edge_factors.src) and torch.equal(dst, want.edge_factors.dst)
    assert sorted(p.name for p in _entry(ds).iterdir()) == files
    assert (_entry(ds) / "indices.npy").read_bytes() == before
