"""load_ogb_link: a tiny OGB link-property folder in its CSV form, written in tmp_path."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from ngra.datasets import DatasetError, DatasetNotFoundError, load_ogb_link


def _write(path: Path, rows: list[list[float]], gz: bool = True, header: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = header + "".join(",".join(str(v) for v in r) + "\n" for r in rows)
    if gz:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)


def _folder(root: Path, name: str = "ogbl_collab", citation: bool = False) -> Path:
    f = root / name
    _write(f / "raw" / "edge.csv", [[0, 1], [1, 2], [2, 3], [3, 4]])
    _write(f / "raw" / "num-node-list.csv", [[6]])
    _write(f / "raw" / "node-feat.csv", [[i, 0.5] for i in range(6)])
    s = f / "split" / "time"
    _write(s / "train.csv", [[0, 1], [1, 2], [2, 3], [3, 4]], header="source,target\n")
    _write(s / "valid.csv", [[4, 5]], gz=False)
    _write(s / "test.csv", [[0, 5], [1, 5]])
    if citation:
        _write(s / "valid_target_neg.csv", [[0, 2, 3]])
        _write(s / "test_target_neg.csv", [[2, 3, 4], [0, 3, 4]])
    else:
        _write(s / "valid_neg.csv", [[0, 3], [1, 4]])
        _write(s / "test_neg.csv", [[0, 4], [2, 5], [1, 3]])
    return f


def test_hits_layout(tmp_path):
    s = load_ogb_link(_folder(tmp_path))
    assert s.undirected  # ogbl-collab: add_inverse_edge
    assert s.num_nodes == 6 and s.graph.num_edges == 8
    assert s.x.shape == (6, 2) and s.x.dtype == torch.float32
    assert s.train_pos.tolist() == [[0, 1, 2, 3], [1, 2, 3, 4]]
    assert s.val_pos.tolist() == [[4], [5]] and s.test_pos.shape == (2, 2)
    assert s.val_neg.shape == (2, 2) and s.test_neg.shape == (2, 3)
    assert s.val_neg_dst is None and s.info["split"] == "time"


def test_mrr_layout_and_direction(tmp_path):
    s = load_ogb_link(_folder(tmp_path, "ogbl_citation2", citation=True))
    assert not s.undirected and s.graph.num_edges == 4  # citation2 is directed
    assert s.val_neg is None and s.val_neg_dst.tolist() == [[0, 2, 3]]
    assert s.test_neg_dst.shape == (2, 3)
    assert load_ogb_link(_folder(tmp_path / "x", "mine"), symmetric=True).undirected


def test_leaked_positive_is_logged(tmp_path, caplog):
    f = _folder(tmp_path)
    _write(f / "split" / "time" / "valid.csv", [[1, 2]], gz=False)
    load_ogb_link(f)
    assert "leak" in caplog.text


def test_missing_and_bad_files(tmp_path):
    f = _folder(tmp_path)
    (f / "split" / "time" / "test_neg.csv.gz").unlink()
    with pytest.raises(DatasetNotFoundError, match="test_neg.csv.*found neither"):
        load_ogb_link(f)
    _write(f / "split" / "time" / "test_neg.csv", [[0, 4]])
    _write(f / "split" / "time" / "test_target_neg.csv", [[1, 2]])
    with pytest.raises(DatasetNotFoundError, match="found both"):
        load_ogb_link(f)
    (f / "split" / "time" / "test_target_neg.csv.gz").unlink()
    (f / "split" / "time" / "train.csv.gz").unlink()
    with pytest.raises(DatasetNotFoundError, match="train.csv.gz"):
        load_ogb_link(f)
    _write(f / "split" / "time" / "train.csv", [[0, 9]])
    with pytest.raises(DatasetError, match=r"ids must be in \[0, 6\).*up to 9"):
        load_ogb_link(f)


def test_citation_negatives_need_a_row_per_positive(tmp_path):
    f = _folder(tmp_path, "ogbl_citation2", citation=True)
    _write(f / "split" / "time" / "test_target_neg.csv", [[2, 3, 4]])
    with pytest.raises(DatasetError, match="1 lines; expected 2, one per positive of test"):
        load_ogb_link(f)


def test_written_from_arrays_roundtrip(tmp_path):
    f = _folder(tmp_path)
    edges = np.array([[4, 5], [0, 2]])
    np.savetxt(f / "split" / "time" / "valid.csv", edges, fmt="%d", delimiter=",")
    assert load_ogb_link(f).val_pos.t().tolist() == edges.tolist()
