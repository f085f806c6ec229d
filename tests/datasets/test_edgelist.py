"""Edge lists: SNAP text and Graphs.jl LG, plain and gzipped; the real ego-Twitter file."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from ngra.datasets import DatasetError, DatasetNotFoundError, load, load_edgelist, read_edgelist

SNAP = """# Directed graph (each unordered pair of nodes is saved once)
# FromNodeId\tToNodeId
100\t7
7\t4000000000
4000000000\t100
100\t7
5 5
% a KONECT-style comment
7 100
"""


def _dense_edges(ds) -> set[tuple[int, int]]:
    return set(map(tuple, ds.graph.edge_index().t().tolist()))


@pytest.mark.parametrize("gz", [False, True])
def test_snap_format(tmp_path: Path, gz: bool) -> None:
    path = tmp_path / ("g.txt.gz" if gz else "g.txt")
    path.write_bytes(gzip.compress(SNAP.encode()) if gz else SNAP.encode())
    el = read_edgelist(path)
    assert el.format == "snap" and el.directed is None
    # ids 5, 7, 100, 4e9 -> 0, 1, 2, 3 (increasing id order)
    assert el.num_nodes == 4
    assert list(zip(el.src.tolist(), el.dst.tolist())) == [
        (2, 1),
        (1, 3),
        (3, 2),
        (2, 1),
        (0, 0),
        (1, 2),
    ]
    ds = load_edgelist(path, feat=4, classes=2)
    assert ds.name == "g" and ds.num_nodes == 4 and ds.num_features == 4
    assert _dense_edges(ds) == {
        (2, 1),
        (1, 3),
        (3, 2),
        (1, 2),
    }  # directed, loop and duplicate dropped
    sym = load_edgelist(path, feat=4, classes=2, symmetric=True)
    assert _dense_edges(sym) == {(2, 1), (1, 2), (1, 3), (3, 1), (3, 2), (2, 3)}
    raw = load_edgelist(path, feat=4, classes=2, simple=False)
    assert raw.num_edges == 6


def test_lg_format(tmp_path: Path) -> None:
    path = tmp_path / "tiny.jlg"
    path.write_text("5,3,u,tiny\n1,2\n2,3\n3,3\n")
    el = read_edgelist(path)
    assert (el.format, el.directed, el.num_nodes) == (
        "lg",
        False,
        5,
    )  # node 5 (id 4) isolated but kept
    ds = load_edgelist(path, feat=3, classes=2)
    assert ds.num_nodes == 5
    assert _dense_edges(ds) == {
        (0, 1),
        (1, 0),
        (1, 2),
        (2, 1),
    }  # undirected: both directions, no loop
    path.write_text("3,2,d,tiny\n1,2\n2,3\n")
    assert _dense_edges(load_edgelist(path, feat=3, classes=2)) == {(0, 1), (1, 2)}
    path.write_text("3,3,d,tiny\n1,2\n2,3\n")
    with pytest.raises(DatasetError, match="declares 3 edges"):
        read_edgelist(path)
    path.write_text("3,1,d,tiny\n1,4\n")
    with pytest.raises(DatasetError, match=r"\[1, 3\]"):
        read_edgelist(path)


def test_csv_with_weight_column(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text("0,1,0.5\n1,2,1.5\n2,0,2.0\n")
    el = read_edgelist(path)
    assert el.num_nodes == 3 and el.src.tolist() == [0, 1, 2] and el.dst.tolist() == [1, 2, 0]


def test_malformed_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("1 2\n2 3\nthree 4\n")
    with pytest.raises(DatasetError, match="three 4"):
        read_edgelist(path)
    with pytest.raises(DatasetNotFoundError):
        read_edgelist(tmp_path / "missing.txt")


def test_spec_options_and_relative_path(tmp_path: Path) -> None:
    (tmp_path / "graphs").mkdir()
    (tmp_path / "graphs" / "g.txt").write_text(SNAP)
    ds = load("edgelist:graphs/g.txt,feat=5,classes=3,symmetric=true", root=tmp_path)
    assert ds.num_features == 5 and ds.num_classes == 3 and ds.num_edges == 6
    assert ds.info["spec"].startswith(
        f"edgelist:path={tmp_path / 'graphs' / 'g.txt'},feat=5,classes=3"
    )


def test_ego_twitter_counts(data_dir: Path) -> None:
    path = data_dir / "ego_twitter" / "ego-twitter-undirected.jlg.gz"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    el = read_edgelist(path)
    assert (el.format, el.directed, el.num_nodes, el.src.size) == ("lg", False, 81306, 1342310)
    assert int((el.src == el.dst).sum()) == 14  # README: 14 self loops
    ds = load("twitter:feat=16", root=data_dir)
    # README: 1,342,296 distinct undirected non-loop edges, stored in both directions
    assert ds.num_nodes == 81306 and ds.num_edges == 2 * 1342296
    deg = ds.graph.in_degrees()
    assert int(deg.max()) == 3383 and int((deg == 0).sum()) == 0
    assert torch.equal(deg, ds.graph.out_degrees())
    # synthetic labels are homophilous and balanced enough to learn from
    y = ds.y
    same = float((y[ds.graph.indices] == y[ds.graph.dst_index()]).float().mean())
    assert same > 0.4  # chance is 1/8
    assert int(torch.bincount(y, minlength=8).min()) > 81306 / 8 / 2


def test_twitter_missing_file_message(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as err:
        load("twitter", root=tmp_path)
    msg = str(err.value)
    assert "ego-twitter-undirected.jlg.gz" in msg and str(tmp_path) in msg and "NGRA_DATA" in msg


def test_structural_labels_deterministic(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "r.txt"
    np.savetxt(path, rng.integers(0, 300, size=(2000, 2)), fmt="%d")
    a, b = load_edgelist(path, seed=3), load_edgelist(path, seed=3)
    assert (
        torch.equal(a.y, b.y) and torch.equal(a.x, b.x) and torch.equal(a.train_mask, b.train_mask)
    )
    assert not torch.equal(a.y, load_edgelist(path, seed=4).y)


def test_crlf_blank_lines_and_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "crlf.txt"
    path.write_bytes(b"\r\n# header\r\n\r\n1 2\r\n2 3\r\n\r\n")
    el = read_edgelist(path)
    assert el.num_nodes == 3 and el.src.tolist() == [0, 1] and el.dst.tolist() == [1, 2]
    path.write_bytes(b"# nothing here\n\n")
    assert read_edgelist(path).num_nodes == 0
    assert load_edgelist(path, feat=2, classes=2).num_nodes == 0
