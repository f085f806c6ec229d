"""OGB graph-property folders (ogbg-molhiv, -molpcba's layout, -ppa) as a :class:`GraphDataset`.

Expected folder (what ``ogb`` unpacks, e.g. ``ogbg_molhiv/``), for ``G`` graphs holding
``N`` nodes and ``E`` edges in all; no ``ogb`` package and no pickles are read::

    raw/num-node-list.csv.gz   G lines: the node count of each graph
    raw/num-edge-list.csv.gz   G lines: the edge count of each graph
    raw/edge.csv.gz            E lines "src,dst": graph 0's edges, then graph 1's, ...,
                               ids **local** to the graph (0-based)
    raw/graph-label.csv.gz     G lines: the class label of each graph
    raw/node-feat.csv.gz       optional: N lines of F numbers (graph 0's nodes first)
    raw/edge-feat.csv.gz       optional: E lines of D numbers, as raw/edge
    split/<type>/{train,valid,test}.csv.gz   graph ids, one per line (optional)

``.csv`` without ``.gz`` is read too. How it is read, with no loop over graphs: the node
offsets ``node_ptr`` are the cumulative node counts; each edge's graph is
``repeat(arange(G), num_edges)``, so its global ids are its local ids plus that graph's
offset (one gather). :meth:`GraphDataset.from_edges` then sorts the edges to CSC.

Features: ``x`` is node-feat as float32 (OGB's molecule features are categorical
integers; they arrive as numbers, an embedding is the model's business), else a constant
1 column; ``edge_attr`` is edge-feat, else none (``info["x"]`` and ``info["edge_attr"]``
say which). One class label per graph: a multi-task label file (several columns, as
ogbg-molpcba's 128) or a regression target is refused, naming the file.

The split: the only type under ``split/`` (or ``split=``); its ``valid`` part is the
dataset's ``val``. The dataset carries it (``ds.split``), and graph classification
trains on it (:func:`ngra.training.graph_task.graph_parts`). A folder without ``split/``
loads without one.

Direction: OGB stores each undirected edge once and its ``master.csv`` says
``add_inverse_edge``; the ``ogb`` package then lists every edge's reverse right after it
(self-loops too) with the same edge features. ``symmetric=True`` does that here,
``False`` keeps the file's edges, ``None`` (default) follows a ``master.csv`` in or
beside the folder (as :func:`~ngra.datasets.load_ogb` does), else OGB's value for a
folder named after an OGB dataset (every ``ogbg-mol*`` and ogbg-ppa: yes; ogbg-code2:
no), else keeps the edges.

Every check names the file and what it expected: a missing file, a count that disagrees
(edge lines vs the sum of num-edge-list, node-feat rows vs the sum of num-node-list,
label lines vs graphs), a local id outside its graph (file and line), a split id out of
range or in two parts, a ``.gz`` file of 0 bytes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from ._text import parse_numbers, read_text
from .base import DamagedFileError, DatasetError, DatasetNotFoundError
from .graphs import GraphDataset
from .ogb import _add_inverse_edge, _find, _split_dir
from .ogb import _need as _need_file

__all__ = ["OGB_GRAPH_ADD_INVERSE_EDGE", "OGB_GRAPH_URLS", "load_ogb_graph",
           "ogb_graph_source_files"]

log = logging.getLogger(__name__)

#: ``add_inverse_edge`` of OGB's graph-property datasets (``ogb/graphproppred/master.csv``)
#: that are not molecules; every ``ogbg-mol*`` dataset has ``True``.
OGB_GRAPH_ADD_INVERSE_EDGE = {"ogbg-ppa": True, "ogbg-code2": False}

#: Archives of OGB's single-task graph-classification datasets (OGB's ``master.csv``),
#: unpacked as ``<root>/ogbg/ogbg_<name>/`` by ``ogbg:ogbg-<name>``
#: (:func:`ngra.datasets.load`); multi-task sets (molpcba, moltox21, ...) are refused.
OGB_GRAPH_URLS = {
    "ogbg-molhiv": "http://snap.stanford.edu/ogb/data/graphproppred/csv_mol_download/hiv.zip",
    "ogbg-molbace": "http://snap.stanford.edu/ogb/data/graphproppred/csv_mol_download/bace.zip",
    "ogbg-molbbbp": "http://snap.stanford.edu/ogb/data/graphproppred/csv_mol_download/bbbp.zip",
    "ogbg-ppa": "http://snap.stanford.edu/ogb/data/graphproppred/ppa.zip",
}

_FIX = "Download or unpack the OGB dataset again (the ogb package's raw layout)."
_LAYOUT = ("raw/{num-node-list,num-edge-list,edge,graph-label}.csv.gz, optional "
           "raw/{node-feat,edge-feat}.csv.gz and split/<type>/{train,valid,test}.csv.gz; see "
           "ngra.datasets.ogbgraph")


def load_ogb_graph(path: str | Path, *, split: str | None = None,
                   symmetric: bool | None = None, name: str | None = None) -> GraphDataset:
    """Read an OGB graph-property folder (see the module docstring for the files).

    Args:
        path: the dataset folder (holding ``raw/`` and ``split/``).
        split: split type under ``split/`` (default: the only one present; none when the
            folder has no ``split/``).
        symmetric: add every edge's reverse (``True``), keep the file's edges (``False``),
            or (``None``, default) follow ``add_inverse_edge`` (module docstring).
        name: dataset name (default: the folder name).

    Returns:
        A :class:`~ngra.datasets.graphs.GraphDataset` whose ``split`` is the folder's;
        ``info`` names the source, the split type and what decided the direction.

    Raises:
        DatasetNotFoundError: no such folder, or a required file missing (named).
        DatasetError: files that disagree (counts, ids, labels), naming file and line.
        DamagedFileError: a damaged or empty ``.gz``, a line that is not numbers.
    """
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise DatasetNotFoundError(f"OGB graph folder {folder} does not exist (expected "
                                   f"{_LAYOUT}).")
    raw = folder / "raw"
    node_file, edge_count_file = _need(raw, "num-node-list", folder), _need(raw, "num-edge-list",
                                                                           folder)
    nodes, edges_per = _counts(node_file), _counts(edge_count_file)
    g = nodes.size
    if edges_per.size != g:
        raise DatasetError(f"OGB graph folder {folder}: {node_file.name} has {g} lines but "
                           f"{edge_count_file.name} has {edges_per.size}; both hold one count "
                           "per graph and must agree.")
    edge_file = _need(raw, "edge", folder)
    edge = _rows(edge_file, 2)
    e = int(edges_per.sum())
    if edge.shape[0] != e:
        raise DatasetError(f"{edge_file}: {edge.shape[0]} edge lines, but {edge_count_file.name} "
                           f"sums to {e} edges; expected one line per edge.")
    node_ptr = np.zeros(g + 1, dtype=np.int64)
    np.cumsum(nodes, out=node_ptr[1:])
    edge_graph = np.repeat(np.arange(g, dtype=np.int64), edges_per)
    _check_local_ids(edge, edge_graph, nodes, edge_file, node_file.name)
    glob = edge + node_ptr[edge_graph, None]

    labels = _labels(_need(raw, "graph-label", folder), g)
    n = int(node_ptr[-1])
    info: dict = {"source": str(folder)}
    feat_file = _find(raw, "node-feat")
    if feat_file is not None:
        x = _rows(feat_file, None, as_float=True, expect=n).astype(np.float32)
        info["x"] = "node_feat"
        if x.shape[0] != n:
            raise DatasetError(f"{feat_file}: {x.shape[0]} lines, but {node_file.name} sums to "
                               f"{n} nodes; expected one line per node.")
    else:
        x, info["x"] = np.ones((n, 1), dtype=np.float32), "constant"
    edge_attr, info["edge_attr"] = None, None
    efeat_file = _find(raw, "edge-feat")
    if efeat_file is not None:
        edge_attr = _rows(efeat_file, None, as_float=True, expect=e).astype(np.float32)
        info["edge_attr"] = "edge_feat"
        if edge_attr.shape[0] != e:
            raise DatasetError(f"{efeat_file}: {edge_attr.shape[0]} lines, but "
                               f"{edge_count_file.name} sums to {e} edges; expected one line "
                               "per edge, as in raw/edge.")

    stated = "given"
    if symmetric is None:
        symmetric, stated = _direction(folder)
    info["direction"] = stated or "unstated (edges as listed)"
    src, dst = glob[:, 0], glob[:, 1]
    if symmetric:  # each edge then its reverse, as the ogb package lists them
        src, dst = np.stack([src, dst], 1).reshape(-1), np.stack([dst, src], 1).reshape(-1)
        edge_attr = None if edge_attr is None else np.repeat(edge_attr, 2, axis=0)

    parts = _read_split(folder, split, g)
    info["split"] = None if parts is None else parts.pop("type")
    ds = GraphDataset.from_edges(name or folder.name, src, dst, node_ptr, labels, x,
                                 edge_attr=edge_attr, info=info, split=parts)
    log.info("loaded OGB graph folder %s: %r", folder, ds)
    return ds


def ogb_graph_source_files(path: str | Path) -> list[Path]:
    """The files :func:`load_ogb_graph` may read (for a cache's stamp)."""
    folder = Path(path).expanduser().resolve()
    files = [p for sub in ("raw", "split") for p in (folder / sub).rglob("*") if p.is_file()]
    masters = [folder / "master.csv", folder.parent / "master.csv"]
    return sorted(files + [p for p in masters if p.is_file()])


# --------------------------------------------------------------------------- reading
def _need(folder: Path, stem: str, dataset: Path) -> Path:
    return _need_file(folder, stem, dataset, "OGB graph folder", _LAYOUT)


def _text(path: Path) -> bytes:
    """The file's text; a ``.gz`` of 0 bytes (an interrupted copy) is damage, not "empty"."""
    if path.suffix == ".gz" and path.stat().st_size == 0:
        raise DamagedFileError(path, f"{path} is empty (0 bytes); a gzip file holds at least "
                                     f"its header, even for no lines. {_FIX}")
    return read_text(path, _FIX)


def _rows(path: Path, columns: int | None, as_float: bool = False,
          expect: int | None = None) -> np.ndarray:
    """``[lines, columns]`` numbers (``columns=None``: as many as the first line holds)."""
    text = _text(path)
    first = next((ln for ln in text.split(b"\n", 64) if ln.strip()), b"")
    width = columns if columns is not None else len(first.replace(b",", b" ").split())
    if not first.strip():
        if columns is None and expect:
            raise DatasetError(f"{path}: no lines; expected {expect}, one per row.")
        return np.empty((0, width), dtype=np.float64 if as_float else np.int64)
    values = parse_numbers(text, path, None, as_float=as_float, columns=width, fix=_FIX)
    return values.reshape(-1, width)


def _counts(path: Path) -> np.ndarray:
    counts = _rows(path, 1).reshape(-1)
    bad = np.flatnonzero(counts < 0)
    if bad.size:
        raise DatasetError(f"{path}, line {int(bad[0]) + 1}: count {int(counts[bad[0]])}; "
                           "expected a count >= 0 per graph.")
    return counts


def _check_local_ids(edge: np.ndarray, edge_graph: np.ndarray, nodes: np.ndarray,
                     edge_file: Path, node_name: str) -> None:
    bad = np.flatnonzero(((edge < 0) | (edge >= nodes[edge_graph, None])).any(1))
    if bad.size:
        k = int(bad[0])
        gid = int(edge_graph[k])
        raise DatasetError(
            f"{edge_file}, line {k + 1}: edge {edge[k].tolist()} of graph {gid} names a node "
            f"outside [0, {int(nodes[gid])}): graph {gid} has {int(nodes[gid])} nodes "
            f"({node_name}, line {gid + 1}), and edge ids are local to their graph "
            f"({bad.size} edges are out of range).")


def _labels(path: Path, g: int) -> np.ndarray:
    text = _text(path)
    first = next((ln for ln in text.split(b"\n", 64) if ln.strip()), b"")
    width = len(first.replace(b",", b" ").split())
    if width > 1:
        raise DatasetError(f"{path}: {width} label columns; a GraphDataset holds one class label "
                           "per graph (multi-task datasets such as ogbg-molpcba are not "
                           "supported).")
    values = _rows(path, 1, as_float=True).reshape(-1)
    if values.size != g:
        raise DatasetError(f"{path}: {values.size} lines, but num-node-list has {g} graphs; "
                           "expected one label per graph.")
    bad = np.flatnonzero(~np.isfinite(values) | (values != np.floor(values)))
    if bad.size:
        raise DatasetError(f"{path}, line {int(bad[0]) + 1}: label {float(values[bad[0]])}; "
                           "expected an integer class label for every graph (a missing label or a "
                           "regression target cannot be classified).")
    return values.astype(np.int64)


def _direction(folder: Path) -> tuple[bool, str | None]:
    symmetric, stated = _add_inverse_edge(folder)  # a master.csv decides first
    if stated is not None:
        return symmetric, stated
    name = folder.name.replace("_", "-")
    if name.startswith("ogbg-mol"):
        return True, f"OGB's graphproppred master.csv: add_inverse_edge=True for {name}"
    if name in OGB_GRAPH_ADD_INVERSE_EDGE:
        value = OGB_GRAPH_ADD_INVERSE_EDGE[name]
        return value, f"OGB's graphproppred master.csv: add_inverse_edge={value} for {name}"
    return False, None


def _read_split(folder: Path, split: str | None, g: int) -> dict | None:
    """``{"train", "val", "test"}`` -> graph ids and ``"type"`` -> the split's name, or
    ``None`` for a folder without ``split/``."""
    if split is None and not (folder / "split").is_dir():
        return None
    parts_dir = _split_dir(folder, split)
    out: dict = {"type": parts_dir.name}
    seen = np.full(g, -1, dtype=np.int64)
    for i, (part, stem) in enumerate((("train", "train"), ("val", "valid"), ("test", "test"))):
        file = _need(parts_dir, stem, folder)
        ids = _rows(file, 1).reshape(-1)
        bad = np.flatnonzero((ids < 0) | (ids >= g))
        if bad.size:
            raise DatasetError(f"{file}, line {int(bad[0]) + 1}: graph id {int(ids[bad[0]])}; "
                               f"there are {g} graphs (num-node-list), ids in [0, {g}).")
        again = np.flatnonzero(seen[ids] >= 0)
        if again.size:
            k = int(ids[again[0]])
            other = ("train", "valid", "test")[int(seen[k])]
            raise DatasetError(f"{file}, line {int(again[0]) + 1}: graph {k} is already in "
                               f"{other}; the parts of a split must not share graphs.")
        seen[ids] = i
        if np.unique(ids).size != ids.size:
            values, count = np.unique(ids, return_counts=True)
            k = int(values[count > 1][0])
            raise DatasetError(f"{file}: graph {k} is listed {int(count[values == k][0])} "
                               "times; each graph belongs to its part once.")
        out[part] = np.sort(ids)
    return out
