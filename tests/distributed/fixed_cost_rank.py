"""A rank for the fixed-cost test, in a module of its own: a spawned rank imports the module
of the function it runs, and a test module would bring pytest into it. It imports
``ngra.cli`` as a rank of the ``ngra`` console script does (``spawn`` re-runs the
launching script's imports)."""

from __future__ import annotations

import sys
from pathlib import Path

import ngra.cli  # noqa: F401

def train_and_read(cfg, folder: str, cut: list[str]) -> dict:
    """``run_rank`` on this rank's shard; its peak (``VmHWM``) and which of ``cut`` it
    loaded."""
    from ngra.memstat import peak_rss_bytes
    from ngra.training.ranks import run_rank

    run_rank(cfg, Path(folder))
    return {"peak": peak_rss_bytes(), "loaded": [m for m in cut if m in sys.modules]}
