"""On-disk cache: round trip, hits, keys, invalidation, atomic writes, unwritable folders."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from ngra import Graph
from ngra.datasets import NodeDataset, load
from ngra.datasets.cache import cache_key, load_cached, save_cached


def test_second_load_reads_the_cache(_isolated_cache: Path, assert_same) -> None:
    spec = "rmat:scale=9,feat=8,edge_types=2"
    first = load(spec)
    assert first.info["cache"] == "miss"
    entries = [p for p in _isolated_cache.iterdir()]
    assert len(entries) == 1 and entries[0].name.startswith("rmat-")
    meta = json.loads((entries[0] / "meta.json").read_text())
    assert meta["spec"] == first.info["spec"] and (entries[0] / "x.npy").is_file()
    second = load(spec)
    assert second.info["cache"] == "hit" and second.info["cache_dir"] == str(entries[0])
    assert_same(first, second)


def test_canonical_spec_shares_the_entry() -> None:
    assert load("sbm:nodes=300").info["cache"] == "miss"
    assert load("SBM:blocks=7,nodes=300,seed=0").info["cache"] == "hit"
    assert load("sbm:nodes=300,seed=1").info["cache"] == "miss"


def test_cache_off(_isolated_cache: Path) -> None:
    ds = load("sbm:nodes=100", cache=False)
    assert ds.info["cache"] == "off" and not _isolated_cache.exists()


def test_planetoid_is_parsed_not_cached(data_dir: Path, _isolated_cache: Path) -> None:
    assert load("cora", root=data_dir).info["cache"] == "off"
    assert not _isolated_cache.exists()


def test_default_cache_folder_is_under_the_root(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("NGRA_CACHE")
    load("sbm:nodes=100", root=tmp_path)
    assert [p.name.split("-")[0] for p in (tmp_path / "cache").iterdir()] == ["sbm"]


def test_read_only_root_is_never_written(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("NGRA_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o555)  # like the shared raw-data folder (root ignores it; the loader must not)
    try:
        ds = load("sbm:nodes=100", root=root)
        assert not (root / "cache").exists()
        assert Path(ds.info["cache_dir"]).parent == tmp_path / "home" / ".ngra" / "cache"
        assert load("sbm:nodes=100", root=root).info["cache"] == "hit"
    finally:
        root.chmod(0o755)


def test_round_trip_keeps_edge_order_weights_and_types(tmp_path: Path, assert_same) -> None:
    # edges deliberately not in CSC order, with weights and types, plus an unlabeled node
    ei = torch.tensor([[3, 0, 2, 1, 0], [0, 1, 1, 3, 2]])
    g = Graph.from_edge_index(ei, num_nodes=4, edge_weight=torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0]))
    ds = NodeDataset(
        name="hand",
        graph=g,
        x=torch.randn(4, 3),
        y=torch.tensor([0, 1, -1, 1]),
        train_mask=torch.tensor([True, False, False, False]),
        val_mask=torch.tensor([False, True, False, False]),
        test_mask=torch.tensor([False, False, False, True]),
        num_classes=2,
        edge_type=torch.tensor([0, 1, 2, 0, 1]),
        num_edge_types=3,
    )
    d = tmp_path / cache_key("hand:x=1")
    assert save_cached(ds, d, "hand:x=1")
    back = load_cached(d, "hand:x=1")
    assert back is not None
    assert_same(ds, back)
    assert torch.equal(back.graph.edge_index(), ei)
    assert load_cached(d, "hand:x=2") is None  # another spec never matches
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_corrupt_entry_is_rebuilt(_isolated_cache: Path, caplog) -> None:
    first = load("sbm:nodes=200")
    entry = Path(first.info["cache_dir"])
    np.save(entry / "x.npy", np.zeros((3, 3), np.float32))
    with caplog.at_level(logging.WARNING, logger="ngra.datasets"):
        again = load("sbm:nodes=200")
    assert again.info["cache"] == "miss" and torch.equal(again.x, first.x)
    assert "unreadable dataset cache" in caplog.text
    assert load("sbm:nodes=200").info["cache"] == "hit"


def test_unwritable_cache_warns_and_still_loads(tmp_path: Path, monkeypatch, caplog) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("NGRA_CACHE", str(blocker))
    with caplog.at_level(logging.WARNING, logger="ngra.datasets"):
        ds = load("sbm:nodes=100")
    assert ds.num_nodes == 100 and ds.info["cache"] == "miss" and "cache_dir" not in ds.info
    assert "could not write dataset cache" in caplog.text


def test_edgelist_change_invalidates(tmp_path: Path) -> None:
    path = tmp_path / "g.txt"
    path.write_text("0 1\n1 2\n")
    assert load(f"edgelist:{path},feat=2,classes=2").info["cache"] == "miss"
    assert load(f"edgelist:{path},feat=2,classes=2").info["cache"] == "hit"
    path.write_text("0 1\n1 2\n2 3\n")
    ds = load(f"edgelist:{path},feat=2,classes=2")
    assert ds.info["cache"] == "miss" and ds.num_nodes == 4
