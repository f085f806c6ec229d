"""OGB node-property-prediction raw layout, written tiny in tmp_path."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from ngra.datasets import DatasetError, DatasetNotFoundError, load, load_ogb

EDGES = [
    (0, 1),
    (1, 2),
    (2, 0),
    (3, 4),
    (4, 5),
    (5, 3),
    (0, 0),
    (1, 2),
]  # a self-loop and a duplicate
FEATS = np.arange(18, dtype=np.float32).reshape(6, 3) / 7.0
LABELS = ["0", "1", "nan", "2", "1", "0"]  # node 2 unlabeled
SPLIT = {"train": [0, 1, 2], "valid": [3], "test": [4, 5]}


def _write(path: Path, lines: list[str], gz: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = ("\n".join(lines) + "\n").encode()
    if gz:
        path.write_bytes(gzip.compress(text))
    else:
        path.write_bytes(text)


def make_ogb(
    folder: Path, split_types: tuple[str, ...] = ("time",), labels: list[str] = LABELS
) -> Path:
    raw = folder / "raw"
    _write(raw / "edge.csv.gz", [f"{s},{d}" for s, d in EDGES])
    _write(raw / "node-feat.csv.gz", [",".join(f"{v:.6f}" for v in row) for row in FEATS])
    _write(raw / "node-label.csv.gz", labels)
    _write(raw / "num-node-list.csv.gz", ["6"])
    _write(raw / "num-edge-list.csv.gz", [str(len(EDGES))])
    for st in split_types:
        for part, ids in SPLIT.items():
            _write(folder / "split" / st / f"{part}.csv.gz", [str(i) for i in ids])
    return folder


def test_load_tiny_ogb(tmp_path: Path) -> None:
    folder = make_ogb(tmp_path / "ogbn_tiny")
    ds = load_ogb(folder)
    assert ds.name == "ogbn_tiny" and ds.num_nodes == 6 and ds.num_features == 3
    assert ds.num_edges == len(EDGES)  # as distributed: loop and duplicate kept
    assert sorted(map(tuple, ds.graph.edge_index().t().tolist())) == sorted(EDGES)
    np.testing.assert_allclose(ds.x.numpy(), FEATS, atol=1e-6)
    assert ds.y.tolist() == [0, 1, -1, 2, 1, 0]
    assert ds.num_classes == 3
    assert ds.train_mask.nonzero().view(-1).tolist() == [0, 1]  # unlabeled node 2 dropped
    assert ds.val_mask.nonzero().view(-1).tolist() == [3]
    assert ds.test_mask.nonzero().view(-1).tolist() == [4, 5]
    assert ds.info["split"] == "time"


def test_spec_and_options(tmp_path: Path) -> None:
    folder = make_ogb(tmp_path / "ogbn_tiny")
    ds = load(f"ogb:{folder},symmetric=true,simple=true")
    ei = ds.graph.edge_index()
    keys = set(map(tuple, ei.t().tolist()))
    assert keys == {(s, d) for s, d in EDGES if s != d} | {(d, s) for s, d in EDGES if s != d}
    assert ds.num_edges == len(keys)
    # relative path, resolved against the data root
    ds2 = load("ogb:ogbn_tiny", root=tmp_path)
    assert ds2.num_edges == len(EDGES)


def test_plain_csv_accepted(tmp_path: Path) -> None:
    folder = make_ogb(tmp_path / "d")
    for p in list((folder / "raw").glob("*.csv.gz")):
        p.with_suffix("").write_bytes(gzip.decompress(p.read_bytes()))
        p.unlink()
    assert load_ogb(folder).num_nodes == 6


def test_split_choice(tmp_path: Path) -> None:
    folder = make_ogb(tmp_path / "d", split_types=("time", "random"))
    with pytest.raises(DatasetNotFoundError, match="random.*time|split="):
        load_ogb(folder)
    assert load_ogb(folder, split="random").info["split"] == "random"
    with pytest.raises(DatasetNotFoundError, match="nope"):
        load_ogb(folder, split="nope")


def test_missing_file_named(tmp_path: Path) -> None:
    folder = make_ogb(tmp_path / "d")
    (folder / "raw" / "node-feat.csv.gz").unlink()
    with pytest.raises(DatasetNotFoundError, match="node-feat.csv.gz"):
        load_ogb(folder)
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        load_ogb(tmp_path / "absent")


def test_multitask_labels_rejected(tmp_path: Path) -> None:
    folder = make_ogb(tmp_path / "d", labels=["0,1"] * 6)
    with pytest.raises(DatasetError, match="multi-task"):
        load_ogb(folder)


def test_inconsistent_counts(tmp_path: Path) -> None:
    folder = make_ogb(tmp_path / "d")
    _write(folder / "raw" / "num-node-list.csv.gz", ["7"])
    with pytest.raises(DatasetError, match="inconsistent node counts"):
        load_ogb(folder)


def test_ogb_cached_and_invalidated(tmp_path: Path) -> None:
    folder = make_ogb(tmp_path / "d")
    first = load(f"ogb:{folder}")
    assert first.info["cache"] == "miss"
    assert load(f"ogb:{folder}").info["cache"] == "hit"
    _write(folder / "raw" / "node-label.csv.gz", ["1", "1", "1", "0", "0", "0"])
    changed = load(f"ogb:{folder}")
    assert changed.info["cache"] == "miss" and changed.y.tolist() == [1, 1, 1, 0, 0, 0]
    assert torch.equal(changed.x, first.x)
