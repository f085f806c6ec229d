"""Shared fixtures: the real-data root and optional baselines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# Without a GPU the gpu backend's Triton kernels run on CPU tensors in Triton's
# interpreter; triton.jit reads this when ngra.kernels.gpu is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def data_root() -> Path:
    """``$NGRA_DATA`` or ``<repo>/../shared/data``."""
    return Path(os.environ.get("NGRA_DATA") or (REPO.parent / "shared" / "data")).resolve()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    root = data_root()
    if not (root / "planetoid").is_dir():
        pytest.skip(f"real datasets not found under {root} (set NGRA_DATA)")
    return root


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(2)
    yield
