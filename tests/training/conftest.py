"""The user's model module for the training API's tests, importable by child processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture
def user_path(monkeypatch) -> str:
    """``PYTHONPATH`` with this folder first: ``user_models:build_model`` imports in spawned
    processes (ranks, the CLI) as it does here."""
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.syspath_prepend(str(HERE))
    return path
