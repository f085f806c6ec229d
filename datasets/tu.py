"""The TU Dortmund graph-kernel collection's text format (MUTAG, PROTEINS, NCI1, ...).

A folder ``DS/`` (or ``DS/raw/``, PyG's layout) holds, for ``n`` nodes, ``m`` edges and
``N`` graphs, comma-separated text with **1-based** ids:

=========================  =======  =====================================================
file                       lines    content
=========================  =======  =====================================================
``DS_A.txt``               m        ``src, dst`` of each directed edge (required)
``DS_graph_indicator.txt`` n        graph id of each node, non-decreasing (required)
``DS_graph_labels.txt``    N        class label of each graph (required)
``DS_node_labels.txt``     n        integer label(s) of each node
``DS_node_attributes.txt`` n        float attribute vector of each node
``DS_edge_labels.txt``     m        integer label(s) of each edge
``DS_edge_attributes.txt`` m        float attribute vector of each edge
=========================  =======  =====================================================

Node features ``x`` are the node attributes if given, else the one-hot node labels (one
block per label column, over the values that occur), else a constant 1 column;
``info["x"]`` says which. Edge features likewise (attributes, else one-hot labels, else
none; ``info["edge_attr"]``). Edges are kept as listed (undirected datasets list both
directions), sorted to CSC. ``DS_graph_attributes.txt`` (regression targets) is not read.

Every check names the file and line: a missing required file, line counts that
disagree, a graph indicator that decreases or names no graph, an edge id out of range,
an edge joining two graphs.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ._text import parse_numbers, read_text
from .base import DatasetError, DatasetNotFoundError, MissingFileError
from .graphs import GraphDataset

__all__ = ["TU_URL", "load_tu", "tu_source_files"]

#: The TU collection's archive of a dataset by name (https://chrsmrrs.github.io/datasets/),
#: unpacked as ``<root>/tu/<name>/`` by ``tu:<name>`` (:func:`ngra.datasets.load`).
TU_URL = "https://www.chrsmrrs.de/graphkerneldatasets/{name}.zip"

_REQUIRED = ("A", "graph_indicator", "graph_labels")
_OPTIONAL = ("node_labels", "node_attributes", "edge_labels", "edge_attributes")
_FIX = "Replace it with a good copy of the TU dataset."


def _locate(path: Path) -> tuple[Path, str]:
    """``(folder, prefix)`` of the ``PREFIX_A.txt`` in ``path`` or ``path/raw``."""
    if not path.is_dir():
        raise DatasetNotFoundError(f"TU dataset folder {path} does not exist (expected a folder "
                                   "holding DS_A.txt, DS_graph_indicator.txt, ...).")
    for folder in (path, path / "raw"):
        found = sorted(folder.glob("*_A.txt")) if folder.is_dir() else []
        if len(found) == 1:
            return folder, found[0].name[: -len("_A.txt")]
        if len(found) > 1:
            mine = [f for f in found if f.name == f"{path.name}_A.txt"]
            if mine:
                return folder, path.name
            raise DatasetError(f"{folder} holds several TU datasets "
                               f"({', '.join(f.name for f in found)}); give one dataset's folder.")
    return path, path.name  # no *_A.txt: the required-file check names what is missing


def tu_source_files(path: str | os.PathLike[str]) -> list[Path]:
    """The TU files of the dataset in ``path`` that exist (what a cache would stamp)."""
    folder, prefix = _locate(Path(path))
    return [f for k in (*_REQUIRED, *_OPTIONAL)
            if (f := folder / f"{prefix}_{k}.txt").is_file()]


def _read(file: Path, as_float: bool = False) -> np.ndarray:
    """``[rows, cols]`` numbers of a comma-separated file (cols from its first line)."""
    text = read_text(file, _FIX)
    first = next((ln for ln in text.split(b"\n", 64) if ln.strip()), b"")
    cols = max(len(first.replace(b",", b" ").split()), 1)
    values = parse_numbers(text, file, progress=False, as_float=as_float, columns=cols, fix=_FIX)
    return values.reshape(-1, cols)


def _one_hot(labels: np.ndarray) -> tuple[np.ndarray, list[list[int]]]:
    """One-hot of each label column over the values it holds, side by side."""
    blocks, values = [], []
    for col in labels.T:
        vals, inv = np.unique(col, return_inverse=True)
        block = np.zeros((col.size, vals.size), dtype=np.float32)
        block[np.arange(col.size), inv.reshape(-1)] = 1.0
        blocks.append(block)
        values.append(vals.tolist())
    return np.concatenate(blocks, axis=1), values


def load_tu(path: str | os.PathLike[str]) -> GraphDataset:
    """Read a TU dataset folder (see the module docstring for the files).

    Args:
        path: the folder holding ``DS_A.txt`` and the other files (or their ``raw/``).

    Returns:
        A :class:`~ngra.datasets.graphs.GraphDataset`; ``info`` says where ``x`` and
        ``edge_attr`` came from and which files were read.

    Raises:
        DatasetNotFoundError: no such folder.
        MissingFileError: a required file is missing (also a :class:`DatasetError`).
        DatasetError: files that disagree (line counts, ids, an edge joining two graphs).
        DamagedFileError: a line that is not numbers, or holds too few.
    """
    folder, prefix = _locate(Path(path).expanduser())
    files = {k: folder / f"{prefix}_{k}.txt" for k in (*_REQUIRED, *_OPTIONAL)}
    for k in _REQUIRED:
        if not files[k].is_file():
            there = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
            raise MissingFileError(
                f"TU dataset {prefix}: required file {files[k]} is missing (a TU folder needs "
                f"{', '.join(f'{prefix}_{r}.txt' for r in _REQUIRED)}; found: "
                f"{', '.join(there) or 'nothing'}).")
    name_of = {k: f.name for k, f in files.items()}

    graph_of = _read(files["graph_indicator"])[:, 0]
    n = graph_of.size
    labels = _read(files["graph_labels"])[:, 0]
    num_graphs = labels.size
    if n and graph_of.min() < 1:
        line = int(np.flatnonzero(graph_of < 1)[0]) + 1
        raise DatasetError(f"{name_of['graph_indicator']}, line {line}: graph id "
                           f"{int(graph_of[line - 1])}; ids are 1-based, in [1, {num_graphs}].")
    down = np.flatnonzero(graph_of[1:] < graph_of[:-1])
    if down.size:
        line = int(down[0]) + 2
        raise DatasetError(
            f"{name_of['graph_indicator']}, line {line}: graph id {int(graph_of[line - 1])} "
            f"after {int(graph_of[line - 2])}; the graph indicator must be non-decreasing "
            "(each graph's nodes listed together, graphs in order).")
    if n and graph_of[-1] > num_graphs:
        line = int(np.flatnonzero(graph_of > num_graphs)[0]) + 1
        raise DatasetError(
            f"{name_of['graph_indicator']}, line {line}: graph id {int(graph_of[line - 1])}, "
            f"but {name_of['graph_labels']} has {num_graphs} lines (one per graph).")

    arrays: dict[str, np.ndarray] = {}
    for k in _OPTIONAL:
        if files[k].is_file():
            arrays[k] = _read(files[k], as_float=k.endswith("attributes"))

    def same_rows(k: str, want: int, ref: str, per: str) -> None:
        if k in arrays and arrays[k].shape[0] != want:
            raise DatasetError(
                f"TU dataset {prefix}: {name_of[k]} has {arrays[k].shape[0]} lines but "
                f"{name_of[ref]} has {want} (one per {per}); the two files must agree.")

    same_rows("node_labels", n, "graph_indicator", "node")
    same_rows("node_attributes", n, "graph_indicator", "node")

    a = _read(files["A"])
    if a.shape[1] != 2:
        raise DatasetError(f"{name_of['A']}: each line must hold 'src, dst'; the first holds "
                           f"{a.shape[1]} values.")
    m = a.shape[0]
    same_rows("edge_labels", m, "A", "edge")
    same_rows("edge_attributes", m, "A", "edge")
    bad = np.flatnonzero(((a < 1) | (a > n)).any(1))
    if bad.size:
        line = int(bad[0]) + 1
        raise DatasetError(
            f"{name_of['A']}, line {line}: edge {a[line - 1].tolist()} names a node outside "
            f"[1, {n}] ({name_of['graph_indicator']} has {n} lines, one per node; ids are "
            "1-based).")
    src, dst = a[:, 0] - 1, a[:, 1] - 1
    cross = np.flatnonzero(graph_of[src] != graph_of[dst])
    if cross.size:
        line = int(cross[0]) + 1
        raise DatasetError(
            f"{name_of['A']}, line {line}: edge {a[line - 1].tolist()} joins graph "
            f"{int(graph_of[src[line - 1]])} and graph {int(graph_of[dst[line - 1]])}; "
            "every edge must stay inside one graph.")

    info: dict = {"source": str(folder), "files": sorted(name_of[k] for k in
                                                         (*_REQUIRED, *arrays))}
    node_label = arrays.get("node_labels")
    if "node_attributes" in arrays:
        x, info["x"] = arrays["node_attributes"].astype(np.float32), "node_attributes"
    elif node_label is not None:
        x, info["node_label_values"] = _one_hot(node_label)
        info["x"] = "one_hot_node_labels"
    else:
        x, info["x"] = np.ones((n, 1), dtype=np.float32), "constant"
    edge_label = arrays.get("edge_labels")
    edge_attr = None
    info["edge_attr"] = None
    if "edge_attributes" in arrays:
        edge_attr, info["edge_attr"] = arrays["edge_attributes"], "edge_attributes"
    elif edge_label is not None:
        edge_attr, info["edge_label_values"] = _one_hot(edge_label)
        info["edge_attr"] = "one_hot_edge_labels"

    def squeeze(t: np.ndarray | None) -> np.ndarray | None:
        return t[:, 0] if t is not None and t.shape[1] == 1 else t

    node_ptr = np.zeros(num_graphs + 1, dtype=np.int64)
    np.cumsum(np.bincount(graph_of - 1, minlength=num_graphs), out=node_ptr[1:])
    return GraphDataset.from_edges(
        prefix, src, dst, node_ptr, labels, x, edge_attr=edge_attr,
        edge_label=squeeze(edge_label), node_label=squeeze(node_label), info=info)
