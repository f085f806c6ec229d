"""Resource guards (issue 37, item 5): --nprocs and --threads checked against the cores
and memory of the machine; refused with the figures when the processes cannot fit,
warned when the threads oversubscribe the cores; --allow-oversubscribe overrides."""

from __future__ import annotations

import logging

import pytest

import ngra.training.resources as resources
from ngra.cli import EXIT_BAD_INPUT, build_parser, main
from ngra.training.resources import PROCESS_FIXED_BYTES, Machine, check_resources

GIB = 1 << 30
SMALL = Machine(cores=2, available=20 * GIB)  # this project's machines: 2 cores, 24 GiB


def test_processes_that_cannot_fit_are_refused_with_the_figures():
    with pytest.raises(ValueError) as info:
        check_resources(64, None, here=SMALL)
    msg = str(info.value)
    fits = 20 * GIB // PROCESS_FIXED_BYTES
    assert msg.startswith("--nprocs 64 needs at least 25.9 GiB of memory before any data "
                          "(64 processes x 414.8 MiB each), but 20.0 GiB is available")
    assert f"use --nprocs {fits} or fewer" in msg and "--allow-oversubscribe" in msg
    check_resources(fits, 1, here=Machine(cores=64, available=20 * GIB))  # the advice fits


@pytest.mark.parametrize("nprocs, threads, warned", [
    (1, None, None), (2, None, None), (1, 2, None), (2, 1, None),
    (1, 1000, "--threads 1000 on 2 cores"),
    (2, 2, "--nprocs 2 x 2 threads = 4 threads on 2 cores"),
    (3, None, "--nprocs 3 x 1 threads = 3 threads on 2 cores"),
])
def test_oversubscribed_threads_are_warned(nprocs, threads, warned, caplog):
    with caplog.at_level(logging.WARNING, logger="ngra.training.resources"):
        got = check_resources(nprocs, threads, here=SMALL)
    if warned is None:
        assert got == [] and not caplog.text
    else:
        assert len(got) == 1 and got[0].startswith(warned) and warned in caplog.text


def test_override_flag_skips_refusal_and_warnings(caplog):
    with caplog.at_level(logging.WARNING):
        assert check_resources(64, 1000, allow_oversubscribe=True, here=SMALL) == []
    assert not caplog.text
    args = build_parser().parse_args(["train", "--nprocs", "64", "--allow-oversubscribe"])
    assert args.allow_oversubscribe is True


def test_machine_figures_are_this_process_s():
    m = resources.machine()
    assert m.cores >= 1 and (m.available is None or m.available > 0)


def test_cli_refuses_before_starting_anything(monkeypatch, capsys):
    monkeypatch.setattr(resources, "machine", lambda: SMALL)
    import ngra.training.run as run

    def no_load(*a, **k):
        raise AssertionError("the dataset was loaded before the refusal")

    monkeypatch.setattr(run, "as_dataset", no_load)
    rc = main(["train", "--dataset", "sbm:nodes=60,blocks=2", "--nprocs", "64",
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT
    assert err.startswith("ngra train: error: --nprocs 64 needs at least ")
    assert err.count("\n") == 1


def test_cli_warns_on_too_many_threads_and_trains(monkeypatch, caplog):
    import torch

    monkeypatch.setattr(resources, "machine", lambda: SMALL)
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.WARNING, logger="ngra.training.resources"):
            rc = main(["train", "--dataset", "sbm:nodes=60,blocks=2,feat=4", "--epochs", "1",
                       "--threads", "3", "--no-progress"])
    finally:
        torch.set_num_threads(before)
    assert rc == 0
    assert "--threads 3 on 2 cores" in caplog.text
