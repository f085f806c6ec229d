"""Child process for the disk-storage memory test: train from the on-disk store, report RSS.

Usage: python disk_child.py SPEC BUDGET STORAGE [BLOCK_EDGES] [TASK] (the dataset must be
in the cache already; ``BUDGET`` may be ``none``; ``BLOCK_EDGES`` sets the edges a block
when kernels walk a mapped structure, ``-`` for the default; ``TASK``: ``node``, the
default, or ``link``).
Warms up with one epoch of the same run (numba loads or compiles its kernels: not the
training's working set), resets the high-water mark, then trains SPEC for two epochs with
``storage=STORAGE`` and ``memory_budget=BUDGET``; prints one JSON line with the RSS
before training, the peak during it and the summary's storage.
"""

from __future__ import annotations

import json
import sys

import torch

from ngra.memstat import peak_rss_bytes, reset_peak_rss, rss_bytes
from ngra.training import TrainConfig
from ngra.training.run import train


def main() -> None:
    spec, budget, storage = sys.argv[1], sys.argv[2], sys.argv[3]
    budget = None if budget == "none" else budget
    if len(sys.argv) > 4 and sys.argv[4] != "-":
        import ngra.kernels.cpu.util as cpu_util

        cpu_util.MAPPED_BLOCK_EDGES = int(sys.argv[4])
    task = sys.argv[5] if len(sys.argv) > 5 else "node"
    torch.set_num_threads(2)
    # warm-up: one epoch of the same run (numba loads or compiles every kernel it uses)
    train(TrainConfig(model="gcn", dataset=spec, epochs=1, progress=False,
                      memory_budget=budget, storage=storage, task=task))
    reset = reset_peak_rss()
    before = rss_bytes()
    out = train(TrainConfig(model="gcn", dataset=spec, epochs=2, progress=False,
                            memory_budget=budget, storage=storage, task=task))
    print(json.dumps({"before": before, "peak": peak_rss_bytes(), "peak_reset": reset,
                      "storage": out["storage"], "test_acc": out["test_acc"],
                      "disk_read_mb": out["disk_read_mb"]}))


if __name__ == "__main__":
    main()
