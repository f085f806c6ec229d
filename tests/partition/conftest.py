"""Fixtures over the labeled graph cases of ``partition_cases``."""

from __future__ import annotations

import pytest

import ngra

from partition_cases import CASES


@pytest.fixture(params=list(CASES), ids=list(CASES))
def graph_case(request) -> ngra.Graph:
    return CASES[request.param]


@pytest.fixture
def power_law() -> ngra.Graph:
    return CASES["power_law"]
