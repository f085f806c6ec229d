"""A real full disk: a 1 MiB tmpfs mounted for the test (root only; skipped elsewhere).

test_disk_full.py injects the fault with a file-size limit or a failing fallocate; here the
file system itself runs out of blocks, as a user's disk does. A streamed dataset cache
(``--storage disk``) and a checkpoint written there must end in ngra's one-line error
and exit 2 (no SIGBUS from a mapped page, no traceback), leave no partial folder or
temporary behind, and the same run must then succeed once space is found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SPEC = "rmat:scale=12,edge_factor=8,feat=64"  # x alone is 1 MiB: more than the disk


@pytest.fixture
def small_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                       capture_output=True, text=True, check=False)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _train(cache: Path, data: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NGRA_CACHE": str(cache), "NGRA_DATA": str(data), "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "-m", "ngra", "train", "--model", "gcn",
                           "--dataset", SPEC, "--epochs", "1", "--no-progress", *argv],
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def _used(disk: Path) -> int:
    return shutil.disk_usage(disk).used


def test_streamed_cache_on_a_full_disk_exits_2_and_a_retry_with_room_trains(small_disk,
                                                                           tmp_path):
    cache = small_disk / "cache"
    r = _train(cache, tmp_path / "data", "--storage", "disk")
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])  # not 135 (SIGBUS), not 1
    assert "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "could not write" in line and str(small_disk) in line and "needed" in line, line
    assert _used(small_disk) < 64 << 10  # the partial entry is gone, temporaries too
    again = _train(cache, tmp_path / "data", "--storage", "disk")  # no leftover in the way
    assert again.returncode == 2 and "leftover" not in again.stderr.lower(), again.stderr
    ok = _train(tmp_path / "roomy", tmp_path / "data", "--storage", "disk")
    assert ok.returncode == 0, ok.stderr[-2000:]


def test_checkpoint_on_a_full_disk_exits_2_and_names_the_folder(small_disk, tmp_path):
    (small_disk / "filler").write_bytes(b"\0" * (700 << 10))  # a checkpoint needs ~450 KiB
    ck = small_disk / "ck"
    r = _train(tmp_path / "cache", tmp_path / "data", "--hidden", "512", "--checkpoint",
               str(ck), "--checkpoint-every", "1")
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "could not write a checkpoint" in line and str(ck) in line and "needed" in line
    assert _used(small_disk) < (700 + 64) << 10  # nothing half-written stays
