"""The compiler's tests run GAT's softmax value through the recompute path at every size
(by default only a value of at least ``RECOMPUTE_VALUE_BYTES`` is made again in backward,
and the test graphs are small)."""

from __future__ import annotations

import pytest

import ngra.compiler.compiled as compiled


@pytest.fixture(autouse=True)
def recompute_every_value(monkeypatch):
    monkeypatch.setattr(compiled, "RECOMPUTE_VALUE_BYTES", 0)
