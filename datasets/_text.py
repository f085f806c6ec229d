"""Fast text helpers shared by the file loaders: gzip detection, comments, number parsing."""

from __future__ import annotations

import gzip
import itertools
import warnings
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .base import DatasetError

_PARSE_CHUNK = 32 << 20  # bytes of text per numpy parse call


def read_text(path: Path) -> bytes:
    """A file's bytes, gunzipped when it starts with the gzip magic (whatever its name)."""
    data = Path(path).read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def strip_comments(data: bytes) -> bytes:
    """Drop ``#``/``%`` comment lines and blank leading lines (fast path: comments only on top)."""
    start = 0
    while start < len(data):
        line_end = data.find(b"\n", start)
        line = data[start : len(data) if line_end < 0 else line_end].strip()
        if line and line[:1] not in (b"#", b"%"):
            break
        start = len(data) if line_end < 0 else line_end + 1
    body = data[start:]
    if b"#" in body or b"%" in body:
        body = b"\n".join(ln for ln in body.split(b"\n") if ln.strip()[:1] not in (b"#", b"%"))
    return body


def parse_numbers(
    text: bytes, path: Path, progress: bool | None, as_float: bool = False
) -> np.ndarray:
    """All numbers in ``text`` (separated by whitespace or commas), parsed in chunks."""
    dtype = np.float64 if as_float else np.int64
    bounds = [0]
    while bounds[-1] < len(text):
        cut = text.find(b"\n", bounds[-1] + _PARSE_CHUNK)
        bounds.append(len(text) if cut < 0 else cut + 1)
    parts = []
    steps = list(itertools.pairwise(bounds))
    disable = True if len(steps) < 2 else (None if progress is None else not progress)
    for lo, hi in tqdm(steps, desc=f"parse {path.name}", unit="chunk", disable=disable):
        chunk = text[lo:hi].replace(b",", b" ")
        if not chunk.strip():
            continue  # numpy parses a whitespace-only string as [0]
        with warnings.catch_warnings():
            # numpy warns (DeprecationWarning) and stops at the first token it cannot parse.
            warnings.simplefilter("error", DeprecationWarning)
            try:
                parts.append(np.fromstring(chunk, dtype=dtype, sep=" "))
            except (DeprecationWarning, ValueError) as err:
                bad = _first_bad_line(chunk, as_float)
                raise DatasetError(f"{path}: cannot parse numbers near {bad!r} ({err}).") from None
    values = np.concatenate(parts) if parts else np.empty(0, dtype=dtype)
    if not as_float and values.size and values.max() == np.iinfo(np.int64).max:
        # numpy saturates out-of-range integers instead of failing
        raise DatasetError(f"{path}: a vertex id does not fit in int64 (ids must be < 2**63 - 1).")
    return values


def _first_bad_line(chunk: bytes, as_float: bool) -> str:
    conv = float if as_float else int
    for line in chunk.split(b"\n"):
        try:
            [conv(t) for t in line.split()]
        except ValueError:
            return line.decode(errors="replace")[:80]
    return "?"
