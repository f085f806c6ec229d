"""Fast text helpers shared by the file loaders: gzip detection, comments, number parsing.

A damaged file (a gzip cut short, a row with too few values, a token that is not a
number) raises :class:`~ngra.errors.DamagedFileError` naming the file, the line and
the fix; the row check is vectorized per chunk, so it costs a fraction of the parse.
"""

from __future__ import annotations

import gzip
import itertools
import warnings
import zlib
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .base import DamagedFileError

_PARSE_CHUNK = 32 << 20  # bytes of text per numpy parse call
#: The fix named by a damaged-file error when the loader gives none.
REPLACE_HINT = "Replace it with a good copy (download or copy it again)."


def read_text(path: Path, fix: str = REPLACE_HINT) -> bytes:
    """A file's bytes, gunzipped when it starts with the gzip magic (whatever its name).

    Raises:
        DamagedFileError: the gzip stream is cut short or corrupted.
    """
    data = Path(path).read_bytes()
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        return gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise DamagedFileError(
            path,
            f"{path} is a damaged gzip file ({err}): it was cut short or corrupted "
            f"(`gzip -t` tests a copy). {fix}",
        ) from None


def strip_comments(data: bytes) -> bytes:
    """Blank ``#``/``%`` comment lines (fast path: comments only on top).

    Comment lines become empty lines, so line numbers in error messages stay those of
    the file.
    """
    start = 0
    while start < len(data):
        line_end = data.find(b"\n", start)
        line = data[start : len(data) if line_end < 0 else line_end].strip()
        if line and line[:1] not in (b"#", b"%"):
            break
        start = len(data) if line_end < 0 else line_end + 1
    body = data[start:]
    if b"#" in body or b"%" in body:
        body = b"\n".join(
            b"" if ln.strip()[:1] in (b"#", b"%") else ln for ln in body.split(b"\n")
        )
    return b"\n" * data.count(b"\n", 0, start) + body


def parse_numbers(
    text: bytes,
    path: Path,
    progress: bool | None,
    as_float: bool = False,
    columns: int | None = None,
    first_line: int = 1,
    fix: str = REPLACE_HINT,
) -> np.ndarray:
    """All numbers in ``text`` (separated by whitespace or commas), parsed in chunks.

    Args:
        columns: every non-blank line must hold exactly this many values.
        first_line: the file's line number of ``text``'s first line (for messages).
        fix: what the message tells the user to do about a damaged file.

    Raises:
        DamagedFileError: a token is not a number, or a line holds another number of
            values than ``columns``; the message names the line.
    """
    dtype = np.float64 if as_float else np.int64
    bounds = [0]
    while bounds[-1] < len(text):
        cut = text.find(b"\n", bounds[-1] + _PARSE_CHUNK)
        bounds.append(len(text) if cut < 0 else cut + 1)
    parts = []
    steps = list(itertools.pairwise(bounds))
    disable = True if len(steps) < 2 else (None if progress is None else not progress)
    line = first_line
    for lo, hi in tqdm(steps, desc=f"parse {path.name}", unit="chunk", disable=disable):
        chunk = text[lo:hi].replace(b",", b" ")
        if columns is not None:
            _check_columns(chunk, columns, path, line, fix)
        if chunk.strip():  # numpy parses a whitespace-only string as [0]
            parts.append(_parse_chunk(chunk, dtype, path, line, fix))
        line += chunk.count(b"\n")
    values = np.concatenate(parts) if parts else np.empty(0, dtype=dtype)
    if not as_float and values.size and values.max() == np.iinfo(np.int64).max:
        # numpy saturates out-of-range integers instead of failing
        raise DamagedFileError(
            path, f"{path}: a vertex id does not fit in int64 (ids must be < 2**63 - 1)."
        )
    return values


def _parse_chunk(chunk: bytes, dtype: type, path: Path, first_line: int, fix: str) -> np.ndarray:
    with warnings.catch_warnings():
        # numpy warns (DeprecationWarning) and stops at the first token it cannot parse.
        warnings.simplefilter("error", DeprecationWarning)
        try:
            return np.fromstring(chunk, dtype=dtype, sep=" ")
        except (DeprecationWarning, ValueError):
            pass
    conv = float if dtype == np.float64 else int
    for i, text in enumerate(chunk.split(b"\n")):
        try:
            [conv(t) for t in text.split()]
        except ValueError:
            kind = "numbers" if conv is float else "integers"
            raise DamagedFileError(
                path,
                f"{path}, line {first_line + i}: cannot parse {_show(text)} as {kind}; the "
                f"file is damaged or not in the expected format. {fix}",
            ) from None
    raise DamagedFileError(
        path, f"{path}: cannot parse its numbers (near line {first_line}). {fix}"
    )


def _check_columns(chunk: bytes, columns: int, path: Path, first_line: int, fix: str) -> None:
    """Every non-blank line of ``chunk`` (commas already spaces) holds ``columns`` tokens.

    Vectorized: token starts (a non-space byte after a space) summed per line with one
    ``reduceat`` over the line starts; no per-token index array is made.
    """
    b = np.frombuffer(chunk, dtype=np.uint8)
    if b.size == 0:
        return
    sep = b <= 32  # spaces, tabs, CR, LF (commas were turned into spaces)
    token_start = ~sep
    token_start[1:] &= sep[:-1]
    line_starts = np.flatnonzero(b == 10) + 1
    line_starts = np.concatenate(([0], line_starts[line_starts < b.size]))
    counts = np.add.reduceat(token_start, line_starts, dtype=np.int64)
    bad = np.flatnonzero((counts != columns) & (counts != 0))
    if bad.size:
        i = int(bad[0])
        text = chunk.split(b"\n", i + 1)[i]
        raise DamagedFileError(
            path,
            f"{path}, line {first_line + i}: {int(counts[i])} value(s) ({_show(text)}) where "
            f"every line holds {columns}; the file is damaged or cut short. {fix}",
        )


def _show(line: bytes) -> str:
    return repr(line.strip()[:80].decode(errors="replace"))
