"""Fast text helpers shared by the file loaders: gzip detection, comments, headers,
number parsing.

A damaged file (a gzip cut short, a row with too few values, a token that is not a
number) raises :class:`~ngra.errors.DamagedFileError` naming the file, the line and
the fix; the row check is vectorized per chunk, so it costs a fraction of the parse.

Two mistakes in a file the user wrote are not damage, and say so instead
(:class:`~ngra.errors.DatasetError`):

* **A header line** (``src,dst``): when the caller passes ``header_fix`` (the loaders of
  user files do; they take ``header=true``), a first non-blank line holding a word
  that is not a number is reported as a header, quoted, with the fix.
  :func:`skip_header` drops that line when the user said there is one.
* **An empty field** (``1.0,,2.0``, ``,2.0``, or ``1.0,2.0,`` where every line holds
  three values) is reported with its file, line and column. The cost stays off the
  fast path: two substring scans per chunk (``,,`` and a comma opening a line) find
  the interior and leading gaps, and the column check finds the rest (a row with an
  empty field holds one value too few); only then are lines split. A lone trailing
  comma on every line is a style and is accepted; on the last line of a file that
  does not end in a newline it still reads as a file cut short.
"""

from __future__ import annotations

import gzip
import itertools
import re
import warnings
import zlib
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .base import DamagedFileError, DatasetError

_PARSE_CHUNK = 32 << 20  # bytes of text per numpy parse call
_LEAD = re.compile(rb"[ \t\r\n]*")  # leading blank space (matched, not copied as lstrip does)
#: Bytes of the smallest gzip file (header and trailer around an empty stream).
_GZIP_MIN = 20
#: The fix named by a damaged-file error when the loader gives none.
REPLACE_HINT = "Replace it with a good copy (download or copy it again)."


def read_text(path: Path, fix: str = REPLACE_HINT) -> bytes:
    """A file's bytes, gunzipped when it starts with the gzip magic (whatever its name).

    Raises:
        DamagedFileError: the gzip stream is cut short or corrupted, or a ``.gz`` file is
            shorter than a gzip header (0 bytes: an interrupted copy, not "no lines").
    """
    data = Path(path).read_bytes()
    if Path(path).name.endswith(".gz") and len(data) < _GZIP_MIN and data[:1] in (b"", b"\x1f"):
        raise DamagedFileError(
            path,
            f"{path} is a damaged gzip file: {len(data)} bytes, fewer than the "
            f"{_GZIP_MIN} of an empty one (an interrupted copy or download). {fix}",
        )
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


def skip_header(data: bytes) -> tuple[bytes, bytes]:
    """``(data, header)``: the first non-blank line of ``data`` blanked (line numbers
    stay those of the file) and that line's text (``b""`` when there is none)."""
    start = data.rfind(b"\n", 0, _LEAD.match(data).end()) + 1
    end = data.find(b"\n", start)
    end = len(data) if end < 0 else end
    return data[:start] + data[end:], data[start:end].strip()


def first_data_line(data: bytes, first_line: int = 1) -> tuple[bytes, int]:
    """The first non-blank line of ``data`` (stripped) and its line number in the file."""
    start = data.rfind(b"\n", 0, _LEAD.match(data).end()) + 1
    end = data.find(b"\n", start)
    return data[start : len(data) if end < 0 else end].strip(), first_line + data.count(
        b"\n", 0, start)


def looks_like_header(line: bytes) -> bool:
    """Whether a line holds a word (a token starting with a letter, ``_`` or a quote that
    is not a number such as ``nan`` or ``inf``): a column header, not data."""
    for token in line.replace(b",", b" ").split():
        if token[:1].isalpha() or token[:1] in (b"_", b'"', b"'"):
            try:
                float(token)
            except ValueError:
                return True
    return False


def reject_header(text: bytes, path: Path, first_line: int, fix: str) -> None:
    """Raise :class:`DatasetError` if the first non-blank line of ``text`` looks like a
    header (see :func:`looks_like_header`); ``fix`` says how to skip it."""
    line, number = first_data_line(text, first_line)
    if looks_like_header(line):
        raise DatasetError(
            f"{path}, line {number}: the first line {_show(line)} looks like a header (it holds "
            f"words, not numbers). {fix}"
        )


def parse_numbers(
    text: bytes,
    path: Path,
    progress: bool | None,
    as_float: bool = False,
    columns: int | None = None,
    first_line: int = 1,
    fix: str = REPLACE_HINT,
    header_fix: str | None = None,
) -> np.ndarray:
    """All numbers in ``text`` (separated by whitespace or commas), parsed in chunks.

    Args:
        columns: every non-blank line must hold exactly this many values.
        first_line: the file's line number of ``text``'s first line (for messages).
        fix: what the message tells the user to do about a damaged file.
        header_fix: check the first non-blank line for a header (a user's file); the
            message then names this fix (e.g. "load with header=true").

    Raises:
        DatasetError: the first line looks like a header (with ``header_fix``), or a
            comma-separated field is empty (the message names line and column).
        DamagedFileError: a token is not a number, or a line holds another number of
            values than ``columns``; the message names the line.
    """
    if header_fix is not None:
        reject_header(text, path, first_line, header_fix)
    line0, number0 = first_data_line(text, first_line)
    _check_empty_field(line0, path, number0, trailing=False)
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
        raw = text[lo:hi]
        if raw.startswith(b",") or b",," in raw or b"\n," in raw:  # fast scans, no regex
            for i, raw_line in enumerate(raw.split(b"\n")):
                _check_empty_field(raw_line, path, line + i, trailing=False)
        chunk = raw.replace(b",", b" ")
        if columns is not None:
            cut_short = hi == len(text) and not text.endswith(b"\n")
            _check_columns(chunk, raw, columns, path, line, fix, cut_short)
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


def _check_columns(chunk: bytes, raw: bytes, columns: int, path: Path, first_line: int,
                   fix: str, cut_short: bool = False) -> None:
    """Every non-blank line of ``chunk`` (``raw`` with commas turned into spaces) holds
    ``columns`` tokens; a line that does not is checked for an empty field first
    (except the last line of a file that does not end in a newline: cut short).

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
        last = i == chunk.count(b"\n")
        if not (cut_short and last):
            raw_line = raw.split(b"\n", i + 1)[i]
            _check_empty_field(raw_line, path, first_line + i,
                               trailing=len(raw_line.split(b",")) == columns)
        raise DamagedFileError(
            path,
            f"{path}, line {first_line + i}: {int(counts[i])} value(s) ({_show(text)}) where "
            f"every line holds {columns}; the file is damaged or cut short. {fix}",
        )


def _check_empty_field(line: bytes, path: Path, number: int, trailing: bool) -> None:
    """Raise :class:`DatasetError` naming the first empty comma-separated field of ``line``
    (a trailing one only when ``trailing``: ``1,2,`` may be a style, not a gap)."""
    if b"," not in line:
        return
    fields = line.rstrip(b"\r\n").split(b",")
    if not trailing and len(fields) > 1 and not fields[-1].strip():
        fields = fields[:-1]
    for col, field in enumerate(fields, 1):
        if not field.strip():
            raise DatasetError(
                f"{path}, line {number}, column {col}: the value is empty ({_show(line)}); "
                "every field needs a number. Fill it in (or remove the line), then load again."
            )


def _show(line: bytes) -> str:
    return repr(line.strip()[:80].decode(errors="replace"))
