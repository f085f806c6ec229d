"""Edge-list graphs: SNAP-style text and the Graphs.jl "LG" format, plain or gzipped.

Two formats are recognized from the first non-comment line:

* **SNAP / CSV** (``# comment`` or ``% comment`` lines, then one edge per line,
  ``src dst`` separated by whitespace or a comma; extra columns are ignored).
  Vertex ids may be any non-negative integers; they are renumbered densely
  ``0..N-1`` in increasing id order (node ``i`` is the ``i``-th smallest id).
* **LG** (Graphs.jl, used by ``ego_twitter/``): a header ``N,E,u|d,name`` then ``E``
  lines ``a,b`` with 1-based ids. ``N`` comes from the header, so isolated
  vertices are kept; ``u`` means each undirected edge is listed once.

Parsing is vectorized (the text is split into large chunks parsed by numpy), so
the 1.3M-edge ego-Twitter file loads in well under a second of parsing.

Edge lists carry no features or labels; :func:`load_edgelist` synthesizes them:
homophilous structural labels (:func:`~ngra.datasets.synthetic.structural_labels`)
and features ``centroid[label] + noise``, so that training can learn.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ngra.graph import MAX_NODES

from ._text import parse_numbers, read_text, strip_comments
from .base import (
    DamagedFileError,
    DatasetError,
    DatasetNotFoundError,
    NodeDataset,
    csc_graph,
    data_root,
    writable,
)
from .direction import check_direction
from .download import DownloadError, fetch
from .synthetic import structural_labels, synthetic_node_data

__all__ = ["TWITTER_FILE", "EdgeList", "load_edgelist", "load_twitter", "read_edgelist"]

log = logging.getLogger(__name__)

_LG_HEADER = re.compile(rb"^\s*(\d+)\s*,\s*(\d+)\s*,\s*([ud])\s*,?(.*)$")

#: The ego-Twitter file, relative to the data root.
TWITTER_FILE = Path("ego_twitter") / "ego-twitter-undirected.jlg.gz"
_TWITTER_URL = (
    "https://github.com/JuliaGraphs/SNAPDatasets.jl/raw/cc0f402d7b44a58b4bba4e03d324aa7c33af872d/"
    "data/ego-twitter/ego-twitter-undirected.jlg"
)
_TWITTER_SHA256 = "7f81dda501ad839152246ff328db8108d84b9646534a7236726e8f7e62ef6d11"


@dataclass
class EdgeList:
    """Parsed edges with dense ids.

    Attributes:
        src, dst: ``[E]`` int64 in ``[0, num_nodes)``, in file order.
        num_nodes: ``N``.
        format: ``"lg"`` or ``"snap"``.
        directed: ``False`` for an LG ``u`` file, ``True`` for ``d``, ``None`` if unknown (SNAP).
    """

    src: np.ndarray
    dst: np.ndarray
    num_nodes: int
    format: str
    directed: bool | None


def read_edgelist(path: str | Path, progress: bool | None = None) -> EdgeList:
    """Parse an edge-list file (text or gzip, detected from its first bytes).

    Raises:
        DatasetNotFoundError: the file does not exist.
        DatasetError: the contents are not an edge list (the message says where).
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(f"edge list {path} does not exist.")
    data = strip_comments(read_text(path))
    lead = len(data) - len(data.lstrip(b"\r\n"))
    first_line = 1 + data.count(b"\n", 0, lead)  # the first non-blank line's number
    data = data[lead:]
    first_nl = data.find(b"\n")
    first = data if first_nl < 0 else data[:first_nl]
    header = _LG_HEADER.match(first.rstrip(b"\r"))
    if header:
        n, e, kind = int(header.group(1)), int(header.group(2)), header.group(3)
        if n > MAX_NODES:
            raise DamagedFileError(
                path, f"{path}: the LG header declares {n:,} vertices (a graph holds at most "
                f"{MAX_NODES:,}); the header is probably damaged."
            )
        body = b"" if first_nl < 0 else data[first_nl + 1 :]
        values = parse_numbers(body, path, progress, columns=2, first_line=first_line + 1)
        if values.size != 2 * e:
            raise DamagedFileError(
                path,
                f"{path}: the LG header declares {e} edges but the file holds {values.size // 2} "
                "'a,b' lines: the file is cut short or damaged (only single-graph LG files "
                "are supported).",
            )
        pairs = values.reshape(-1, 2) - 1
        if e and (pairs.min() < 0 or pairs.max() >= n):
            raise DatasetError(
                f"{path}: LG vertex ids must be in [1, {n}] (the header's N); "
                f"got [{pairs.min() + 1}, {pairs.max() + 1}]."
            )
        return EdgeList(pairs[:, 0].copy(), pairs[:, 1].copy(), n, "lg", kind == b"d")

    ncols = len(first.replace(b",", b" ").split())
    if not data.strip():
        log.warning("%s holds no edges", path)
        empty = np.empty(0, dtype=np.int64)
        return EdgeList(empty, empty.copy(), 0, "snap", None)
    if ncols < 2:
        raise DatasetError(
            f"{path}, line {first_line}: expected 'src dst' per line; got {first[:80]!r}."
        )
    if ncols > 2:
        log.info("%s: %d columns; using the first two as (src, dst)", path, ncols)
    values = parse_numbers(
        data, path, progress, as_float=ncols > 2, columns=ncols, first_line=first_line
    )
    table = values.reshape(-1, ncols)[:, :2]
    if ncols > 2:  # parsed as float because of extra (weight) columns
        if table.size and (
            np.abs(table).max() >= 2**53 or not np.array_equal(table, np.floor(table))
        ):
            raise DatasetError(
                f"{path}: vertex ids must be integers (< 2**53 when extra columns are present)."
            )
        table = table.astype(np.int64)
    if table.size and table.min() < 0:
        raise DatasetError(f"{path}: vertex ids must be non-negative; found {table.min()}.")
    ids, inverse = _dense_ids(table.ravel())
    dense = inverse.reshape(-1, 2)
    return EdgeList(dense[:, 0].copy(), dense[:, 1].copy(), int(ids.size), "snap", None)


def load_edgelist(
    path: str | Path,
    *,
    name: str | None = None,
    feat: int = 64,
    classes: int = 8,
    seed: int = 0,
    noise: float = 2.0,
    symmetric: bool | None = None,
    simple: bool = True,
    train: float = 0.1,
    val: float = 0.1,
    edge_types: int = 1,
    progress: bool | None = None,
) -> NodeDataset:
    """Load an edge list as a :class:`NodeDataset` with synthetic labels and features.

    Args:
        path: the file (``.gz`` or plain; see the module docstring for formats).
        name: dataset name (default: the file name without extensions).
        feat: feature width ``F``.
        classes: number of synthetic classes ``C``.
        seed: seeds labels, features and split.
        noise: feature noise std (class centroids are ``N(0, 1)``).
        symmetric: store both directions of every edge. Default (``None``): yes for
            an undirected LG file, no otherwise (edges as listed; a SNAP/CSV file says
            nothing about direction, so one with (almost) no reciprocal edges is reported,
            see :mod:`~ngra.datasets.direction`).
        simple: drop self-loops and duplicate edges (default ``True``).
        train, val: random split fractions; test gets the rest.
        edge_types: ``K > 1`` adds ``edge_type`` (0 for same-label edges, else ``1..K-1``).
        progress: show tqdm bars (default: when stderr is a terminal).
    """
    el = read_edgelist(path, progress=progress)
    if symmetric is not None:
        stated = f"symmetric={str(symmetric).lower()} given"
    elif el.directed is not None:
        symmetric = not el.directed
        stated = f"LG header: {'directed' if el.directed else 'undirected'}"
    else:
        symmetric, stated = False, None
    graph = csc_graph(
        el.src, el.dst, el.num_nodes, symmetric=symmetric, remove_self_loops=simple, dedup=simple
    )
    del el
    y = structural_labels(graph, classes, seed=seed)
    if name is None:
        name = Path(path).name.split(".")[0]
    ds = synthetic_node_data(name, graph, y, classes, feat, noise, seed, train, val, edge_types)
    ds.info.update(
        source=str(Path(path).resolve()), labels="synthetic (structural)", features="synthetic"
    )
    check_direction(ds, stated=stated, symmetric=symmetric,
                    option=f"edgelist:{Path(path).resolve()},symmetric=true")
    log.info("loaded %r from %s", ds, path)
    return ds


def load_twitter(
    root: str | Path | None = None, *, download: bool = True, progress: bool | None = None, **kwargs
) -> NodeDataset:
    """SNAP ego-Twitter (81,306 nodes, 1,342,296 undirected edges) from ``<root>/ego_twitter/``.

    Keyword arguments go to :func:`load_edgelist` (``feat``, ``classes``, ``seed``, ...).
    When the file is missing and ``download=True`` it is fetched from
    SNAPDatasets.jl (pinned commit, sha256-checked).
    """
    root_path = data_root(root)
    candidates = [root_path / TWITTER_FILE, root_path / TWITTER_FILE.name]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        searched = " and ".join(str(p) for p in candidates)
        hint = "Point --data-root / NGRA_DATA at a folder holding ego_twitter/ego-twitter-undirected.jlg.gz"
        if not download:
            raise DatasetNotFoundError(
                f"twitter: missing {TWITTER_FILE.name}; searched {searched} (downloading is off). {hint}."
            )
        if not writable(candidates[0].parent):
            raise DatasetNotFoundError(
                f"twitter: missing {TWITTER_FILE.name}; searched {searched}. "
                f"{candidates[0].parent} is read-only, so it was not downloaded there. {hint}."
            )
        try:
            path = fetch(_TWITTER_URL, candidates[0], sha256=_TWITTER_SHA256, progress=progress)
        except (DownloadError, OSError) as err:
            raise DatasetNotFoundError(
                f"twitter: missing {TWITTER_FILE.name}; searched {searched}. Downloading it from "
                f"{_TWITTER_URL} failed ({err}). {hint}."
            ) from err
    kwargs.setdefault("name", "twitter")
    return load_edgelist(path, progress=progress, **kwargs)


# --------------------------------------------------------------------------- helpers
def _dense_ids(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, inverse)``: sorted distinct ids and each value's rank (sort-based; fast)."""
    if values.size == 0:
        return values.copy(), values.copy()
    s = np.sort(values)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    np.not_equal(s[1:], s[:-1], out=new[1:])
    ids = s[new]
    if ids[0] == 0 and ids[-1] == ids.size - 1:  # already dense
        return ids, values
    return ids, np.searchsorted(ids, values)
