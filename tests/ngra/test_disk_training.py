"""Training from disk stays within its memory bound: the child's measured peak RSS.

``disk_child.py`` trains GCN on an R-MAT graph whose features alone (256 MiB) are
larger than the memory budget, once mapped from the on-disk store (``storage="disk"``)
and once read into memory. Stated bound on ``peak RSS - RSS before training`` (after a
warm-up epoch, with the high-water mark reset): the budget. The features stream from
the cache entry a block at a time, so the disk run stays inside it; the in-memory run
holds them and must not (the test could not pass by measuring nothing).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("disk_child.py")
SPEC = "rmat:scale=15,feat=2048"  # 32768 x 2048 float32 features: 256 MiB
MIB = 2**20
BUDGET = 192 * MIB


def _run(storage: str, cache: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="2", NGRA_CACHE=str(cache))
    out = subprocess.run([sys.executable, str(CHILD), SPEC, str(BUDGET), storage],
                         capture_output=True, text=True, timeout=600, env=env, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("disk-cache")
    env = dict(os.environ, NGRA_CACHE=str(root))
    subprocess.run([sys.executable, "-c", f"from ngra.datasets import load; load({SPEC!r})"],
                   env=env, check=True, timeout=600)
    return root


def test_disk_training_peak_stays_within_budget(cache):
    disk = _run("disk", cache)
    assert disk["storage"] == "disk" and disk["test_acc"] > 0.3
    used = disk["peak"] - disk["before"]
    assert used <= BUDGET, (
        f"disk: used {used / MIB:.0f} MiB > budget {BUDGET / MIB:.0f} MiB (RSS before "
        f"{disk['before'] / MIB:.0f} MiB, peak reset: {disk['peak_reset']})")
    memory = _run("memory", cache)
    assert memory["storage"] == "memory"
    assert memory["peak"] - memory["before"] > BUDGET  # the features alone exceed it
