"""Shared fixtures: the real-data root and optional baselines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
#: The folder of ``user_models.py``, the user's module of the training tests.
USER_MODELS = REPO / "tests" / "training"

# Without a GPU the gpu backend's Triton kernels run on CPU tensors in Triton's
# interpreter; triton.jit reads this when ngra.kernels.gpu is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:  # the fuzzing battery's profiles (hypothesis is a test extra)
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - the fuzz tests skip themselves
    pass
else:
    _SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    # `make test`: a fixed seed and few examples, so the battery stays fast and repeatable.
    settings.register_profile("ci", max_examples=25, derandomize=True, deadline=None,
                              database=None, suppress_health_check=_SLOW_OK)
    # `make test-all`: many more examples from a fresh seed (printed on failure).
    settings.register_profile("thorough", max_examples=400, deadline=None, database=None,
                              print_blob=True, suppress_health_check=_SLOW_OK)
    settings.load_profile(os.environ.get("NGRA_HYPOTHESIS_PROFILE", "ci"))


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


@pytest.fixture(autouse=True)
def _strict_passes():
    """A compiler pass that raises fails the test instead of falling back silently."""
    from ngra import compiler  # not at the top: TRITON_INTERPRET must be set first

    with compiler.strict():
        yield


@pytest.fixture
def user_path(monkeypatch) -> str:
    """``PYTHONPATH`` with :data:`USER_MODELS` first: ``user_models:build_model`` imports
    in spawned processes (ranks, the CLI) as it does here."""
    path = os.pathsep.join(p for p in (str(USER_MODELS), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.syspath_prepend(str(USER_MODELS))
    return path
