"""OGB node-property-prediction datasets from their raw on-disk layout (no ``ogb`` package).

Expected folder (what ``ogb`` unpacks, e.g. ``ogbn_arxiv/``)::

    raw/edge.csv.gz            one "src,dst" line per edge (0-based)
    raw/node-feat.csv.gz       one line of F comma-separated floats per node
    raw/node-label.csv.gz      one label per node ("nan" or empty: unlabeled -> y = -1)
    raw/num-node-list.csv.gz   optional: the node count
    split/<type>/{train,valid,test}.csv.gz   node ids, one per line

The split type (e.g. ``time``, ``sales_ranking``) is the only folder under
``split/`` unless chosen with ``split=``. Uncompressed ``.csv`` files are accepted
too. Everything is read, nothing made up (``info["synthesized"] == []``).

Direction: OGB stores an undirected graph with each edge once and marks it
``add_inverse_edge`` in its ``master.csv`` (ogbn-products, ogbn-proteins; ogbn-arxiv
is directed). ``symmetric=True`` adds the reverse edges, ``symmetric=False`` keeps the
file's edges; by default the ``add_inverse_edge`` row of a ``master.csv`` in the folder
or beside it decides (its column named like the folder: ``ogbn-arxiv`` for
``ogbn_arxiv/``), else OGB's own value for a folder named after an OGB dataset, else
the edges stay as listed and a graph with (almost) no reciprocal edges is reported
(:mod:`~ngra.datasets.direction`).
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import numpy as np
import torch

from ._text import parse_numbers, read_text
from .base import DamagedFileError, DatasetError, DatasetNotFoundError, NodeDataset, csc_graph
from .direction import check_direction

__all__ = ["load_ogb", "ogb_source_files"]

log = logging.getLogger(__name__)

#: ``add_inverse_edge`` of OGB's node-property datasets (``ogb/nodeproppred/master.csv``),
#: for folders without a master.csv of their own.
OGB_ADD_INVERSE_EDGE = {"ogbn-arxiv": False, "ogbn-products": True, "ogbn-proteins": True}

_FIX = "Download or unpack the OGB dataset again (the ogb package's raw layout)."


def load_ogb(
    path: str | Path,
    *,
    split: str | None = None,
    symmetric: bool | None = None,
    simple: bool = False,
    name: str | None = None,
    progress: bool | None = None,
) -> NodeDataset:
    """Load an OGB node-property-prediction folder.

    Args:
        path: the dataset folder (holding ``raw/`` and ``split/``).
        split: split type under ``split/`` (default: the only one present).
        symmetric: add the reverse of every edge whose reverse is absent (``True``), keep
            the file's edges (``False``), or (``None``, default) follow ``add_inverse_edge``
            of the folder's ``master.csv`` or OGB's value (see the module docstring).
        simple: drop self-loops and duplicate edges (default ``False``: as distributed).
        name: dataset name (default: the folder name).
        progress: show tqdm bars for large files.

    Raises:
        DatasetNotFoundError: a required file is missing (named in the message).
        DatasetError: malformed contents (multi-task labels, inconsistent counts).
    """
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise DatasetNotFoundError(f"OGB folder {folder} does not exist.")
    raw = folder / "raw"
    edges = _read_numbers(_need(raw, "edge", folder), progress, ints=True, columns=2)
    edges = edges.reshape(-1, 2)

    feat_file = _need(raw, "node-feat", folder)
    feat_text = read_text(feat_file, _FIX)
    width = _first_line_width(feat_text)
    if width == 0:
        raise DamagedFileError(feat_file, f"{feat_file}: the first line holds no features. {_FIX}")
    feats = parse_numbers(feat_text, feat_file, progress, as_float=True, columns=width, fix=_FIX)
    del feat_text
    x = feats.astype(np.float32, copy=False).reshape(-1, width)

    label_file = _need(raw, "node-label", folder)
    labels = _read_labels(label_file)
    num_nodes = x.shape[0]
    count_file = _find(raw, "num-node-list")
    if count_file is not None:
        counts = _read_numbers(count_file, None, ints=True)
        if counts.size != 1 or counts[0] < 0:
            raise DatasetError(
                f"{count_file}: expected one graph (one node count >= 0); got {counts.tolist()}."
            )
        num_nodes = int(counts[0])
    if x.shape[0] != num_nodes or labels.size != num_nodes:
        raise DatasetError(
            f"{folder}: inconsistent node counts: num-node-list {num_nodes}, node-feat {x.shape[0]} rows, "
            f"node-label {labels.size} rows."
        )
    stated = f"symmetric={str(symmetric).lower()} given" if symmetric is not None else None
    if symmetric is None:
        symmetric, stated = _add_inverse_edge(folder)
    graph = csc_graph(
        edges[:, 0],
        edges[:, 1],
        num_nodes,
        symmetric=symmetric,
        remove_self_loops=simple,
        dedup=simple,
    )

    split_dir = _split_dir(folder, split)
    masks = []
    for part in ("train", "valid", "test"):
        idx = _read_numbers(_need(split_dir, part, folder), None, ints=True, columns=1)
        if idx.size and (idx.min() < 0 or idx.max() >= num_nodes):
            raise DatasetError(f"{split_dir / part}: node ids must be in [0, {num_nodes}).")
        m = torch.zeros(num_nodes, dtype=torch.bool)
        m[torch.from_numpy(idx)] = True
        masks.append(m)
    y = torch.from_numpy(labels)
    num_classes = int(labels.max()) + 1 if labels.size and labels.max() >= 0 else 1
    ds = NodeDataset(
        name=name or folder.name,
        graph=graph,
        x=torch.from_numpy(np.ascontiguousarray(x)),
        y=y,
        train_mask=masks[0] & (y >= 0),
        val_mask=masks[1] & (y >= 0),
        test_mask=masks[2] & (y >= 0),
        num_classes=num_classes,
        info={"source": str(folder), "split": split_dir.name, "synthesized": []},
    )
    check_direction(ds, stated=stated, symmetric=symmetric,
                    option=f"ogb:{folder},symmetric=true")
    log.info("loaded %r from %s", ds, folder)
    return ds


def ogb_source_files(path: str | Path) -> list[Path]:
    """The files :func:`load_ogb` reads (for cache invalidation)."""
    folder = Path(path).expanduser().resolve()
    files = [p for sub in ("raw", "split") for p in (folder / sub).rglob("*") if p.is_file()]
    return sorted(files + [p for p in _master_files(folder) if p.is_file()])


def _master_files(folder: Path) -> list[Path]:
    return [folder / "master.csv", folder.parent / "master.csv"]


def master_entry(folder: Path, key: str) -> tuple[str, Path, str] | None:
    """``(value, master.csv, dataset column)`` of row ``key`` for this folder in a
    ``master.csv`` in or beside it (OGB's layout: a row per property, a column per
    dataset, matched by name or ``download_name``), or ``None``."""
    names = (folder.name.replace("_", "-"), folder.name)
    for master in _master_files(folder):
        if not master.is_file():
            continue
        with open(master, newline="") as f:
            rows = list(csv.reader(f))
        if not rows or len(rows[0]) < 2:
            continue
        table = {r[0].strip(): r[1:] for r in rows[1:] if r}
        columns = [c.strip() for c in rows[0][1:]]
        downloads = [c.strip() for c in table.get("download_name", [])]
        col = next((i for i, c in enumerate(columns)
                    if c in names or (i < len(downloads) and downloads[i] in names)),
                   0 if len(columns) == 1 and master.parent == folder else None)
        values = table.get(key)
        if col is None or values is None or col >= len(values):
            continue
        return values[col].strip(), master, columns[col]
    return None


def _add_inverse_edge(folder: Path) -> tuple[bool, str | None]:
    """``(symmetric, what decided it)`` from ``add_inverse_edge`` for this folder: a
    master.csv in or beside it, else OGB's value for its name, else ``(False, None)``."""
    names = (folder.name.replace("_", "-"), folder.name)
    found = master_entry(folder, "add_inverse_edge")
    if found is not None:
        raw, master, column = found
        value = raw.lower()
        if value not in ("true", "false"):
            raise DatasetError(f"{master}: add_inverse_edge of {column} must be True or "
                               f"False; got {raw!r}.")
        return value == "true", f"{master} add_inverse_edge={value.title()} ({column})"
    for name in names:
        if name in OGB_ADD_INVERSE_EDGE:
            value = OGB_ADD_INVERSE_EDGE[name]
            return value, f"OGB's master.csv: add_inverse_edge={value} for {name}"
    return False, None


def _find(folder: Path, stem: str) -> Path | None:
    for suffix in (".csv.gz", ".csv"):
        p = folder / f"{stem}{suffix}"
        if p.is_file():
            return p
    return None


_NODE_LAYOUT = ("the raw layout raw/{edge,node-feat,node-label}.csv.gz and "
                "split/<type>/{train,valid,test}.csv.gz")


def _need(folder: Path, stem: str, dataset: Path, what: str = "OGB dataset",
          expected: str = _NODE_LAYOUT) -> Path:
    """``folder/stem.csv.gz`` (or ``.csv``); a missing one names ``expected``."""
    p = _find(folder, stem)
    if p is None:
        raise DatasetNotFoundError(
            f"{what} {dataset}: missing {folder / (stem + '.csv.gz')} (expected {expected})."
        )
    return p


def _split_dir(folder: Path, split: str | None) -> Path:
    base = folder / "split"
    types = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if split is not None:
        if split not in types:
            raise DatasetNotFoundError(
                f"OGB dataset {folder}: no split {split!r} under {base}; found {types}."
            )
        return base / split
    if len(types) != 1:
        raise DatasetNotFoundError(
            f"OGB dataset {folder}: expected exactly one split folder under {base}, found {types or 'none'}; "
            "choose one with split=<name>."
        )
    return base / types[0]


def _read_numbers(
    path: Path, progress: bool | None, ints: bool, columns: int | None = None
) -> np.ndarray:
    return parse_numbers(
        read_text(path, _FIX), path, progress, as_float=not ints, columns=columns, fix=_FIX
    )


def _first_line_width(text: bytes) -> int:
    line = text[: text.find(b"\n")] if b"\n" in text else text
    line = line.strip()
    return len(line.split(b",")) if line else 0


def _read_labels(path: Path) -> np.ndarray:
    text = read_text(path, _FIX)
    width = _first_line_width(text)
    if width > 1:
        raise DatasetError(
            f"{path}: {width} label columns; NodeDataset holds one class label per node "
            "(multi-task datasets such as ogbn-proteins are not supported)."
        )
    if text.startswith((b"\n", b"\r\n")) or b"\n\n" in text or b"\n\r\n" in text:
        # Empty lines are unlabeled nodes; numpy's parser would skip them silently.
        lines = text.splitlines()
        text = b"\n".join(ln if ln.strip() else b"nan" for ln in lines)
    vals = parse_numbers(text, path, None, as_float=True, columns=1, fix=_FIX)
    ok = ~np.isnan(vals)
    known = vals[ok]
    if known.size and (
        (known < 0).any() or (known >= 2**31).any() or not np.array_equal(known, np.floor(known))
    ):
        raise DatasetError(
            f"{path}: labels must be integers in [0, 2**31) (or nan for unlabeled)."
        )
    out = np.full(vals.size, -1, dtype=np.int64)
    out[ok] = known.astype(np.int64)
    return out
