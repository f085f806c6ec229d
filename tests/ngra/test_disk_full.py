"""A full disk is a clear error, never a signal; what was there before is untouched
(issue 37, item 2).

The full disk is simulated two ways: ``os.posix_fallocate`` made to fail with ``ENOSPC``
(what a full disk answers), and, in a child process, a file-size limit
(``RLIMIT_FSIZE``: every write past it fails with ``EFBIG``; Python ignores ``SIGXFSZ``),
which also catches writes that did not reserve first.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import ngra.diskspace as diskspace
from ngra.datasets.cache import EntryWriter, load_cached, save_cached
from ngra.datasets.spec import load
from ngra.errors import DiskFullError
from ngra.mapped import scratch_mapped
from ngra.training.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def full_disk(monkeypatch):
    """Every reservation fails as on a full disk; returns the sizes asked for."""
    asked: list[int] = []

    def fallocate(fd, offset, length):
        asked.append(length)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    return asked


def test_reserve_names_what_how_much_and_where(tmp_path, full_disk):
    with open(tmp_path / "f", "wb") as fh:
        with pytest.raises(DiskFullError) as info:
            diskspace.reserve(fh.fileno(), 3 << 20, "the thing", tmp_path)
    err = info.value
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    assert err.needed == 3 << 20 and err.path == tmp_path
    msg = str(err)
    assert "the thing" in msg and "3.0 MiB needed" in msg and str(tmp_path) in msg
    assert "no space left on device" in msg and "free there" in msg


def test_scratch_array_on_a_full_disk_raises_and_leaves_no_file(tmp_path, full_disk):
    near = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32,
                                     shape=(100, 4))
    from ngra.mapped import register_mapped

    register_mapped(near)
    with pytest.raises(DiskFullError, match="scratch array"):
        scratch_mapped(near, (1000, 8), np.float32)
    assert full_disk == [1000 * 8 * 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]


def test_streamed_cache_build_on_a_full_disk_raises_and_removes_the_partial_folder(
        tmp_path, full_disk):
    spec = "rmat:scale=8,edge_factor=4,feat=4"
    with pytest.raises(DiskFullError) as info:
        load(spec, root=tmp_path)
    assert "dataset cache entry" in str(info.value) and "needed" in str(info.value)
    cache = tmp_path / "cache"
    assert not list(cache.glob(".tmp-*")) and not list(cache.iterdir())


def test_cache_save_on_a_full_disk_keeps_the_previous_entry(tmp_path, monkeypatch, caplog):
    ds = load("sbm:nodes=60,blocks=2,feat=4", root=tmp_path, cache=False)
    entry = tmp_path / "entry"
    assert save_cached(ds, entry, "sbm-test")
    before = {p.name: p.read_bytes() for p in entry.iterdir()}

    def fallocate(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    assert not save_cached(ds, tmp_path / "other", "sbm-test")
    assert "no space left on device" in caplog.text and "needed" in caplog.text
    assert not (tmp_path / "other").exists()
    save_cached(ds, entry, "sbm-test")  # a rewrite over the entry (a stale one) fails too
    assert {p.name: p.read_bytes() for p in entry.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []
    monkeypatch.undo()
    assert load_cached(entry, "sbm-test") is not None


def test_entry_writer_reserves_before_mapping(tmp_path, full_disk):
    w = EntryWriter(tmp_path / "e")
    with pytest.raises(DiskFullError, match="array 'x'"):
        w.array("x", (1000, 16), np.float32)
    assert full_disk and full_disk[0] >= 1000 * 16 * 4
    w.discard()
    assert not tmp_path.joinpath("e").exists() and not list(tmp_path.glob(".tmp-*"))


def test_checkpoint_save_on_a_full_disk_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    save_checkpoint({"w": torch.ones(10)}, tmp_path)

    def fallocate(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    with pytest.raises(DiskFullError, match="could not write a checkpoint"):
        save_checkpoint({"w": torch.zeros(1000)}, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_NAME]
    assert torch.equal(load_checkpoint(tmp_path / CHECKPOINT_NAME)["w"], torch.ones(10))


def _child(code: str, limit: int, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a child whose files may not grow past ``limit`` bytes."""
    pre = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
    """)
    return subprocess.run([sys.executable, "-c", pre + textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_checkpoint_past_the_file_size_limit_in_a_child(tmp_path):
    # the real torch.save path: the reservation fails before anything is written
    r = _child("""
        import torch
        from ngra.training.checkpoint import save_checkpoint
        from ngra.errors import DiskFullError
        save_checkpoint({"w": torch.ones(10)}, sys.argv[1])
        try:
            save_checkpoint({"w": torch.zeros(1 << 20)}, sys.argv[1])
        except DiskFullError as e:
            print("DISKFULL", e)
    """, 2 << 20, str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "DISKFULL could not write a checkpoint" in r.stdout
    assert "file-size limit" in r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_NAME]
    assert torch.equal(load_checkpoint(tmp_path / CHECKPOINT_NAME)["w"], torch.ones(10))


def test_checkpoint_whose_estimate_is_short_still_fails_cleanly(tmp_path, monkeypatch):
    """The reservation covers the tensors; if the writes still run out (a state of many
    small objects), the save fails as DiskFullError, not torch's RuntimeError."""
    r = _child("""
        import torch
        import ngra.training.checkpoint as ck
        from ngra.errors import DiskFullError
        ck._MARGIN = 0
        ck.save_checkpoint({"w": torch.ones(10)}, sys.argv[1])
        try:
            ck.save_checkpoint({"l": list(range(200000)), "w": torch.ones(10)}, sys.argv[1])
        except DiskFullError as e:
            print("DISKFULL", e)
    """, 200_000, str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "DISKFULL could not write a checkpoint" in r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_NAME]


def test_train_with_a_full_checkpoint_disk_exits_2_without_traceback(tmp_path):
    ck = tmp_path / "ck"
    r = _child("""
        from ngra.cli import main
        sys.exit(main(["train", "--dataset", "sbm:nodes=60,blocks=2,feat=4", "--epochs", "2",
                       "--checkpoint", sys.argv[1], "--checkpoint-every", "1",
                       "--no-progress", "--data-root", sys.argv[2]]))
    """, 4096, str(ck), str(tmp_path / "data"))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "could not write a checkpoint" in r.stderr and "needed" in r.stderr
    assert not list(ck.glob(".ckpt-*"))


def test_disk_full_error_is_exported_and_picklable():
    import pickle

    import ngra

    err = ngra.DiskFullError("/x", 10, "no room", errno.EFBIG)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is ngra.DiskFullError and str(again) == "no room"
    assert again.errno == errno.EFBIG and again.needed == 10 and again.path == Path("/x")
