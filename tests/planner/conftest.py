"""Planner tests: a synthetic link model; a private calibration cache for spawned ranks."""

from __future__ import annotations

import pytest

from planner_cases import make_link


@pytest.fixture
def link():
    return make_link()


@pytest.fixture(autouse=True)
def _calibration_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("NGRA_CALIBRATION", str(tmp_path_factory.getbasetemp() / "calibration"))
