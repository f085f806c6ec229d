"""Planetoid raw files: exact counts, equality with PyG's reader, PubMed without allx, downloads."""

from __future__ import annotations

import hashlib
import io
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ngra.datasets import DamagedFileError, DatasetNotFoundError, load, load_planetoid
from ngra.datasets.planetoid import _SHA256

EXPECTED = {
    # name: nodes, directed edges, features, classes, train/val/test
    "cora": (2708, 10556, 1433, 7, (140, 500, 1000)),
    "citeseer": (3327, 9104, 3703, 6, (120, 500, 1000)),
}
EXTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


def _edge_keys(edge_index: torch.Tensor, n: int) -> np.ndarray:
    return np.sort((edge_index[0] * n + edge_index[1]).numpy())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_counts(data_dir: Path, name: str) -> None:
    nodes, edges, feats, classes, split = EXPECTED[name]
    ds = load_planetoid(name, data_dir, download=False)
    assert (ds.num_nodes, ds.num_edges, ds.num_features, ds.num_classes) == (
        nodes,
        edges,
        feats,
        classes,
    )
    assert (int(ds.train_mask.sum()), int(ds.val_mask.sum()), int(ds.test_mask.sum())) == split
    assert not (ds.train_mask & ds.val_mask).any() and not (ds.val_mask & ds.test_mask).any()
    assert ds.x.dtype == torch.float32 and ds.y.dtype == torch.int64
    # train = 20 labeled nodes per class
    assert torch.equal(
        torch.bincount(ds.y[ds.train_mask], minlength=classes), torch.full((classes,), 20)
    )
    g = ds.graph
    assert not g.has_self_loops()
    keys = _edge_keys(g.edge_index(), nodes)
    assert np.unique(keys).size == keys.size  # no duplicates
    assert np.array_equal(keys, _edge_keys(g.edge_index().flip(0), nodes))  # symmetric


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_matches_pyg_reader(data_dir: Path, name: str) -> None:
    pyg_io = pytest.importorskip("torch_geometric.io")
    ref = pyg_io.read_planetoid_data(str(data_dir / "planetoid"), name)
    ds = load(name, root=data_dir, download=False)
    n = ds.num_nodes
    assert ref.num_nodes == n
    assert np.array_equal(_edge_keys(ds.graph.edge_index(), n), _edge_keys(ref.edge_index, n))
    assert torch.equal(ds.x, ref.x)
    assert torch.equal(ds.y, ref.y)
    for m in ("train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(ds, m), getattr(ref, m)), m


def test_citeseer_isolated_test_nodes_are_zero_padded(data_dir: Path) -> None:
    ds = load_planetoid("citeseer", data_dir, download=False)
    test_ids = np.loadtxt(data_dir / "planetoid" / "ind.citeseer.test.index", dtype=np.int64)
    lo, hi = test_ids.min(), test_ids.max()
    gap = np.setdiff1d(np.arange(lo, hi + 1), test_ids)
    assert gap.size == 15  # the README's isolated test nodes
    assert float(ds.x[torch.from_numpy(gap)].abs().sum()) == 0.0
    assert not ds.test_mask[torch.from_numpy(gap)].any()


def test_pubmed_missing_allx_is_a_clear_error(data_dir: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as err:
        load("pubmed", root=data_dir, download=False)
    msg = str(err.value)
    assert "ind.pubmed.allx" in msg
    assert str(data_dir / "planetoid") in msg
    assert "pubmed:structure" in msg
    assert "ind.pubmed.tx" not in msg  # only the missing file is named


def test_pubmed_download_failure_names_files_root_and_fix(data_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "planetoid").mkdir(parents=True)
    for p in (data_dir / "planetoid").glob("ind.pubmed.*"):
        shutil.copy(p, root / "planetoid" / p.name)
    with pytest.raises(DatasetNotFoundError) as err:
        load("pubmed", root=root)  # download=True, but the network is disabled (conftest)
    msg = str(err.value)
    assert "ind.pubmed.allx" in msg and str(root) in msg
    assert "--data-root" in msg and "NGRA_DATA" in msg
    assert "https://github.com/kimiyoung/planetoid/raw/master/data/ind.pubmed.allx" in msg


def test_pubmed_structure_mode(data_dir: Path) -> None:
    ds = load("pubmed:structure", root=data_dir, download=False)
    assert (ds.num_nodes, ds.num_edges, ds.num_features, ds.num_classes) == (19717, 88648, 500, 3)
    assert (int(ds.train_mask.sum()), int(ds.val_mask.sum()), int(ds.test_mask.sum())) == (
        60,
        500,
        1000,
    )
    assert ds.info["features"] == "random"
    again = load_planetoid("pubmed", data_dir, download=False, allow_missing_features=True)
    assert torch.equal(ds.x, again.x) and torch.equal(ds.y, again.y)
    other = load("pubmed:structure,seed=1", root=data_dir, download=False)
    assert not torch.equal(ds.x, other.x) and torch.equal(ds.y, other.y)
    # structure mode of a complete dataset: same graph and labels as the full load
    cora_s = load("cora:structure", root=data_dir)
    cora = load("cora", root=data_dir)
    assert torch.equal(cora_s.graph.indices, cora.graph.indices) and torch.equal(cora_s.y, cora.y)
    assert cora_s.x.shape == cora.x.shape


def test_files_directly_in_root_are_found(data_dir: Path, tmp_path: Path) -> None:
    for ext in EXTS:
        shutil.copy(data_dir / "planetoid" / f"ind.cora.{ext}", tmp_path / f"ind.cora.{ext}")
    ds = load_planetoid("Cora", tmp_path, download=False)
    assert ds.num_nodes == 2708 and ds.info["source"] == str(tmp_path)


class _FakeResponse(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.headers = {"Content-Length": str(len(data))}


def test_download_fetches_and_verifies(data_dir: Path, tmp_path: Path, monkeypatch) -> None:
    served: list[str] = []

    def fake_urlopen(url: str, timeout: float):
        served.append(url)
        return _FakeResponse((data_dir / "planetoid" / url.rsplit("/", 1)[1]).read_bytes())

    monkeypatch.setattr("ngra.datasets.download.urllib.request.urlopen", fake_urlopen)
    ds = load_planetoid("cora", tmp_path, progress=False)
    assert ds.num_nodes == 2708 and len(served) == len(EXTS)
    assert served[0].startswith("https://github.com/kimiyoung/planetoid/raw/master/data/ind.cora.")
    for ext in EXTS:
        body = (tmp_path / "planetoid" / f"ind.cora.{ext}").read_bytes()
        assert hashlib.sha256(body).hexdigest() == _SHA256[f"ind.cora.{ext}"]
    assert not list((tmp_path / "planetoid").glob(".*part"))  # no temporary leftovers


def test_download_checksum_mismatch_saves_nothing(
    data_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(
        "ngra.datasets.download.urllib.request.urlopen",
        lambda url, timeout: _FakeResponse(b"not the file"),
    )
    with pytest.raises(DatasetNotFoundError, match="checksum mismatch"):
        load_planetoid("cora", tmp_path, progress=False)
    assert not (tmp_path / "planetoid").exists()  # not even an empty folder


def test_refuses_pickles_with_code(data_dir: Path, tmp_path: Path) -> None:
    for ext in EXTS:
        shutil.copy(data_dir / "planetoid" / f"ind.cora.{ext}", tmp_path / f"ind.cora.{ext}")

    class Evil:
        def __reduce__(self):
            return (shutil.rmtree, (str(tmp_path),))

    (tmp_path / "ind.cora.x").write_bytes(pickle.dumps(Evil(), protocol=2))
    with pytest.raises(DamagedFileError, match="refusing"):
        load_planetoid("cora", tmp_path, download=False)
    assert tmp_path.is_dir()


def test_unknown_planetoid_name() -> None:
    with pytest.raises(ValueError, match="cora"):
        load_planetoid("amazon")


def test_read_only_root_is_not_downloaded_into(data_dir: Path, tmp_path: Path) -> None:
    root = tmp_path / "ro"
    (root / "planetoid").mkdir(parents=True)
    for p in (data_dir / "planetoid").glob("ind.pubmed.*"):
        shutil.copy(p, root / "planetoid" / p.name)
    (root / "planetoid").chmod(0o555)
    try:
        with pytest.raises(DatasetNotFoundError) as err:
            load("pubmed", root=root)
        msg = str(err.value)
        assert "read-only" in msg and "ind.pubmed.allx" in msg and "NGRA_DATA" in msg
        assert sorted(p.name for p in (root / "planetoid").iterdir()) == sorted(
            p.name for p in (data_dir / "planetoid").glob("ind.pubmed.*")
        )
    finally:
        (root / "planetoid").chmod(0o755)
