"""Vertex data a user brings beside an edge list: features, labels and a split.

:func:`~ngra.datasets.edgelist.load_edgelist` takes ``features=``, ``labels=`` and
``split=`` files (spec keys of ``edgelist:``); this module reads and checks them.

**Rows are by vertex id**: row ``i`` of a features or labels file belongs to the vertex
whose id in the edge list is ``i`` (so ids are kept as given, not renumbered; see
:func:`~ngra.datasets.edgelist.read_edgelist`'s ``dense``). Blank lines and ``#``/``%``
comment lines of a text file are not rows.

Formats, chosen by the file name's extension:

==============  ================================================================
``.csv``        numbers separated by commas or whitespace (``.txt`` and ``.tsv``
                too; gzipped when the name ends in ``.gz``). A first line that is
                a header is skipped with ``header=True``; without it, a header is
                reported, not parsed.
``.npy``        one array.
``.npz``        features: the key ``x`` or ``features`` (or the only array);
                labels: ``y`` or ``labels`` (or the only array).
==============  ================================================================

* **features**: ``[N, F]`` numbers, read as float32 (a 1-D array is one column); every
  value finite.
* **labels**: ``[N]`` integers in ``[0, C)``, ``-1`` for an unlabeled vertex; ``C`` is
  ``max + 1`` unless the caller gives it.
* **split**, three layouts:

  a. ``.npz`` with arrays ``train``, ``val`` (or ``valid``) and ``test``, each the
     vertex ids of one set (or a ``[N]`` bool mask);
  b. ``.csv`` with lines ``id,name``, ``name`` one of ``train``, ``val``, ``valid``,
     ``test`` (a vertex not listed is in no set);
  c. ``.npy`` or a one-column ``.csv`` with one code per vertex: ``0`` train, ``1``
     validation, ``2`` test, ``-1`` none.

  A vertex named twice (in one set or two), an id outside ``[0, N)`` or a code outside
  ``{-1, 0, 1, 2}`` is an error.

Every problem raises :class:`~ngra.errors.DatasetError` naming the file, what was
expected and what arrived (a missing file: :class:`~ngra.datasets.base.MissingFileError`,
both a ``DatasetError`` and a ``DatasetNotFoundError``).
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

import numpy as np
import torch

from ._text import (
    first_data_line,
    looks_like_header,
    parse_numbers,
    read_text,
    skip_header,
    strip_comments,
)
from .base import DatasetError, MissingFileError

__all__ = ["HEADER_FIX", "SPLIT_CODES", "check_classes", "file_format", "read_features",
           "read_labels", "read_split"]

log = logging.getLogger(__name__)

#: What a header error tells the user to do.
HEADER_FIX = ("If it is a header, load with header=true to skip it "
              "(spec: 'edgelist:PATH,...,header=true'; Python: load_edgelist(..., header=True)).")
#: Set names a split file may use, and their codes (layout c).
SPLIT_CODES = {"train": 0, "val": 1, "valid": 1, "test": 2}
_SETS = ("train", "val", "test")
_TEXT = (".csv", ".txt", ".tsv")
_KEYS = {"features": ("x", "features"), "labels": ("y", "labels")}


def file_format(path: Path, what: str) -> str:
    """``"csv"``, ``"npy"`` or ``"npz"`` from ``path``'s name.

    Raises:
        MissingFileError: the file does not exist.
        DatasetError: an extension this module does not read.
    """
    if not path.is_file():
        raise MissingFileError(f"{what} file {path} does not exist.")
    name = path.name.lower()
    stem = name[:-3] if name.endswith(".gz") else name
    if stem.endswith(_TEXT):
        return "csv"
    if name.endswith((".npy", ".npz")):
        return name[-3:]
    raise DatasetError(
        f"{path}: unknown extension for a {what} file; expected .csv (or .txt, .tsv, each "
        "optionally .gz), .npy or .npz."
    )


def read_features(path: str | Path, *, header: bool = False,
                  progress: bool | None = None) -> np.ndarray:
    """A features file as ``[R, F]`` float32 (``R`` rows, one per vertex id).

    Raises:
        DatasetError: unreadable, ragged, not 2-D, or a non-finite value (the message
            names the first such vertex and column).
    """
    path = Path(path)
    fmt = file_format(path, "features")
    if fmt == "csv":
        text = _text(path, header)
        line, _ = first_data_line(text)
        width = len(line.replace(b",", b" ").split())
        values = parse_numbers(text, path, progress, as_float=True, columns=max(width, 1),
                               header_fix=HEADER_FIX)
        x = values.reshape(-1, max(width, 1))
    else:
        x = _array(path, fmt, "features")
        if x.ndim == 1:
            x = x[:, None]
        if x.ndim != 2:
            raise DatasetError(
                f"{path}: features must be [num_vertices, F] (2-D); got shape {list(x.shape)}.")
        if not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
            raise DatasetError(f"{path}: features must be numbers; got dtype {x.dtype}.")
    x = np.ascontiguousarray(x, dtype=np.float32)
    finite = np.isfinite(x)
    if not finite.all():
        row, col = (int(i[0]) for i in np.nonzero(~finite))
        raise DatasetError(
            f"{path}: features must be finite; vertex {row}, column {col} holds {x[row, col]} "
            f"({int((~finite).sum())} non-finite value(s) in all). Fill in or drop them."
        )
    return x


def read_labels(path: str | Path, *, header: bool = False,
                progress: bool | None = None) -> np.ndarray:
    """A labels file as ``[R]`` int64 (``-1``: unlabeled), one per vertex id.

    Raises:
        DatasetError: not one value per row, a value that is not an integer, or one
            below ``-1`` (the message names the first such vertex and value).
    """
    path = Path(path)
    fmt = file_format(path, "labels")
    if fmt == "csv":
        text = _text(path, header)
        values = parse_numbers(text, path, progress, as_float=True, columns=1,
                               header_fix=HEADER_FIX)
    else:
        values = _array(path, fmt, "labels")
        if values.ndim == 2 and values.shape[1] == 1:
            values = values[:, 0]
        if values.ndim != 1:
            raise DatasetError(
                f"{path}: labels must be one class per vertex ([num_vertices]); got shape "
                f"{list(values.shape)}."
            )
    if values.dtype.kind in "iub":
        y = values.astype(np.int64)
    else:
        if values.dtype.kind != "f":
            raise DatasetError(f"{path}: labels must be integers; got dtype {values.dtype}.")
        bad = ~np.isfinite(values)
        bad[~bad] = values[~bad] != np.floor(values[~bad])
        if bad.any():
            v = int(np.flatnonzero(bad)[0])
            raise DatasetError(
                f"{path}: labels must be integer classes (-1: unlabeled); vertex {v} has "
                f"{values[v]}."
            )
        y = values.astype(np.int64)
    low = np.flatnonzero(y < -1)
    if low.size:
        v = int(low[0])
        raise DatasetError(
            f"{path}: labels must be in [0, C) or -1 (unlabeled); vertex {v} has {int(y[v])}.")
    return y


def check_classes(y: np.ndarray, num_classes: int | None, path: Path) -> int:
    """``C``: ``num_classes`` if given (every label must be below it), else ``max + 1``."""
    if num_classes is None:
        return int(y.max()) + 1 if y.size and y.max() >= 0 else 1
    if num_classes < 1:
        raise DatasetError(f"classes must be >= 1; got {num_classes}.")
    high = np.flatnonzero(y >= num_classes)
    if high.size:
        v = int(high[0])
        raise DatasetError(
            f"{path}: labels must be in [0, classes={num_classes}) or -1 (unlabeled); vertex {v} "
            f"has {int(y[v])} ({high.size} vertex(es) out of range). Raise classes= or fix "
            "the labels."
        )
    return int(num_classes)


def read_split(path: str | Path, num_nodes: int, *,
               header: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train/validation/test masks ``[N]`` bool from a split file (module docstring).

    Raises:
        DatasetError: a missing set, a vertex twice, an id out of ``[0, N)``, a bad code.
    """
    path = Path(path)
    fmt = file_format(path, "split")
    if fmt == "npz":
        sets = _npz_sets(path, num_nodes)
    elif fmt == "npy":
        return _code_masks(_array(path, "npy", "split"), num_nodes, path)
    else:
        text = _text(path, header)
        line, number = first_data_line(text)
        width = len(line.replace(b",", b" ").split())
        if width == 1:
            codes = parse_numbers(text, path, None, columns=1, header_fix=HEADER_FIX)
            return _code_masks(codes, num_nodes, path)
        if width != 2:
            raise DatasetError(
                f"{path}, line {number}: expected 'id,name' (name: train, val, valid or test) "
                f"or one code per vertex (0 train, 1 val, 2 test, -1 none); got {width} values "
                f"({line[:80].decode(errors='replace')!r})."
            )
        sets = _named_sets(text, path)
    return _set_masks(sets, num_nodes, path)


# --------------------------------------------------------------------------- helpers
def _text(path: Path, header: bool) -> bytes:
    text = strip_comments(read_text(path, "Write or copy it again."))
    if header:
        text, line = skip_header(text)
        if line and not looks_like_header(line):
            log.warning("%s: header=true skipped the first line %r, which holds only numbers",
                        path, line[:80].decode(errors="replace"))
    return text


def _array(path: Path, fmt: str, what: str) -> np.ndarray:
    try:
        if fmt == "npy":
            return np.load(path, allow_pickle=False)
        with np.load(path, allow_pickle=False) as z:
            keys = list(z.files)
            names = [k for k in _KEYS[what] if k in keys]
            if not names and len(keys) != 1:
                raise DatasetError(
                    f"{path}: expected the {what} under the key "
                    f"{' or '.join(repr(k) for k in _KEYS[what])} (or a file holding one array); "
                    f"it holds {keys}."
                )
            return z[names[0] if names else keys[0]]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        if isinstance(err, DatasetError):
            raise
        raise DatasetError(f"{path}: not a readable .{fmt} array file ({err}).") from None


def _npz_sets(path: Path, num_nodes: int) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = list(z.files)
            want = {"train": "train", "val": "val" if "val" in keys else "valid", "test": "test"}
            missing = [k for k, key in want.items() if key not in keys]
            if missing:
                raise DatasetError(
                    f"{path}: a split .npz needs the arrays 'train', 'val' (or 'valid') and "
                    f"'test' (vertex ids); it lacks {missing} and holds {keys}."
                )
            arrays = {name: z[key] for name, key in want.items()}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        if isinstance(err, DatasetError):
            raise
        raise DatasetError(f"{path}: not a readable .npz file ({err}).") from None
    sets = {}
    for name, a in arrays.items():
        a = np.asarray(a).reshape(-1)
        if a.dtype == np.bool_:
            if a.size != num_nodes:
                raise DatasetError(
                    f"{path}: the {name} mask has {a.size} entries; the graph has {num_nodes} "
                    "vertices.")
            a = np.flatnonzero(a)
        elif a.dtype.kind not in "iu":
            raise DatasetError(
                f"{path}: {name} must hold integer vertex ids (or a bool mask); got dtype "
                f"{a.dtype}.")
        sets[name] = a.astype(np.int64)
    return sets


def _named_sets(text: bytes, path: Path) -> dict[str, list[int]]:
    sets: dict[str, list[int]] = {name: [] for name in _SETS}
    seen_data = False
    for number, raw in enumerate(text.split(b"\n"), 1):
        tokens = raw.replace(b",", b" ").split()
        if not tokens:
            continue
        shown = raw.strip()[:80].decode(errors="replace")
        try:
            if len(tokens) != 2:
                raise ValueError
            vertex = int(tokens[0])
            name = tokens[1].decode(errors="replace").lower()
        except ValueError:
            if not seen_data and looks_like_header(raw):
                raise DatasetError(
                    f"{path}, line {number}: the first line {shown!r} looks like a header. "
                    f"{HEADER_FIX}") from None
            raise DatasetError(
                f"{path}, line {number}: expected 'id,name' (an integer vertex id, then train, "
                f"val, valid or test); got {shown!r}.") from None
        if name not in SPLIT_CODES:
            raise DatasetError(
                f"{path}, line {number}: unknown set {name!r} for vertex {vertex}; expected "
                "train, val, valid or test.")
        sets[_SETS[SPLIT_CODES[name]]].append(vertex)
        seen_data = True
    return sets


def _set_masks(sets: dict, num_nodes: int, path: Path) -> tuple[torch.Tensor, ...]:
    ids = [np.asarray(sets[name], dtype=np.int64) for name in _SETS]
    for name, a in zip(_SETS, ids):
        out = np.flatnonzero((a < 0) | (a >= num_nodes))
        if out.size:
            raise DatasetError(
                f"{path}: the {name} set names vertex {int(a[out[0]])}, outside [0, {num_nodes}) "
                f"(the graph has {num_nodes} vertices; {out.size} id(s) out of range).")
    every = np.concatenate(ids)
    owner = np.repeat(np.arange(3), [a.size for a in ids])
    order = np.argsort(every, kind="stable")
    s = every[order]
    twice = np.flatnonzero(s[1:] == s[:-1])
    if twice.size:
        v = int(s[twice[0]])
        where = [_SETS[k] for k in owner[every == v]]
        places = (f"twice in {where[0]}" if len(set(where)) == 1
                  else "in " + " and ".join(dict.fromkeys(where)))
        raise DatasetError(
            f"{path}: vertex {v} is named {places}; each vertex may be in at most one set, "
            f"once ({twice.size} repeated name(s) in all).")
    masks = []
    for a in ids:
        m = torch.zeros(num_nodes, dtype=torch.bool)
        m[torch.from_numpy(a)] = True
        masks.append(m)
    return masks[0], masks[1], masks[2]


def _code_masks(codes: np.ndarray, num_nodes: int, path: Path) -> tuple[torch.Tensor, ...]:
    codes = np.asarray(codes).reshape(-1)
    if codes.dtype.kind not in "iu":
        raise DatasetError(
            f"{path}: a split of codes holds integers (0 train, 1 val, 2 test, -1 none); got "
            f"dtype {codes.dtype}.")
    if codes.size != num_nodes:
        raise DatasetError(
            f"{path}: {codes.size} split codes, but the graph has {num_nodes} vertices (one code "
            "per vertex id: 0 train, 1 val, 2 test, -1 none).")
    bad = np.flatnonzero((codes < -1) | (codes > 2))
    if bad.size:
        v = int(bad[0])
        raise DatasetError(
            f"{path}: split codes must be 0 (train), 1 (val), 2 (test) or -1 (none); vertex {v} "
            f"has {int(codes[v])}.")
    t = torch.from_numpy(codes.astype(np.int64))
    return t == 0, t == 1, t == 2
