"""Fixtures for kernel tests: a fresh, reported random seed per test."""

from __future__ import annotations

import os
import secrets

import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    """A torch.Generator with a fresh seed (printed, so a failure shows how to replay it)."""
    seed = int(os.environ.get("NGRA_TEST_SEED") or secrets.randbits(31))
    print(f"random seed {seed}: rerun with NGRA_TEST_SEED={seed}")
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def parallel_kernels(monkeypatch):
    """Run every numba kernel through the thread pool, however small the input,
    so the equal-work range split is exercised on every graph case."""
    import ngra.kernels.cpu.util as cpu_util

    monkeypatch.setattr(cpu_util, "_MIN_PARALLEL_BYTES", 0)
