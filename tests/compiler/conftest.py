"""The compiler's tests run GAT's softmax value through the recompute path at every size
(by default only a value of at least ``RECOMPUTE_VALUE_BYTES`` is made again in backward,
and the test graphs are small).

Graph cases come seeded from ``graph_cases``; the features, weights and probes a test draws
from torch's global generator are seeded here per test from its id and the same base seed,
so one ``NGRA_TEST_SEED`` replays a failing test whole, whatever ran before it."""

from __future__ import annotations

import pytest
import torch
from graph_cases import BASE_SEED, case_seed

import ngra.compiler.compiled as compiled


@pytest.fixture(autouse=True)
def recompute_every_value(monkeypatch):
    monkeypatch.setattr(compiled, "RECOMPUTE_VALUE_BYTES", 0)


@pytest.fixture(autouse=True)
def _seeded_global_rng(request):
    seed = case_seed("test", request.node.nodeid)
    print(f"global torch seed {seed}; rerun with NGRA_TEST_SEED={BASE_SEED}")
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    yield
    torch.random.set_rng_state(state)
