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


# ---------------------------------------------------------------- every other write
SBM = "sbm:nodes=60,blocks=2,feat=4"


def _cli_child(limit: int, *argv: str) -> subprocess.CompletedProcess:
    """``ngra ARGV`` in a child whose files may not grow past ``limit`` bytes."""
    return _child("""
        from ngra.cli import main
        sys.exit(main(sys.argv[1:]))
    """, limit, *argv)


def _no_temporaries(folder: Path) -> bool:
    return not [p for p in folder.iterdir() if p.name.startswith(".")]


def _assert_disk_full_exit(r: subprocess.CompletedProcess, what: str, where: Path) -> None:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert f"could not write {what} to {where}" in line, r.stderr
    assert "file-size limit" in line and "needed" in line


def test_atomic_output_keeps_the_previous_file_when_the_block_fails(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("previous")
    with pytest.raises(KeyError):
        with diskspace.atomic_output(path, "a file") as fh:
            fh.write(b"half")
            raise KeyError("a bug mid-write")
    assert path.read_text() == "previous" and _no_temporaries(tmp_path)
    diskspace.write_file(path, "new", "a file")
    assert path.read_text() == "new" and _no_temporaries(tmp_path)
    assert (path.stat().st_mode & 0o777) == (0o666 & ~_umask())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_partition_book_on_a_full_disk_exits_2_and_keeps_the_previous_book(tmp_path):
    from ngra.partition import build_book, save_book

    data, out = tmp_path / "data", tmp_path / "book"
    spec = "sbm:nodes=3000,blocks=4,feat=4"
    ds = load(spec, root=data)  # the dataset's cache entry exists: the book is all it writes
    save_book(build_book(load(SBM, root=data).graph, 2, method="range"), out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    r = _cli_child(16 << 10, "partition", "--dataset", spec, "--parts", "2", "--method",
                   "range", "--out", str(out), "--data-root", str(data))
    _assert_disk_full_exit(r, "the partition book's arrays", out / "book.pt")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # and no temporary
    assert ds.num_nodes == 3000


def test_train_summary_on_a_full_disk_exits_2_and_keeps_the_previous_summary(tmp_path):
    data, out = tmp_path / "data", tmp_path / "summary.json"
    load(SBM, root=data)
    out.write_text("{}\n")
    r = _cli_child(2048, "train", "--dataset", SBM, "--epochs", "30", "--no-progress",
                   "--data-root", str(data), "--out", str(out))
    _assert_disk_full_exit(r, "the JSON summary", out)
    assert out.read_text() == "{}\n" and _no_temporaries(tmp_path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from ngra.cli import main

    root = tmp_path_factory.mktemp("trained")
    assert main(["train", "--dataset", SBM, "--epochs", "2", "--no-progress", "--checkpoint",
                 str(root / "ck"), "--data-root", str(root / "data")]) == 0
    return root


@pytest.mark.parametrize("name", ["scores.npy", "scores.csv"])
def test_predictions_on_a_full_disk_exit_2_and_keep_the_previous_file(trained, tmp_path, name):
    out = tmp_path / name
    out.write_text("previous")
    r = _cli_child(512, "predict", "--checkpoint", str(trained / "ck"), "--dataset", SBM,
                   "--output", "scores", "--out", str(out), "--data-root",
                   str(trained / "data"))
    _assert_disk_full_exit(r, "the predictions (60 rows)", out)
    assert out.read_text() == "previous" and _no_temporaries(tmp_path)
    if name.endswith(".npy"):  # reserved first: the figure is the array and its header
        assert f"{(60 * 2 * 4 + 4096) / 1024:.1f} KiB needed" in r.stderr


def test_calibration_on_a_full_disk_keeps_the_previous_file(tmp_path):
    path = tmp_path / "link-host.json"
    path.write_text('{"old": 1}\n')
    r = _child("""
        from pathlib import Path
        from ngra.calibration import save_calibration
        from ngra.errors import DiskFullError
        try:
            save_calibration(Path(sys.argv[1]), {"samples": list(range(5000))},
                             "the link calibration")
        except DiskFullError as e:
            print("DISKFULL", e)
    """, 4096, str(path))
    assert r.returncode == 0, r.stderr
    assert f"DISKFULL could not write the link calibration to {path}" in r.stdout
    assert path.read_text() == '{"old": 1}\n' and _no_temporaries(tmp_path)


def test_plans_on_a_full_disk_exit_2_and_keep_the_previous_file(tmp_path):
    out = tmp_path / "plans.json"
    out.write_text("{}\n")
    r = _cli_child(64, "plan", "--model", "mlp:64,256,64", "--rows", "512", "--devices", "2",
                   "--out", str(out))
    _assert_disk_full_exit(r, "the plans", out)
    assert out.read_text() == "{}\n" and _no_temporaries(tmp_path)


def test_result_to_json_on_a_full_disk_keeps_the_previous_file(tmp_path):
    out = tmp_path / "summary.json"
    out.write_text("{}\n")
    r = _child("""
        import ngra
        r = ngra.fit("gcn", "sbm:nodes=60,blocks=2,feat=4", epochs=2, progress=False,
                     data_root=sys.argv[2])
        try:
            r.to_json(sys.argv[1])
        except ngra.DiskFullError as err:
            print("DISKFULL", err)
    """, 1024, str(out), str(tmp_path / "data"))
    assert "DISKFULL could not write the run's summary" in r.stdout, r.stderr
    assert out.read_text() == "{}\n" and _no_temporaries(tmp_path)
