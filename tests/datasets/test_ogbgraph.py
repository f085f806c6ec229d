"""load_ogb_graph / ``ogbg:PATH``: a tiny OGB graph-property folder written in tmp_path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ngra.datasets import DamagedFileError, DatasetError, DatasetNotFoundError, load
from ngra.datasets.ogbgraph import load_ogb_graph
from ngra.training.graph_task import graph_parts
from ogbg_folder import ogbg_folder, ogbg_tasks_folder, write_csv


def _edges(ds) -> set[tuple[int, int, float]]:
    g = ds.graph
    dst = np.repeat(np.arange(g.num_nodes), np.diff(ds.indptr.numpy()))
    return {(int(s), int(d), float(a)) for s, d, a in
            zip(ds.indices.numpy(), dst, ds.edge_attr[:, 0].numpy())}


def test_reads_graphs_features_labels_and_split(tmp_path):
    ds = load_ogb_graph(ogbg_folder(tmp_path))
    assert len(ds) == 4 and ds.node_ptr.tolist() == [0, 3, 5, 9, 10]
    assert ds.num_edges == 6 and ds.info["direction"] == "unstated (edges as listed)"
    # local ids shifted by each graph's node offset; edge features follow their edge
    assert _edges(ds) == {(0, 1, 0.0), (1, 2, 1.0), (3, 4, 2.0), (5, 6, 3.0), (7, 8, 4.0),
                          (8, 5, 5.0)}
    assert ds.x.dtype == torch.float32 and ds.x[:, 1].tolist() == [10.0 * i for i in range(10)]
    assert ds.info["x"] == "node_feat" and ds.info["edge_attr"] == "edge_feat"
    assert ds.y.tolist() == [0, 1, 0, 1] and ds.num_classes == 2
    assert {k: v.tolist() for k, v in ds.split.items()} == {"train": [0, 2], "val": [1],
                                                            "test": [3]}
    assert ds.info["split"] == "scaffold" and ds.summary()["split"] == {"train": 2, "val": 1,
                                                                        "test": 1}
    assert ds[1:3].split is None  # a subset's ids would name other graphs


def test_direction_follows_ogb_for_molecules_and_is_a_choice(tmp_path):
    mol = load_ogb_graph(ogbg_folder(tmp_path, "ogbg_molhiv"))
    assert mol.num_edges == 12 and "add_inverse_edge=True" in mol.info["direction"]
    # each edge's reverse carries the same edge features (as the ogb package lists them)
    assert (1, 0, 0.0) in _edges(mol) and (5, 8, 5.0) in _edges(mol)
    assert load_ogb_graph(ogbg_folder(tmp_path, "ogbg_molhiv2"), symmetric=False).num_edges == 6
    assert load_ogb_graph(ogbg_folder(tmp_path / "a"), symmetric=True).num_edges == 12


def test_spec_and_graph_parts_use_the_folders_split(tmp_path):
    ds = load(f"ogbg:{ogbg_folder(tmp_path)},split=scaffold")
    assert ds.info["spec"].startswith("ogbg:") and len(ds) == 4
    parts = graph_parts(ds, val=0.5, test=0.25, seed=0)  # val/test fractions not used
    assert {k: v.tolist() for k, v in parts.items()} == {"train": [0, 2], "val": [1],
                                                         "test": [3]}
    plain = load_ogb_graph(ogbg_folder(tmp_path / "b", split=False))
    assert plain.split is None and plain.info["split"] is None
    assert sum(v.size for v in graph_parts(plain, 0.25, 0.25, 0).values()) == 4


# ------------------------------------------------------------------ binary tasks (molpcba)
def test_multi_task_labels_with_missing_entries(tmp_path):
    f = ogbg_folder(tmp_path)
    write_csv(f / "raw" / "graph-label.csv", [[1, "", 0], ["", "nan", 1], [0, 1, ""],
                                              ["", "", ""]])
    ds = load_ogb_graph(f)
    nan = float("nan")
    assert ds.task_type == "binary" and ds.num_tasks == 3 and ds.num_outputs == 3
    assert ds.y.dtype == torch.float32 and torch.equal(
        ds.y.isnan(), torch.tensor([[0, 1, 0], [1, 1, 0], [0, 0, 1], [1, 1, 1]]).bool())
    assert torch.allclose(ds.y, torch.tensor([[1, nan, 0], [nan, nan, 1], [0, 1, nan],
                                              [nan] * 3]), equal_nan=True)
    assert ds.metric == "roc_auc" and "width" in ds.info["task_source"]
    s = ds.summary()
    assert (s["task_type"], s["num_tasks"], s["missing_labels"], s["class_counts"]) == (
        "binary", 3, 7, [2, 3])
    sub = ds[[2, 0]]  # a subset keeps the task type and its rows of y
    assert sub.task_type == "binary" and sub.y[:, 0].tolist() == [0.0, 1.0]


def test_fields_of_one_digit_and_other_numbers_read_alike(tmp_path):
    """0/1/empty fields are read without the parser; written as 1.0, 0.0 and nan (the
    general parser) the same labels load the same."""
    rows = [[1, "", 0], ["", "", 1], [0, 1, ""], ["", "", ""]]
    fast = ogbg_folder(tmp_path / "a")
    write_csv(fast / "raw" / "graph-label.csv", rows)
    slow = ogbg_folder(tmp_path / "b")
    write_csv(slow / "raw" / "graph-label.csv",
              [[f"{v}.0" if v != "" else "nan" for v in r] for r in rows])
    assert torch.equal(load_ogb_graph(fast).y.nan_to_num(7), load_ogb_graph(slow).y.nan_to_num(7))


def test_task_type_and_metric_from_ogbs_names_and_master_csv(tmp_path):
    hiv = load_ogb_graph(ogbg_folder(tmp_path, "ogbg_molhiv"))  # one 0/1 column: binary
    assert (hiv.task_type, hiv.num_tasks, hiv.metric) == ("binary", 1, "roc_auc")
    assert hiv.y[:, 0].tolist() == [0.0, 1.0, 0.0, 1.0] and "ogbg-molhiv" in hiv.info[
        "task_source"]
    pcba = load_ogb_graph(ogbg_folder(tmp_path, "ogbg_molpcba"))
    assert (pcba.task_type, pcba.metric) == ("binary", "ap")
    ppa = load_ogb_graph(ogbg_folder(tmp_path, "ogbg_ppa"))
    assert (ppa.task_type, ppa.metric, ppa.num_outputs) == ("multiclass", "accuracy", 2)
    stated = load_ogb_graph(ogbg_tasks_folder(tmp_path, master="binary classification,ap"))
    assert (stated.task_type, stated.num_tasks, stated.metric) == ("binary", 3, "ap")
    assert stated.info["task_source"].endswith("master.csv (tasks)")
    assert load_ogb_graph(ogbg_folder(tmp_path, "plain")).task_type == "multiclass"  # as TU


@pytest.mark.parametrize("rows, match", [
    ([[1, "", 0], [0, 2, 1], [0, 1, ""], [1, 1, 1]],
     r"graph-label.csv.gz, line 2, column 2: label 2.0; a binary classification file holds 0, "
     "1 or an empty field"),
    ([[1, "", 0], [0, 1], [0, 1, ""], [1, 1, 1]],
     r"graph-label.csv.gz, line 2: 2 fields, but line 1 holds 3; every line holds one field "
     "per task"),
    ([[1, 0], [0, 1], [1, 1]], "3 lines, but num-node-list has 4 graphs"),
])
def test_bad_multi_task_label_files(tmp_path, rows, match):
    f = ogbg_folder(tmp_path)
    write_csv(f / "raw" / "graph-label.csv", rows)
    with pytest.raises(DatasetError, match=match):
        load_ogb_graph(f)


def test_tasks_graph_classification_cannot_train_are_refused(tmp_path):
    with pytest.raises(DatasetError, match=r"says task type 'regression'.*not regression"):
        load_ogb_graph(ogbg_folder(tmp_path, "ogbg_molesol"))
    f = ogbg_tasks_folder(tmp_path, master="binary classification,rmse")
    with pytest.raises(DatasetError, match="eval metric 'rmse' for binary classification; "
                                           "expected rocauc or ap"):
        load_ogb_graph(f)
    g = ogbg_tasks_folder(tmp_path / "m", master="multiclass classification,acc")
    with pytest.raises(DatasetError, match="3 label columns; a multiclass dataset holds one"):
        load_ogb_graph(g)


# ----------------------------------------------------------------------------- errors
def test_missing_folder_and_files(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        load_ogb_graph(tmp_path / "nowhere")
    f = ogbg_folder(tmp_path)
    (f / "raw" / "graph-label.csv.gz").unlink()
    with pytest.raises(DatasetNotFoundError, match=r"missing .*graph-label\.csv\.gz"):
        load_ogb_graph(f)
    g = ogbg_folder(tmp_path / "s")
    (g / "split" / "scaffold" / "valid.csv.gz").unlink()
    with pytest.raises(DatasetNotFoundError, match=r"valid\.csv\.gz"):
        load_ogb_graph(g)


@pytest.mark.parametrize("file, rows, match", [
    ("num-edge-list.csv", [2, 1, 3], "num-node-list.csv.gz has 4 lines but "
                                     "num-edge-list.csv.gz has 3"),
    ("num-edge-list.csv", [2, 1, 2, 0], "6 edge lines, but num-edge-list.csv.gz sums to 5"),
    ("node-feat.csv", [[0, 0]] * 9, "9 lines, but num-node-list.csv.gz sums to 10 nodes"),
    ("graph-label.csv", [0, 1, 0], "3 lines, but num-node-list has 4 graphs"),
    ("graph-label.csv", [0, "nan", 0, 1], "line 2: label nan"),
    ("graph-label.csv", [0, 0.5, 0, 1], "line 2: label 0.5"),
    ("edge.csv", [[0, 1], [1, 2], [0, 1], [0, 1], [2, 3], [3, 4]],
     r"edge.csv.gz, line 6: edge \[3, 4\] of graph 2 names a node outside \[0, 4\)"),
    ("num-node-list.csv", [3, 2, -4, 1], "line 3: count -4"),
])
def test_inconsistent_files(tmp_path, file, rows, match):
    f = ogbg_folder(tmp_path)
    write_csv(f / "raw" / file, rows, gz=not file.startswith("edge-feat"))
    with pytest.raises(DatasetError, match=match):
        load_ogb_graph(f)


def test_edge_features_must_match_edges(tmp_path):
    f = ogbg_folder(tmp_path)
    write_csv(f / "raw" / "edge-feat.csv", [[0]] * 5, gz=False)
    with pytest.raises(DatasetError, match="edge-feat.csv: 5 lines, .* sums to 6 edges"):
        load_ogb_graph(f)


def test_empty_gz_is_damage(tmp_path):
    f = ogbg_folder(tmp_path)
    (f / "raw" / "edge.csv.gz").write_bytes(b"")
    with pytest.raises(DamagedFileError, match=r"edge\.csv\.gz is empty \(0 bytes\)"):
        load_ogb_graph(f)


@pytest.mark.parametrize("part, ids, match", [
    ("test", [4], "test.csv.gz, line 1: graph id 4; there are 4 graphs"),
    ("test", [1], "graph 1 is already in valid"),
    ("train", [0, 2, 0], "graph 0 is listed 2 times"),
])
def test_bad_split(tmp_path, part, ids, match):
    f = ogbg_folder(tmp_path)
    write_csv(f / "split" / "scaffold" / f"{part}.csv", ids)
    with pytest.raises(DatasetError, match=match):
        load_ogb_graph(f)


def test_split_choice(tmp_path):
    f = ogbg_folder(tmp_path)
    write_csv(f / "split" / "random" / "train.csv", [0])
    with pytest.raises(DatasetNotFoundError, match="exactly one split folder"):
        load_ogb_graph(f)
    assert load_ogb_graph(f, split="scaffold").info["split"] == "scaffold"
    with pytest.raises(DatasetNotFoundError, match="no split 'time'"):
        load_ogb_graph(f, split="time")
