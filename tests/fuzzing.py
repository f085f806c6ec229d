"""Shared by the fuzzing battery: the property every generated input must satisfy, and
byte-level mutations of valid files.

The property: a call returns a valid result or raises one of ngra's documented
exception types with a non-empty message. Any other exception escapes
:func:`documented_errors` and fails the example; a hang fails the test through its
timeout. Profiles (example counts, seeds) are set in ``tests/conftest.py``.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import event
from hypothesis import strategies as st


@contextmanager
def documented_errors(*allowed: type[BaseException]) -> Iterator[None]:
    """Let the block raise only ``allowed`` types, each with a message."""
    try:
        yield
    except allowed as err:
        assert str(err).strip(), f"{type(err).__name__} raised with an empty message"
        event(f"raised {type(err).__name__}")  # --hypothesis-show-statistics counts outcomes
    else:
        event("valid result")


@st.composite
def mutated(draw: st.DrawFn, data: bytes, max_ops: int = 3) -> bytes:
    """``data`` after 1..max_ops byte edits: truncation, bit flips, insertions, deletions,
    a duplicated or dropped line, a token replaced by garbage."""
    b = bytearray(data)
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "line", "token"]))
        at = draw(st.integers(0, len(b)))
        if op == "truncate":
            del b[at:]
        elif op == "flip" and b:
            i = min(at, len(b) - 1)
            b[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            b[at:at] = draw(st.binary(min_size=1, max_size=4) | st.sampled_from(
                [b"\n", b",", b" ", b"-", b"9", b"nan", b"1e999", b"#"]))
        elif op == "delete":
            del b[at : at + draw(st.integers(1, 4))]
        elif op == "line":
            lines = bytes(b).split(b"\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines[i:i + 1] = draw(st.sampled_from([[], [lines[i], lines[i]], [lines[i][:1]]]))
            b = bytearray(b"\n".join(lines))
        elif op == "token":
            tokens = bytes(b).split(b",")
            i = draw(st.integers(0, len(tokens) - 1))
            tokens[i] = draw(st.sampled_from([b"", b"-1", b"x", b"nan", b"inf", b"99999999999"]))
            b = bytearray(b",".join(tokens))
    return bytes(b)


@st.composite
def maybe_gzipped(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` as is, gzipped, or gzipped and cut short."""
    kind = draw(st.sampled_from(["plain", "gzip", "cut gzip"]))
    if kind == "plain":
        return data
    packed = gzip.compress(data)
    if kind == "gzip":
        return packed
    return packed[: draw(st.integers(2, max(2, len(packed) - 1)))]
