"""Shards and their metadata carry checksums (issue 37, item 4): a truncated, damaged or
swapped shard, or edited metadata, is found on open; a run rebuilds it (naming the
file), and a rank never trains on it."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

from ngra.datasets import load
from ngra.distributed.shards import build_shards, load_shard, shards_current
from ngra.errors import DamagedFileError
from ngra.partition import build_book
from ngra.training import TrainConfig
from ngra.training.ranks import prepare_shards

SPEC = "sbm:nodes=120,blocks=2,feat=4"


@pytest.fixture
def built(tmp_path):
    ds = load(SPEC, root=tmp_path / "data")
    book = build_book(ds.graph, 2, method="range")
    folder = build_shards(ds, "gcn", book, tmp_path / "shards")
    assert shards_current(folder, ds, "gcn", book)
    return ds, book, folder


def _flip(path, at=None):
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0x01
    path.write_bytes(bytes(data))


def test_intact_shards_load_and_are_verified_once(built, monkeypatch):
    import ngra.distributed.shards as shards

    ds, book, folder = built
    assert (folder / "verified.json").is_file()

    def no_read(path):
        raise AssertionError(f"{path} read again though verified")

    monkeypatch.setattr(shards, "_file_digest", no_read)  # later opens only stat the files
    assert shards_current(folder, ds, "gcn", book)
    for r in range(2):
        assert load_shard(folder, r, 2).x.shape[0] > 0


@pytest.mark.parametrize("damage", ["truncate", "flip", "swap"])
def test_damaged_shard_is_stale_and_refused_naming_the_file(built, damage, caplog):
    ds, book, folder = built
    bad = folder / "rank1.pt"
    if damage == "truncate":
        bad.write_bytes(bad.read_bytes()[:-100])
    elif damage == "flip":
        _flip(bad)
    else:
        shutil.copy(folder / "rank0.pt", bad)
    with caplog.at_level(logging.WARNING):
        assert not shards_current(folder, ds, "gcn", book)
    assert str(bad) in caplog.text and "rebuilding the shards" in caplog.text
    with pytest.raises(DamagedFileError) as info:
        load_shard(folder, 1, 2)
    assert info.value.path == bad and str(bad) in str(info.value)
    assert "rebuilt" in str(info.value)
    load_shard(folder, 0, 2)  # the intact one still loads


def test_edited_metadata_is_refused(built, caplog):
    ds, book, folder = built
    meta = json.loads((folder / "meta.json").read_text())
    meta["bounds"][1] += 1  # a plausible edit: ranks would disagree on who owns what
    (folder / "meta.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING):
        assert not shards_current(folder, ds, "gcn", book)
    assert "does not match its checksum" in caplog.text
    with pytest.raises(DamagedFileError, match="meta.json"):
        load_shard(folder, 0, 2)


def test_a_consistent_folder_with_another_ranks_shard_is_refused(built):
    """Checksums that were recomputed over a swapped file (copied with its listing):
    the shard's own rank still tells."""
    import hashlib

    _, _, folder = built
    shutil.copy(folder / "rank0.pt", folder / "rank1.pt")
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"]["rank1.pt"] = meta["files"]["rank0.pt"]
    body = {k: v for k, v in meta.items() if k != "checksum"}
    meta["checksum"] = hashlib.blake2b(json.dumps(body, sort_keys=True).encode(),
                                       digest_size=16).hexdigest()
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(DamagedFileError, match="is rank 0 of 2's shard, not rank 1 of 2's"):
        load_shard(folder, 1, 2)


def test_a_run_rebuilds_a_damaged_shard(tmp_path, caplog):
    cfg = TrainConfig(dataset=SPEC, nprocs=2, data_root=str(tmp_path), progress=False)
    folder = prepare_shards(cfg)
    good = (folder / "rank1.pt").read_bytes()
    (folder / "rank1.pt").write_bytes(good[: len(good) // 2])
    with caplog.at_level(logging.WARNING):
        assert prepare_shards(cfg) == folder
    assert str(folder / "rank1.pt") in caplog.text
    assert (folder / "rank1.pt").stat().st_size == len(good)
    for r in range(2):
        load_shard(folder, r, 2)


def test_shards_on_a_full_disk_are_a_clear_error_and_leave_nothing(tmp_path, monkeypatch):
    import errno
    import os

    ds = load(SPEC, root=tmp_path / "data")
    book = build_book(ds.graph, 2, method="range")

    def fallocate(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    with pytest.raises(OSError) as info:
        build_shards(ds, "gcn", book, tmp_path / "shards")
    assert "could not write the shard rank0.pt" in str(info.value)
    assert "needed" in str(info.value) and "no space left on device" in str(info.value)
    assert list((tmp_path / "shards").iterdir()) == []
