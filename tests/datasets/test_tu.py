"""TU text format: MUTAG read as its README describes, the tu:PATH spec, and every file
mistake reported with the file, the line and what was expected."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ngra.datasets import (
    DatasetError,
    DatasetNotFoundError,
    GraphDataset,
    MissingFileError,
    load,
    load_tu,
)


@pytest.fixture
def mutag_dir(shared_data: Path) -> Path:
    folder = shared_data / "tu" / "MUTAG"
    if not (folder / "MUTAG_A.txt").is_file():
        pytest.skip(f"MUTAG not found under {folder}")
    return folder


def write_tu(folder: Path, files: dict[str, list[str]], prefix: str = "T") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for key, lines in files.items():
        (folder / f"{prefix}_{key}.txt").write_text("".join(f"{ln}\n" for ln in lines))
    return folder


def small() -> dict[str, list[str]]:
    """Graph 1: nodes 1-3, a path 1-2-3 (both directions); graph 2: nodes 4-5, 4 -> 5."""
    return {
        "A": ["1, 2", "2, 1", "2, 3", "3, 2", "4, 5"],
        "graph_indicator": ["1", "1", "1", "2", "2"],
        "graph_labels": ["-1", "1"],
        "node_labels": ["0", "2", "0", "1", "1"],
        "edge_labels": ["0", "0", "1", "1", "3"],
    }


def test_mutag_matches_its_readme(mutag_dir: Path):
    ds = load_tu(mutag_dir)
    assert isinstance(ds, GraphDataset)
    assert (len(ds), ds.num_nodes, ds.num_edges, ds.num_classes) == (188, 3371, 7442, 2)
    assert ds.label_values.tolist() == [-1, 1]
    assert ds.info["x"] == "one_hot_node_labels" and ds.num_features == 7  # C N O F I Cl Br
    assert ds.info["edge_attr"] == "one_hot_edge_labels" and ds.edge_attr.shape == (7442, 4)
    assert torch.equal(ds.x.sum(1), torch.ones(3371))
    raw = np.loadtxt(mutag_dir / "MUTAG_graph_labels.txt", dtype=np.int64)
    assert torch.equal(ds.label_values[ds.y], torch.from_numpy(raw))
    assert ds.summary()["class_counts"] == [63, 125]
    # the edges are the file's, as a set, each inside its graph
    a = np.loadtxt(mutag_dir / "MUTAG_A.txt", delimiter=",", dtype=np.int64) - 1
    ei = ds.graph.edge_index().numpy()
    assert sorted(map(tuple, ei.T.tolist())) == sorted(map(tuple, a.tolist()))
    assert ds.reciprocity == 1.0  # every bond listed both ways


def test_spec_loads_a_graph_dataset(mutag_dir: Path):
    ds = load(f"tu:{mutag_dir}")
    assert isinstance(ds, GraphDataset) and len(ds) == 188
    assert ds.info["spec"] == f"tu:path={mutag_dir}"


def test_small_folder_csc_order_and_edge_data(tmp_path: Path):
    ds = load_tu(write_tu(tmp_path / "T", small()))
    assert ds.node_ptr.tolist() == [0, 3, 5] and ds.edge_ptr.tolist() == [0, 4, 5]
    assert ds.y.tolist() == [0, 1] and ds.label_values.tolist() == [-1, 1]
    # CSC: sorted by destination; edge data follows its edge
    assert ds.graph.edge_index().tolist() == [[1, 0, 2, 1, 3], [0, 1, 1, 2, 4]]
    assert ds.edge_label.tolist() == [0, 0, 1, 1, 3]
    assert ds.x.tolist()[1] == [0.0, 0.0, 1.0]  # one-hot over the values 0, 1, 2
    assert ds.node_label.tolist() == [0, 2, 0, 1, 1]


def test_features_prefer_attributes_then_labels_then_ones(tmp_path: Path):
    files = small()
    files["node_attributes"] = ["0.5, 1", "1, 2", "2, 3", "3, 4", "4, 5"]
    files["edge_attributes"] = ["1.5", "2", "3", "4", "5"]
    ds = load_tu(write_tu(tmp_path / "attr", files))
    assert ds.info["x"] == "node_attributes" and ds.x[0].tolist() == [0.5, 1.0]
    assert ds.info["edge_attr"] == "edge_attributes" and ds.edge_attr.shape == (5, 1)
    bare = {k: v for k, v in small().items() if k in ("A", "graph_indicator", "graph_labels")}
    ds = load_tu(write_tu(tmp_path / "bare", bare))
    assert ds.info["x"] == "constant" and torch.equal(ds.x, torch.ones(5, 1))
    assert ds.edge_attr is None and ds.info["edge_attr"] is None


def test_raw_subfolder_is_found(tmp_path: Path):
    write_tu(tmp_path / "T" / "raw", small())
    assert len(load_tu(tmp_path / "T")) == 2


def test_missing_folder_and_required_file(tmp_path: Path):
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        load_tu(tmp_path / "nowhere")
    files = small()
    del files["graph_labels"]
    with pytest.raises(MissingFileError, match=r"T_graph_labels\.txt is missing"):
        load_tu(write_tu(tmp_path / "T", files))


@pytest.mark.parametrize(
    "key, lines, message",
    [
        ("node_labels", ["0", "2", "0", "1"],
         r"T_node_labels\.txt has 4 lines but T_graph_indicator\.txt has 5 \(one per node\)"),
        ("edge_labels", ["0"],
         r"T_edge_labels\.txt has 1 lines but T_A\.txt has 5 \(one per edge\)"),
        ("graph_indicator", ["1", "2", "1", "2", "2"],
         r"T_graph_indicator\.txt, line 3: graph id 1 after 2; .* non-decreasing"),
        ("graph_indicator", ["0", "1", "1", "2", "2"], r"line 1: graph id 0; ids are 1-based"),
        ("graph_indicator", ["1", "1", "1", "2", "3"],
         r"line 5: graph id 3, but T_graph_labels\.txt has 2 lines"),
        ("A", ["1, 2", "2, 1", "2, 6", "3, 2", "4, 5"], r"T_A\.txt, line 3: edge \[2, 6\] names a "
         r"node outside \[1, 5\]"),
        ("A", ["1, 2", "2, 1", "2, 3", "3, 4", "4, 5"],
         r"T_A\.txt, line 4: edge \[3, 4\] joins graph 1 and graph 2"),
    ],
)
def test_inconsistent_files_name_file_and_line(tmp_path: Path, key, lines, message):
    files = small()
    files[key] = lines
    with pytest.raises(DatasetError, match=message):
        load_tu(write_tu(tmp_path / "T", files))


def test_graph_with_no_nodes_is_kept(tmp_path: Path):
    files = small()
    files["graph_labels"] = ["-1", "1", "1"]
    files["graph_indicator"] = ["1", "1", "1", "3", "3"]  # graph 2 has no nodes
    ds = load_tu(write_tu(tmp_path / "T", files))
    assert ds.node_ptr.tolist() == [0, 3, 3, 5] and ds[1].num_nodes == 0


def test_node_training_refuses_a_graph_dataset(tmp_path: Path):
    from ngra.datasets import check_trainable

    ds = load_tu(write_tu(tmp_path / "T", small()))
    with pytest.raises(DatasetError, match="graph-classification dataset \\(2 graphs"):
        check_trainable(ds, "tu:T")
