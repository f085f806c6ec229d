"""Distributed tests: gloo ranks on 127.0.0.1, a private calibration cache, bounded time."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _calibration_dir(tmp_path_factory, monkeypatch):
    # ranks inherit the environment: every test run measures (or reuses) its own link
    monkeypatch.setenv("NGRA_CALIBRATION", str(tmp_path_factory.getbasetemp() / "calibration"))
