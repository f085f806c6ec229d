"""Edge-list graphs: SNAP-style text and the Graphs.jl "LG" format, plain or gzipped.

Two formats are recognized from the first non-comment line:

* **SNAP / CSV** (``# comment`` or ``% comment`` lines, then one edge per line,
  ``src dst`` separated by whitespace or a comma; extra columns are ignored).
  Vertex ids may be any non-negative integers; they are renumbered densely
  ``0..N-1`` in increasing id order (node ``i`` is the ``i``-th smallest id), unless
  vertex data is given (below). A first line of column names (``src,dst``) is
  skipped with ``header=True`` and reported as a header otherwise.
* **LG** (Graphs.jl, used by ``ego_twitter/``): a header ``N,E,u|d,name`` then ``E``
  lines ``a,b`` with 1-based ids. ``N`` comes from the header, so isolated
  vertices are kept; ``u`` means each undirected edge is listed once.

Parsing is vectorized (the text is split into large chunks parsed by numpy), so
the 1.3M-edge ego-Twitter file loads in well under a second of parsing.

Edge lists carry no features or labels. :func:`load_edgelist` reads them from the
files given as ``features=``, ``labels=`` and ``split=`` (formats and checks:
:mod:`~ngra.datasets.vertexdata`), and synthesizes what is not given: homophilous
structural labels (:func:`~ngra.datasets.synthetic.structural_labels`), features
``centroid[label] + noise`` (so that training can learn), a random split.
``info["synthesized"]`` lists what was made up.

**Vertex ids with vertex data.** Row ``i`` of a features or labels file is the vertex
whose id is ``i``, so with either file the ids are kept, not renumbered
(``read_edgelist(dense=False)``): the vertex count is ``max id + 1``, or the files' row
count when larger (vertices without edges at the end), and each file must have
exactly that many rows. An LG file's ids are 1-based: row ``i`` is LG vertex ``i + 1``
and the row count must be the header's ``N``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ngra.graph import MAX_NODES

from ._text import looks_like_header, parse_numbers, read_text, reject_header, skip_header
from ._text import strip_comments
from .base import (
    DamagedFileError,
    DatasetError,
    DatasetNotFoundError,
    NodeDataset,
    class_features,
    csc_graph,
    data_root,
    random_masks,
    rng_for,
    typed_edges,
    writable,
)
from .direction import check_direction
from .download import DownloadError, fetch
from .synthetic import check_label_params, structural_labels
from .vertexdata import HEADER_FIX, check_classes, read_features, read_labels, read_split

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


#: Default number of synthetic classes (``classes=`` unset and no labels file).
SYNTHETIC_CLASSES = 8


@dataclass
class EdgeList:
    """Parsed edges with ids in ``[0, num_nodes)``.

    Attributes:
        src, dst: ``[E]`` int64 in ``[0, num_nodes)``, in file order.
        num_nodes: ``N`` (SNAP: the distinct ids when dense, else ``max id + 1``).
        format: ``"lg"`` or ``"snap"``.
        directed: ``False`` for an LG ``u`` file, ``True`` for ``d``, ``None`` if unknown (SNAP).
    """

    src: np.ndarray
    dst: np.ndarray
    num_nodes: int
    format: str
    directed: bool | None


def read_edgelist(
    path: str | Path, progress: bool | None = None, *, header: bool = False, dense: bool = True
) -> EdgeList:
    """Parse an edge-list file (text or gzip, detected from its first bytes).

    Args:
        path: the file.
        progress: show tqdm bars (default: when stderr is a terminal).
        header: the first non-comment line holds column names: skip it (not for an LG
            file, whose first line is its own header).
        dense: renumber SNAP ids ``0..N-1`` in increasing order; ``False`` keeps id ``i``
            as vertex ``i`` (``N = max id + 1``), as row-indexed vertex data needs.

    Raises:
        DatasetNotFoundError: the file does not exist.
        DatasetError: the contents are not an edge list (the message says where; a first
            line of words is reported as a header to skip with ``header=True``).
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(f"edge list {path} does not exist.")
    data = strip_comments(read_text(path))
    if header:
        data, skipped = skip_header(data)
        if skipped and not looks_like_header(skipped):
            log.warning("%s: header=true skipped the first line %r, which holds only numbers",
                        path, skipped[:80].decode(errors="replace"))
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
    reject_header(first, path, first_line, HEADER_FIX)
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
    if not dense:
        top = int(table.max()) if table.size else -1
        if top >= MAX_NODES:
            raise DatasetError(
                f"{path}: vertex id {top} cannot be a row number (a graph holds at most "
                f"{MAX_NODES:,} vertices); with features or labels, ids must be 0..N-1, "
                "the rows of those files."
            )
        return EdgeList(table[:, 0].copy(), table[:, 1].copy(), top + 1, "snap", None)
    ids, inverse = _dense_ids(table.ravel())
    dense = inverse.reshape(-1, 2)
    return EdgeList(dense[:, 0].copy(), dense[:, 1].copy(), int(ids.size), "snap", None)


def load_edgelist(
    path: str | Path,
    *,
    name: str | None = None,
    feat: int = 64,
    classes: int | None = None,
    seed: int = 0,
    noise: float = 2.0,
    symmetric: bool | None = None,
    simple: bool = True,
    train: float = 0.1,
    val: float = 0.1,
    edge_types: int = 1,
    features: str | Path | None = None,
    labels: str | Path | None = None,
    split: str | Path | None = None,
    header: bool = False,
    progress: bool | None = None,
) -> NodeDataset:
    """Load an edge list as a :class:`NodeDataset`, with the user's vertex data or synthetic.

    Args:
        path: the file (``.gz`` or plain; see the module docstring for formats).
        name: dataset name (default: the file name without extensions).
        feat: synthetic feature width ``F`` (ignored with ``features``).
        classes: number of classes ``C``: of the synthetic labels (default 8), or, with
            ``labels``, the labels' range ``[0, C)`` (default: ``max label + 1``).
        seed: seeds the synthetic labels, features and the random split.
        noise: synthetic feature noise std (class centroids are ``N(0, 1)``).
        symmetric: store both directions of every edge. Default (``None``): yes for
            an undirected LG file, no otherwise (edges as listed; a SNAP/CSV file says
            nothing about direction, so one with (almost) no reciprocal edges is reported,
            see :mod:`~ngra.datasets.direction`).
        simple: drop self-loops and duplicate edges (default ``True``).
        train, val: random split fractions of the labeled vertices (without ``split``);
            test gets the rest.
        edge_types: ``K > 1`` adds ``edge_type`` (0 for same-label edges, else ``1..K-1``).
        features: ``[N, F]`` features file, row ``i`` = vertex id ``i`` (ids then kept
            as given; formats: :mod:`~ngra.datasets.vertexdata`).
        labels: ``[N]`` labels file (integers, ``-1`` unlabeled), rows as ``features``.
        split: split file (train/val/test vertex ids, ``id,name`` lines or per-vertex codes).
        header: the text files' first non-comment line holds column names: skip it.
        progress: show tqdm bars (default: when stderr is a terminal).

    Raises:
        DatasetError: a file's contents do not fit (the message names the file, what was
            expected and what arrived); :class:`~ngra.datasets.base.MissingFileError`
            for a vertex-data file that does not exist.
    """
    rows: dict[str, tuple[Path, np.ndarray]] = {}
    if features is not None:
        rows["features"] = (Path(features), read_features(features, header=header,
                                                          progress=progress))
    if labels is not None:
        rows["labels"] = (Path(labels), read_labels(labels, header=header, progress=progress))
    el = read_edgelist(path, progress=progress, header=header, dense=not rows)
    n = _vertex_count(el, rows, Path(path))
    if symmetric is not None:
        stated = f"symmetric={str(symmetric).lower()} given"
    elif el.directed is not None:
        symmetric = not el.directed
        stated = f"LG header: {'directed' if el.directed else 'undirected'}"
    else:
        symmetric, stated = False, None
    graph = csc_graph(el.src, el.dst, n, symmetric=symmetric, remove_self_loops=simple,
                      dedup=simple)
    del el
    if name is None:
        name = Path(path).name.split(".")[0]
    synthesized = []
    if "labels" in rows:
        y = rows["labels"][1]
        num_classes = check_classes(y, classes, rows["labels"][0])
    else:
        num_classes = SYNTHETIC_CLASSES if classes is None else classes
        if num_classes < 1:
            raise DatasetError(f"{name} needs classes >= 1; got classes={num_classes}.")
        y = structural_labels(graph, num_classes, seed=seed)
        synthesized.append("labels")
    if "features" in rows:
        x = rows["features"][1]
    else:
        check_label_params(name, num_classes, feat, noise)
        x = class_features(y, num_classes, feat, noise, rng_for(seed, "features"))
        synthesized.insert(0, "features")
    if split is not None:
        masks = read_split(split, n, header=header)
        _check_split_labeled(masks, y, Path(split), rows.get("labels", (None,))[0])
        split_info = f"file {Path(split).resolve()}"
    else:
        masks = random_masks(n, train, val, rng_for(seed, "split"), labeled=y >= 0)
        split_info = f"random (train={train}, val={val}, seed={seed})"
    edge_type = typed_edges(graph, y, edge_types)
    ds = NodeDataset(
        name=name,
        graph=graph,
        x=torch.from_numpy(x),
        y=torch.from_numpy(y),
        train_mask=masks[0],
        val_mask=masks[1],
        test_mask=masks[2],
        num_classes=num_classes,
        edge_type=edge_type,
        num_edge_types=edge_types if edge_type is not None else 1,
    )
    ds.info.update(
        source=str(Path(path).resolve()),
        labels=f"file {Path(labels).resolve()}" if labels is not None
        else "synthetic (structural)",
        features=f"file {Path(features).resolve()}" if features is not None else "synthetic",
        split=split_info,
        vertex_ids="as given (row i = vertex id i)" if rows else "renumbered 0..N-1 in id order",
        synthesized=synthesized,
    )
    check_direction(ds, stated=stated, symmetric=symmetric,
                    option=f"edgelist:{Path(path).resolve()},symmetric=true")
    log.info("loaded %r from %s (synthesized: %s)", ds, path, ", ".join(synthesized) or "nothing")
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
def _vertex_count(el: EdgeList, rows: dict[str, tuple[Path, np.ndarray]], path: Path) -> int:
    """``N`` with row-indexed vertex data: ``max id + 1`` (an LG file: its header's ``N``)
    or the files' row count when larger; every file must have ``N`` rows."""
    if not rows:
        return el.num_nodes
    counts = {what: (file, a.shape[0]) for what, (file, a) in rows.items()}
    n = el.num_nodes if el.format == "lg" else max(el.num_nodes, *(r for _, r in counts.values()))
    for what, (file, r) in counts.items():
        if r == n:
            continue
        if r < el.num_nodes:
            why = (f"the LG header of {path} declares {el.num_nodes} vertices" if el.format == "lg"
                   else f"the edge list {path} names vertex id {el.num_nodes - 1} (max id + 1 = "
                   f"{el.num_nodes}): a row count smaller than max id + 1 means edge ids out of "
                   "range of the rows")
        elif el.format == "lg":
            why = f"the LG header of {path} declares {el.num_nodes} vertices"
        else:
            other = next(f for w, (f, c) in counts.items() if c == n)
            why = f"{other} has {n} rows (vertices without edges count too)"
        raise DatasetError(
            f"{file}: {r} rows of {what}, but the graph has {n} vertices; {why}. Row i is the "
            f"vertex with id i, so the file needs one row per vertex id 0..{n - 1}."
        )
    return n


def _check_split_labeled(masks: tuple[torch.Tensor, ...], y: np.ndarray, path: Path,
                         labels: Path | None) -> None:
    """A split from a file may not select an unlabeled vertex (``y == -1``)."""
    unlabeled = torch.from_numpy(y < 0)
    for set_name, m in zip(("train", "val", "test"), masks):
        bad = torch.nonzero(m & unlabeled).flatten()
        if bad.numel():
            raise DatasetError(
                f"{path}: the {set_name} set names vertex {int(bad[0])}, which is unlabeled "
                f"(-1) in {labels}; a split selects labeled vertices only ({bad.numel()} "
                "unlabeled in that set)."
            )


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
