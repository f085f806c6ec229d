"""Damaged raw files name the file, what is wrong and the fix (DamagedFileError)."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from ngra.datasets import DamagedFileError, DatasetError, load_ogb, load_planetoid, read_edgelist
from ngra.datasets.planetoid import _read
from ogbn_folder import ogbn_folder


def _cora_copy(data_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "planetoid"
    folder.mkdir()
    for p in (data_dir / "planetoid").glob("ind.cora.*"):
        shutil.copy(p, folder / p.name)
    return folder


def test_truncated_planetoid_pickle(data_dir: Path, tmp_path: Path) -> None:
    path = _cora_copy(data_dir, tmp_path) / "ind.cora.allx"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DamagedFileError) as err:
        load_planetoid("cora", tmp_path, download=False)
    msg = str(err.value)
    assert err.value.path == path and f"{path} is damaged: not a readable pickle" in msg
    assert "sha256 differs" in msg and "Delete it and load 'cora' again" in msg


def test_planetoid_file_that_parses_but_is_not_the_published_one(data_dir, tmp_path) -> None:
    path = _cora_copy(data_dir, tmp_path) / "ind.cora.ally"
    ally = _read(path, "ally", "cora")
    ally[0] = np.roll(ally[0], 1)  # one label moved: same types and shapes
    path.write_bytes(pickle.dumps(ally, protocol=4))
    with pytest.raises(DamagedFileError, match="contents are not the published file's"):
        load_planetoid("cora", tmp_path, download=False)


def test_planetoid_shapes_that_do_not_fit(data_dir: Path, tmp_path: Path) -> None:
    path = _cora_copy(data_dir, tmp_path) / "ind.cora.test.index"
    path.write_text("\n".join(path.read_text().split()[:500]))
    with pytest.raises(DamagedFileError, match=r"test.index is damaged: its shape \[500\]"):
        load_planetoid("cora", tmp_path, download=False)


def test_ogb_csv_with_a_short_row(tmp_path: Path) -> None:
    folder = ogbn_folder(tmp_path / "ogbn_x", "0.1,0.2\n0.3\n0.5,0.6\n")
    with pytest.raises(DamagedFileError) as err:
        load_ogb(folder)
    msg = str(err.value)
    assert "node-feat.csv.gz, line 2: 1 value(s) ('0.3') where every line holds 2" in msg
    assert "Download or unpack the OGB dataset again" in msg


def test_ogb_gzip_cut_short(tmp_path: Path) -> None:
    folder = ogbn_folder(tmp_path / "ogbn_x")
    path = folder / "raw" / "edge.csv.gz"
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(DamagedFileError, match="edge.csv.gz is a damaged gzip file"):
        load_ogb(folder)


def test_edge_list_rows_that_only_add_up_are_caught(tmp_path: Path) -> None:
    # "0 1 / 2 / 3 4 5" holds six numbers: once read silently as the pairs (2, 3), (4, 5).
    path = tmp_path / "g.txt"
    path.write_text("# header\n0 1\n2\n3 4 5\n")
    with pytest.raises(DamagedFileError, match=r"g.txt, line 3: 1 value\(s\) \('2'\)"):
        read_edgelist(path)


def test_lg_file_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "g.lg"
    path.write_text("4,3,u,g\n1,2\n2,3\n")
    with pytest.raises(DamagedFileError, match="declares 3 edges but the file holds 2"):
        read_edgelist(path)
    path.write_text("4,3,u,g\n1,2\n2,3\n3,")
    with pytest.raises(DamagedFileError, match="line 4: 1 value"):
        read_edgelist(path)


def test_lg_header_with_an_impossible_vertex_count(tmp_path: Path) -> None:
    path = tmp_path / "g.lg"
    path.write_text("99999999999,1,u,g\n1,2\n")
    with pytest.raises(DamagedFileError, match="header is probably damaged"):
        read_edgelist(path)


def test_damaged_file_error_is_a_dataset_error() -> None:
    assert issubclass(DamagedFileError, DatasetError)
