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


# ------------------------------------------------------ each rank's share of the data
SHARES = [resources.RankShare(300 << 20, 5000, 80000), resources.RankShare(500 << 20, 5000,
                                                                            120000)]


def test_each_ranks_share_of_the_data_is_counted():
    fixed = 2 * PROCESS_FIXED_BYTES
    resources.check_rank_data(SHARES, here=Machine(2, fixed + (800 << 20)))  # fits exactly
    with pytest.raises(ValueError) as info:
        resources.check_rank_data(SHARES, here=Machine(2, fixed + (799 << 20)))
    msg = str(info.value)
    assert msg.startswith("2 processes need about 1.6 GiB of memory: 2 processes x 414.8 MiB "
                          "each, plus their shares of the data, 800.0 MiB in all (the "
                          "largest, rank 1's: 5000 rows and 120000 edges, 500.0 MiB), but "
                          "1.6 GiB is available")
    assert "--allow-oversubscribe" in msg
    resources.check_rank_data(SHARES, True, here=Machine(2, 1))  # the override


def test_under_torchrun_the_local_ranks_data_is_counted():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    assert resources.local_ranks(env) == range(2, 4)
    assert resources.local_ranks({"RANK": "0", "WORLD_SIZE": "2"}) is None
    shares = [*SHARES, *SHARES]
    # the processes run: only their data (300 + 500 MiB) against what is left
    resources.check_rank_data(shares, ranks=range(2, 4), started=True,
                              here=Machine(2, 800 << 20))
    with pytest.raises(ValueError, match=r"^the 2 ranks on this host \(2-3 of 4\) need about "
                                         r"800.0 MiB of memory: their shares of the data"):
        resources.check_rank_data(shares, ranks=range(2, 4), started=True,
                                  here=Machine(2, 700 << 20))


@pytest.mark.parametrize("task", ["node", "link"])
def test_cli_refuses_ranks_whose_data_does_not_fit_before_starting_them(
        task, monkeypatch, capsys, tmp_path):
    import ngra.training.link_ranks as link_ranks
    import ngra.training.ranks as ranks

    # room for two processes' fixed cost (the first check passes), not for their data
    monkeypatch.setattr(resources, "machine",
                        lambda: Machine(2, 2 * PROCESS_FIXED_BYTES + (64 << 10)))

    def no_launch(*a, **k):
        raise AssertionError("ranks were started before the refusal")

    monkeypatch.setattr(ranks, "launch", no_launch)
    monkeypatch.setattr(link_ranks, "launch", no_launch)
    rc = main(["train", "--dataset", "sbm:nodes=2000,blocks=2,feat=16", "--nprocs", "2",
               "--task", task, "--no-progress", "--data-root", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT, err
    assert err.startswith("ngra train: error: 2 processes need about ")
    assert "their shares of the data" in err and "rows and" in err and err.count("\n") == 1
