"""Bringing one's own vertex data to an edge list: features=, labels=, split=, header=,
classes=; formats, row-by-vertex-id, the errors, the cache and what was synthesized."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from ngra.datasets import (
    DamagedFileError,
    DatasetError,
    DatasetNotFoundError,
    describe,
    load,
    load_edgelist,
    parse_spec,
    read_edgelist,
)
from ngra.datasets.base import MissingFileError

# ids 0, 3, 5 and 7 have edges; 1, 2, 4, 6 none (isolated, yet rows of their own)
EDGES = "0,3\n3,5\n5,7\n7,0\n"
N = 8


@pytest.fixture
def edges(tmp_path: Path) -> Path:
    path = tmp_path / "g.csv"
    path.write_text(EDGES)
    return path


def _x(n: int = N, f: int = 3) -> np.ndarray:
    return (np.arange(n * f, dtype=np.float32).reshape(n, f) / 4).astype(np.float32)


def _y(n: int = N) -> np.ndarray:
    return np.arange(n, dtype=np.int64) % 3


def _csv(path: Path, a: np.ndarray, head: str = "") -> Path:
    rows = a.reshape(a.shape[0], -1)
    path.write_text(head + "".join(",".join(str(v) for v in row) + "\n" for row in rows))
    return path


def _edge_set(ds) -> set[tuple[int, int]]:
    return set(map(tuple, ds.graph.edge_index().t().tolist()))


# ------------------------------------------------------------------ reading, by format
def test_ids_are_kept_and_rows_are_vertices(edges: Path, tmp_path: Path) -> None:
    x, y = _x(), _y()
    ds = load_edgelist(edges, features=_csv(tmp_path / "x.csv", x),
                       labels=_csv(tmp_path / "y.csv", y))
    assert ds.num_nodes == N  # max id + 1, not the 4 distinct ids
    assert _edge_set(ds) == {(0, 3), (3, 5), (5, 7), (7, 0)}  # raw ids, not compacted
    assert torch.equal(ds.x, torch.from_numpy(x)) and torch.equal(ds.y, torch.from_numpy(y))
    assert ds.num_classes == 3 and ds.synthesized == [] and ds.info["synthesized"] == []
    assert ds.info["vertex_ids"].startswith("as given")
    assert int(ds.graph.in_degrees()[1]) == 0  # vertex 1: isolated, still its own row
    # without vertex data the ids are still renumbered densely
    assert load_edgelist(edges).num_nodes == 4


def test_isolated_vertices_past_the_largest_id(edges: Path, tmp_path: Path) -> None:
    x = _x(11)  # rows 8..10: vertices with no edge at all
    ds = load_edgelist(edges, features=_csv(tmp_path / "x.csv", x))
    assert ds.num_nodes == 11 and torch.equal(ds.x, torch.from_numpy(x))
    assert ds.synthesized == ["labels"] and ds.y.shape == (11,)
    assert int(ds.graph.in_degrees()[8:].sum()) == 0


@pytest.mark.parametrize("fmt", ["csv", "csv.gz", "tsv", "npy", "npz-x", "npz-features",
                                 "npz-single"])
def test_feature_formats(edges: Path, tmp_path: Path, fmt: str) -> None:
    x = _x()
    if fmt in ("csv", "tsv"):
        path = tmp_path / f"x.{fmt}"
        sep = "," if fmt == "csv" else "\t"
        path.write_text("".join(sep.join(map(str, r)) + "\n" for r in x))
    elif fmt == "csv.gz":
        path = tmp_path / "x.csv.gz"
        path.write_bytes(gzip.compress(_csv(tmp_path / "plain.csv", x).read_bytes()))
    elif fmt == "npy":
        path = tmp_path / "x.npy"
        np.save(path, x.astype(np.float64))
    else:
        path = tmp_path / "x.npz"
        key = {"npz-x": "x", "npz-features": "features", "npz-single": "anything"}[fmt]
        np.savez(path, **{key: x})
    ds = load_edgelist(edges, features=path)
    assert ds.x.dtype == torch.float32 and torch.equal(ds.x, torch.from_numpy(x))


@pytest.mark.parametrize("fmt", ["csv", "npy", "npz-y", "npz-labels"])
def test_label_formats(edges: Path, tmp_path: Path, fmt: str) -> None:
    y = _y()
    y[2] = -1  # unlabeled
    if fmt == "csv":
        path = _csv(tmp_path / "y.csv", y)
    elif fmt == "npy":
        path = tmp_path / "y.npy"
        np.save(path, y.astype(np.float32))  # integral floats are fine
    else:
        path = tmp_path / "y.npz"
        np.savez(path, **{fmt[4:]: y}, other=np.zeros(2))
    ds = load_edgelist(edges, labels=path)
    assert torch.equal(ds.y, torch.from_numpy(y)) and ds.num_classes == 3
    assert ds.synthesized == ["features"] and ds.x.shape == (N, 64)
    assert not bool((ds.train_mask | ds.val_mask | ds.test_mask)[2])  # random split: labeled only


def _split_file(tmp_path: Path, layout: str) -> Path:
    train, val, test = [0, 1, 2], [3, 4], [5, 7]
    if layout in ("npz", "npz-valid"):
        path = tmp_path / "s.npz"
        np.savez(path, train=np.array(train), test=np.array(test),
                 **{"val" if layout == "npz" else "valid": np.array(val)})
    elif layout == "npz-masks":
        path = tmp_path / "s.npz"
        masks = np.zeros((3, N), dtype=bool)
        for k, ids in enumerate((train, val, test)):
            masks[k, ids] = True
        np.savez(path, train=masks[0], val=masks[1], test=masks[2])
    elif layout == "csv-names":
        path = tmp_path / "s.csv"
        path.write_text("".join(f"{v},{n}\n" for n, ids in (("train", train), ("valid", val),
                                                               ("test", test)) for v in ids))
    else:
        codes = np.full(N, -1)
        for k, ids in enumerate((train, val, test)):
            codes[ids] = k
        if layout == "npy-codes":
            path = tmp_path / "s.npy"
            np.save(path, codes)
        else:
            path = _csv(tmp_path / "s.csv", codes)
    return path


@pytest.mark.parametrize("layout", ["npz", "npz-valid", "npz-masks", "csv-names", "npy-codes",
                                    "csv-codes"])
def test_split_layouts(edges: Path, tmp_path: Path, layout: str) -> None:
    ds = load_edgelist(edges, features=_csv(tmp_path / "x.csv", _x()),
                       split=_split_file(tmp_path, layout))
    assert torch.nonzero(ds.train_mask).flatten().tolist() == [0, 1, 2]
    assert torch.nonzero(ds.val_mask).flatten().tolist() == [3, 4]
    assert torch.nonzero(ds.test_mask).flatten().tolist() == [5, 7]
    assert ds.info["split"].startswith("file ")


def test_split_without_vertex_data_uses_dense_ids(edges: Path, tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text("0,train\n1,val\n2,test\n3,test\n")
    ds = load_edgelist(edges, split=path)  # no features/labels: 4 dense vertices
    assert ds.num_nodes == 4 and ds.synthesized == ["features", "labels"]
    assert ds.train_mask.tolist() == [True, False, False, False]


def test_header_true_skips_a_header_in_every_text_file(tmp_path: Path) -> None:
    (tmp_path / "g.csv").write_text("# my graph\nsrc,dst\n0,1\n1,2\n")
    _csv(tmp_path / "x.csv", _x(3), head="a,b,c\n")
    _csv(tmp_path / "y.csv", _y(3), head="label\n")
    (tmp_path / "s.csv").write_text("id,set\n0,train\n1,val\n2,test\n")
    ds = load_edgelist(tmp_path / "g.csv", features=tmp_path / "x.csv",
                       labels=tmp_path / "y.csv", split=tmp_path / "s.csv", header=True)
    assert ds.num_nodes == 3 and _edge_set(ds) == {(0, 1), (1, 2)}
    assert torch.equal(ds.x, torch.from_numpy(_x(3))) and ds.y.tolist() == [0, 1, 2]
    assert ds.val_mask.tolist() == [False, True, False]
    assert read_edgelist(tmp_path / "g.csv", header=True).num_nodes == 3


def test_classes_key_sets_the_label_range(edges: Path, tmp_path: Path) -> None:
    labels = _csv(tmp_path / "y.csv", _y())
    assert load_edgelist(edges, labels=labels, classes=5).num_classes == 5
    with pytest.raises(DatasetError) as err:
        load_edgelist(edges, labels=labels, classes=2)
    msg = str(err.value)
    assert "y.csv" in msg and "[0, classes=2)" in msg and "vertex 2 has 2" in msg


def test_lg_file_rows_are_its_one_based_ids(tmp_path: Path) -> None:
    path = tmp_path / "g.jlg"
    path.write_text("4,2,u,g\n1,2\n2,3\n")
    ds = load_edgelist(path, features=_csv(tmp_path / "x.csv", _x(4)))
    assert ds.num_nodes == 4 and _edge_set(ds) == {(0, 1), (1, 0), (1, 2), (2, 1)}
    with pytest.raises(DatasetError, match="5 rows of features.*LG header"):
        load_edgelist(path, features=_csv(tmp_path / "x5.csv", _x(5)))


# ------------------------------------------------------------------------ errors
def test_feature_rows_fewer_than_max_id_plus_one(edges: Path, tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as err:
        load_edgelist(edges, features=_csv(tmp_path / "x.csv", _x(5)))
    msg = str(err.value)
    assert "x.csv: 5 rows of features, but the graph has 8 vertices" in msg
    assert "max id + 1 = 8" in msg and "out of range" in msg


def test_features_and_labels_disagree_on_rows(edges: Path, tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as err:
        load_edgelist(edges, features=_csv(tmp_path / "x.csv", _x(9)),
                      labels=_csv(tmp_path / "y.csv", _y(10)))
    msg = str(err.value)
    assert "9 rows of features, but the graph has 10 vertices" in msg and "y.csv has 10" in msg


@pytest.mark.parametrize("value, words", [("1.5", "vertex 4 has 1.5"), ("-2", "vertex 4 has -2"),
                                          ("nan", "vertex 4 has nan")])
def test_bad_labels_name_the_vertex(edges: Path, tmp_path: Path, value: str, words: str) -> None:
    path = tmp_path / "y.csv"
    path.write_text("0\n1\n2\n0\n" + value + "\n1\n2\n0\n")
    with pytest.raises(DatasetError) as err:
        load_edgelist(edges, labels=path)
    assert words in str(err.value) and "y.csv" in str(err.value)


def test_non_finite_features(edges: Path, tmp_path: Path) -> None:
    x = _x()
    x[6, 2] = np.inf
    path = tmp_path / "x.npy"
    np.save(path, x)
    with pytest.raises(DatasetError, match=r"x.npy: features must be finite; vertex 6, column 2"):
        load_edgelist(edges, features=path)


@pytest.mark.parametrize("text, words", [
    ("0,train\n1,val\n0,train\n", "vertex 0 is named twice in train"),
    ("0,train\n3,val\n3,test\n", "vertex 3 is named in val and test"),
    ("0,train\n8,test\n", "the test set names vertex 8, outside [0, 8)"),
    ("0,train\n1,dev\n", "line 2: unknown set 'dev'"),
])
def test_bad_split_files(edges: Path, tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "s.csv"
    path.write_text(text)
    with pytest.raises(DatasetError) as err:
        load_edgelist(edges, features=_csv(tmp_path / "x.csv", _x()), split=path)
    assert words in str(err.value) and "s.csv" in str(err.value)


def test_split_npz_twice_across_sets_and_codes(edges: Path, tmp_path: Path) -> None:
    x = _csv(tmp_path / "x.csv", _x())
    path = tmp_path / "s.npz"
    np.savez(path, train=np.array([1, 2]), valid=np.array([4]), test=np.array([2, 5]))
    with pytest.raises(DatasetError, match="vertex 2 is named in train and test"):
        load_edgelist(edges, features=x, split=path)
    np.save(tmp_path / "c.npy", np.array([0, 1, 2, 3, 0, 0, 0, 0]))
    with pytest.raises(DatasetError, match="vertex 3 has 3"):
        load_edgelist(edges, features=x, split=tmp_path / "c.npy")
    np.save(tmp_path / "c.npy", np.zeros(5, dtype=np.int64))
    with pytest.raises(DatasetError, match="5 split codes, but the graph has 8 vertices"):
        load_edgelist(edges, features=x, split=tmp_path / "c.npy")


def test_split_naming_an_unlabeled_vertex(edges: Path, tmp_path: Path) -> None:
    y = _y()
    y[3] = -1
    path = tmp_path / "s.csv"
    path.write_text("0,train\n3,test\n")
    with pytest.raises(DatasetError, match="test set names vertex 3, which is unlabeled"):
        load_edgelist(edges, labels=_csv(tmp_path / "y.csv", y), split=path)


def test_npz_without_the_key_lists_its_keys(edges: Path, tmp_path: Path) -> None:
    path = tmp_path / "x.npz"
    np.savez(path, feats=_x(), other=np.zeros(3))
    with pytest.raises(DatasetError) as err:
        load_edgelist(edges, features=path)
    assert "'x' or 'features'" in str(err.value) and "['feats', 'other']" in str(err.value)
    np.savez(tmp_path / "s.npz", train=np.arange(2), test=np.arange(2, 4))
    with pytest.raises(DatasetError, match=r"lacks \['val'\] and holds \['train', 'test'\]"):
        load_edgelist(edges, features=_csv(tmp_path / "x.csv", _x()), split=tmp_path / "s.npz")


def test_missing_file_and_unknown_extension(edges: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    for kind in (DatasetError, DatasetNotFoundError, MissingFileError):
        with pytest.raises(kind, match=f"features file {missing} does not exist"):
            load_edgelist(edges, features=missing)
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(DatasetError, match=r"x.parquet: unknown extension.*\.csv.*\.npy.*\.npz"):
        load_edgelist(edges, labels=tmp_path / "x.parquet")


# ----------------------------------------------------- header and empty-field messages
def test_header_line_is_named_not_called_damage(tmp_path: Path) -> None:
    path = tmp_path / "g.csv"
    path.write_text("src,dst\n0,1\n1,2\n")
    with pytest.raises(DatasetError) as err:
        read_edgelist(path)
    msg = str(err.value)
    assert not isinstance(err.value, DamagedFileError)
    assert "line 1: the first line 'src,dst' looks like a header" in msg and "header=true" in msg
    assert "download" not in msg.lower()
    path.write_text("weights\n0 1\n")  # one word: a header too, not "expected 'src dst'"
    with pytest.raises(DatasetError, match="'weights' looks like a header"):
        read_edgelist(path)
    path.write_text("0 1\n")
    feats = _csv(tmp_path / "x.csv", _x(2), head="f0,f1,f2\n")
    with pytest.raises(DatasetError, match=r"x.csv, line 1: the first line 'f0,f1,f2' looks"):
        load_edgelist(path, features=feats)


@pytest.mark.parametrize("text, line, col", [
    ("1.0,,2.0\n3.0,4.0,5.0\n", 1, 2),
    ("1.0,2.0\n3.0,,4.0\n", 2, 2),  # the same value count as line 1: still found
    ("1.0,2.0,3.0\n,4.0,5.0\n", 2, 1),
    ("1.0,2.0,3.0\n4.0,5.0,\n6.0,7.0,8.0\n", 2, 3),
])
def test_empty_field_names_file_line_and_column(tmp_path: Path, text: str, line: int,
                                                col: int) -> None:
    (tmp_path / "g.csv").write_text("0,1\n")
    path = tmp_path / "x.csv"
    path.write_text(text)
    with pytest.raises(DatasetError) as err:
        load_edgelist(tmp_path / "g.csv", features=path)
    msg = str(err.value)
    assert not isinstance(err.value, DamagedFileError)
    assert f"x.csv, line {line}, column {col}: the value is empty" in msg


def test_empty_field_in_an_edge_list_and_cut_short_gzip(tmp_path: Path) -> None:
    path = tmp_path / "g.csv"
    path.write_text("0,1\n1,,2\n")
    with pytest.raises(DatasetError, match="g.csv, line 2, column 2: the value is empty"):
        read_edgelist(path)
    gz = tmp_path / "g.csv.gz"
    gz.write_bytes(gzip.compress(b"0,1\n1,2\n" * 50)[:-12])
    with pytest.raises(DamagedFileError, match="damaged gzip file"):
        read_edgelist(gz)


# ------------------------------------------------------------------ spec and cache
def test_spec_keys_resolve_paths_and_show_in_describe(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "g.csv").write_text("src,dst\n" + EDGES)
    _csv(tmp_path / "data" / "x.csv", _x(), head="a,b,c\n")  # header=true: every text file
    np.save(tmp_path / "data" / "y.npy", _y())
    ds = load("csv:data/g.csv,features=data/x.csv,labels=data/y.npy,header=true,classes=4",
              root=tmp_path)
    spec = ds.info["spec"]
    assert f"features={tmp_path / 'data' / 'x.csv'}" in spec
    assert f"labels={tmp_path / 'data' / 'y.npy'}" in spec and "header=true" in spec
    assert "split=auto" in spec and "classes=4" in spec
    assert ds.num_classes == 4 and ds.synthesized == [] and ds.summary()["synthesized"] == []
    text = describe()
    for key in ("features=auto", "labels=auto", "split=auto", "header=false", "classes=auto"):
        assert key in text
    assert parse_spec("edgelist:g.csv,classes=auto").params["classes"] is None


def test_cache_is_not_stale_after_a_vertex_file_changes(tmp_path: Path) -> None:
    (tmp_path / "g.csv").write_text(EDGES)
    feats = _csv(tmp_path / "x.csv", _x())
    spec = f"edgelist:{tmp_path / 'g.csv'},features={feats}"
    first = load(spec, root=tmp_path)
    again = load(spec, root=tmp_path)
    assert first.info["cache"] == "miss" and again.info["cache"] == "hit"
    assert torch.equal(again.x, first.x) and again.synthesized == ["labels"]  # kept in the cache
    before = feats.stat()
    _csv(feats, _x() + 1)  # same size, new values
    os.utime(feats, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    changed = load(spec, root=tmp_path)
    assert changed.info["cache"] == "miss"
    assert torch.equal(changed.x, torch.from_numpy(_x() + 1))


def test_synthesized_flags_of_the_generators() -> None:
    for spec in ("sbm:nodes=60,blocks=3", "rmat:scale=6,edge_factor=4"):
        ds = load(spec, cache=False)
        assert ds.synthesized == ["features", "labels"]
        assert ds.summary()["synthesized"] == ["features", "labels"]


def test_synthesized_flags_of_planetoid(data_dir: Path) -> None:
    assert load("cora", root=data_dir).summary()["synthesized"] == []
    assert load("cora:structure", root=data_dir).synthesized == ["features"]
