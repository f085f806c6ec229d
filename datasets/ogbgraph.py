"""OGB graph-property folders (ogbg-molhiv, -molpcba's layout, -ppa) as a :class:`GraphDataset`.

Expected folder (what ``ogb`` unpacks, e.g. ``ogbg_molhiv/``), for ``G`` graphs holding
``N`` nodes and ``E`` edges in all; no ``ogb`` package and no pickles are read::

    raw/num-node-list.csv.gz   G lines: the node count of each graph
    raw/num-edge-list.csv.gz   G lines: the edge count of each graph
    raw/edge.csv.gz            E lines "src,dst": graph 0's edges, then graph 1's, ...,
                               ids **local** to the graph (0-based)
    raw/graph-label.csv.gz     G lines: the class label of each graph, or T comma-separated
                               binary labels (0, 1; empty or ``nan``: missing)
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
say which).

Labels and metric (``ds.task_type``, ``info["eval_metric"]``, ``info["task_source"]`` says
what decided them): the ``task type`` and ``eval metric`` rows of a ``master.csv`` in or
beside the folder, else OGB's values for a folder named after an OGB dataset
(:data:`OGB_GRAPH_TASKS`), else the file's width: several columns are binary tasks
(metric ``roc_auc``), one column is a class label (metric accuracy). OGB's metric names
map to ngra's (:data:`METRIC_NAMES`: ``rocauc`` is ``roc_auc``, as link prediction says).

* ``binary classification`` (ogbg-molhiv: 1 task, ``rocauc``; ogbg-molpcba: 128 tasks,
  ``ap``): ``y`` ``[G, T]`` float32, NaN where a field is empty or ``nan``, as OGB's
  pandas reading gives; any other value is refused (file, line, column).
* ``multiclass classification`` (ogbg-ppa): one integer column, remapped to classes.
* ``regression`` (ogbg-molesol, ...) and ``subtoken prediction`` (ogbg-code2) are
  refused, naming the dataset and its task type.

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
from .ogb import _add_inverse_edge, _find, _split_dir, master_entry
from .ogb import _need as _need_file

__all__ = ["OGB_GRAPH_ADD_INVERSE_EDGE", "OGB_GRAPH_TASKS", "OGB_GRAPH_URLS", "load_ogb_graph",
           "ogb_graph_source_files"]

log = logging.getLogger(__name__)

#: ``add_inverse_edge`` of OGB's graph-property datasets (``ogb/graphproppred/master.csv``)
#: that are not molecules; every ``ogbg-mol*`` dataset has ``True``.
OGB_GRAPH_ADD_INVERSE_EDGE = {"ogbg-ppa": True, "ogbg-code2": False}

#: OGB's binary eval metrics by the names ngra's summaries give them
METRIC_NAMES = {"rocauc": "roc_auc", "ap": "ap"}

#: ``(task type, eval metric)`` of OGB's graph-property datasets
#: (``ogb/graphproppred/master.csv``), for folders without a master.csv of their own.
OGB_GRAPH_TASKS = {
    **{f"ogbg-mol{name}": ("binary classification", "rocauc")
       for name in ("hiv", "bace", "bbbp", "clintox", "sider", "tox21", "toxcast")},
    "ogbg-molmuv": ("binary classification", "ap"),
    "ogbg-molpcba": ("binary classification", "ap"),
    **{f"ogbg-mol{name}": ("regression", "rmse") for name in ("esol", "freesolv", "lipo")},
    "ogbg-ppa": ("multiclass classification", "acc"),
    "ogbg-code2": ("subtoken prediction", "F1"),
}

#: Archives of OGB's graph-classification datasets (OGB's ``master.csv``), unpacked as
#: ``<root>/ogbg/ogbg_<name>/`` by ``ogbg:ogbg-<name>`` (:func:`ngra.datasets.load`).
OGB_GRAPH_URLS = {
    "ogbg-molhiv": "http://snap.stanford.edu/ogb/data/graphproppred/csv_mol_download/hiv.zip",
    "ogbg-molpcba": "http://snap.stanford.edu/ogb/data/graphproppred/csv_mol_download/pcba.zip",
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

    label_file = _need(raw, "graph-label", folder)
    task_type, metric, task_source = _task(folder, label_file)
    labels = _labels(label_file, g)
    if task_type is None:  # unstated: several columns are binary tasks, one a class label
        task_type, metric = (("binary", "roc_auc") if labels.shape[1] > 1 else
                             ("multiclass", "accuracy"))
    if task_type == "binary":
        _check_binary(labels, label_file)
    else:
        labels = _class_labels(labels, label_file)
    n = int(node_ptr[-1])
    info: dict = {"source": str(folder), "task_type": task_type, "eval_metric": metric,
                  "task_source": task_source}
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
                                 edge_attr=edge_attr, info=info, split=parts,
                                 task_type=task_type)
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
          expect: int | None = None, text: bytes | None = None) -> np.ndarray:
    """``[lines, columns]`` numbers (``columns=None``: as many as the first line holds) of
    the file, or of ``text`` read from it."""
    text = _text(path) if text is None else text
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


_BINARY_BYTE = np.zeros(256, dtype=bool)
_BINARY_BYTE[[ord(c) for c in ",\n01"]] = True


def _binary_fields(text: bytes, width: int) -> np.ndarray | None:
    """``[lines, width]`` float64 of a file whose every field is ``0``, ``1`` or empty
    (NaN), read with no parser, or ``None`` for any other file (other bytes, longer
    fields, blank lines). Every byte is then a separator or a digit, and each field ends
    at its separator, so the field of the digit at byte ``d`` is ``d`` minus the digits
    before it: one pass over the (few, in ogbg-molpcba) labeled entries."""
    if not text or text.startswith(b"\n") or b"\n\n" in text:
        return None
    b = np.frombuffer(text if text.endswith(b"\n") else text + b"\n", dtype=np.uint8)
    if not _BINARY_BYTE[b].all():
        return None
    at = np.flatnonzero(b >= ord("0"))
    field = at - np.arange(at.size)
    fields = b.size - at.size
    if fields % width or (np.diff(field) == 0).any():  # two digits in one field
        return None
    values = np.full(fields, np.nan)
    values[field] = b[at] - 48.0
    return values.reshape(-1, width)


def _fill_empty_fields(text: bytes) -> bytes:
    """``text`` with ``nan`` in every empty comma-separated field (OGB's missing label: at
    a line's start before a comma, between two commas, after a comma at its end). Plain
    byte replaces (a regex takes minutes on ogbg-molpcba's 56M fields); ``,,`` twice,
    since a run of commas leaves every other gap to the second pass."""
    text = text.replace(b"\r", b"")
    text = text.replace(b",,", b",nan,").replace(b",,", b",nan,")
    text = text.replace(b"\n,", b"\nnan,").replace(b",\n", b",nan\n")
    return (b"nan" if text.startswith(b",") else b"") + text + (
        b"nan" if text.endswith(b",") else b"")


def _task(folder: Path, label_file: Path) -> tuple[str | None, str | None, str]:
    """``(task_type, eval_metric, what decided them)`` for the folder (module docstring;
    ``None`` when nothing states them); a stated task type graph classification cannot
    train is refused."""
    name = folder.name.replace("_", "-")
    stated = master_entry(folder, "task type")
    if stated is not None:
        kind, master, column = stated
        found = master_entry(folder, "eval metric")
        metric = found[0] if found is not None else None
        source = f"{master} ({column})"
    elif name in OGB_GRAPH_TASKS:
        (kind, metric), source = OGB_GRAPH_TASKS[name], f"OGB's graphproppred master.csv ({name})"
    else:
        return None, None, "the label file's width (no task type stated)"
    if kind == "binary classification":
        if metric not in ("rocauc", "ap", None):
            raise DatasetError(f"{source}: eval metric {metric!r} for binary classification; "
                               "expected rocauc or ap (OGB's graph-property metrics).")
        return "binary", METRIC_NAMES[metric or "rocauc"], source
    if kind == "multiclass classification":
        return "multiclass", "accuracy", source
    raise DatasetError(f"{label_file}: {source} says task type {kind!r}; graph classification "
                       "reads binary classification (rocauc, ap) or multiclass classification "
                       "labels, not regression targets or sequences.")


def _labels(path: Path, g: int) -> np.ndarray:
    """``[G, T]`` float64 labels, NaN where a field is empty or ``nan``."""
    raw = _text(path)
    lines = [(i, ln) for i, ln in enumerate(raw.split(b"\n"), 1) if ln.strip()]
    width = lines[0][1].count(b",") + 1 if lines else 1
    ragged = next(((i, ln) for i, ln in lines if ln.count(b",") + 1 != width), None)
    if ragged is not None:
        raise DatasetError(f"{path}, line {ragged[0]}: {ragged[1].count(b',') + 1} fields, but "
                           f"line {lines[0][0]} holds {width}; every line holds one field per "
                           "task (an empty field for a missing label).")
    values = _binary_fields(raw, width)
    if values is None:  # other numbers, or blank lines: the general parser
        values = _rows(path, width, as_float=True, text=_fill_empty_fields(raw))
    if values.shape[0] != g:
        raise DatasetError(f"{path}: {values.shape[0]} lines, but num-node-list has {g} graphs; "
                           "expected one label line per graph.")
    return values


def _check_binary(values: np.ndarray, path: Path) -> None:
    width = values.shape[1]
    bad = np.flatnonzero(~(np.isnan(values) | (values == 0) | (values == 1)).reshape(-1))
    if bad.size:
        line, col = divmod(int(bad[0]), width)
        raise DatasetError(f"{path}, line {line + 1}, column {col + 1}: label "
                           f"{float(values[line, col])}; a binary classification file holds 0, "
                           f"1 or an empty field (missing) in each of its {width} columns "
                           f"({bad.size} entries are otherwise).")


def _class_labels(values: np.ndarray, path: Path) -> np.ndarray:
    """``[G]`` int64 class labels from a one-column file (no missing entries)."""
    if values.shape[1] != 1:
        raise DatasetError(f"{path}: {values.shape[1]} label columns; a multiclass dataset "
                           "holds one class label per graph (several columns are binary "
                           "tasks: state task type binary classification in master.csv).")
    values = values.reshape(-1)
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
