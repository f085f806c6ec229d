"""The launcher: results by rank, and failures that name the rank that caused them."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from ngra.distributed import DistributedError, launch
from ngra.distributed.launch import describe_failures

import dist_ranks as _ranks

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]


def test_results_come_back_by_rank():
    out = launch(_ranks.rank_and_sum, 2, 10, threads=1)
    assert out == [(0, 2, 30.0), (1, 2, 30.0)]


@pytest.mark.parametrize("how,expect", [("raise", "ValueError: injected failure on rank 1"),
                                        ("kill", "killed by SIGKILL")])
def test_a_failed_rank_is_named_and_the_run_ends(how, expect, tmp_path):
    stamp = tmp_path / "failed-at"
    with pytest.raises(DistributedError) as err:
        launch(_ranks.fail_on, 2, 1, how, str(stamp), threads=1)
    assert time.time() - float(stamp.read_text()) < 60  # every rank ended, not hung
    msg = str(err.value)
    assert msg.startswith("rank 1 of 2 (pid ") and expect in msg, msg


def _failure(code, message="", ts=0):
    return SimpleNamespace(exitcode=code, error_file=None, message=message, timestamp=ts,
                           pid=None)


def test_peer_connection_errors_are_not_the_cause():
    failures = {0: _failure(1, "RuntimeError: Connection closed by peer [127.0.0.1]:123", ts=1),
                2: _failure(1, "KeyError: 'w'", ts=5),
                3: _failure(1, "RuntimeError: [gloo] Timed out waiting", ts=2)}
    msg = describe_failures(failures, 4)
    assert msg.startswith("rank 2 of 4 failed: KeyError: 'w'"), msg
    assert "ranks 0, 3 then stopped" in msg


def test_a_signal_death_outranks_errors():
    failures = {0: _failure(1, "ValueError: x", ts=1), 1: _failure(-9, ts=9)}
    assert describe_failures(failures, 2).startswith("rank 1 of 2 was killed by SIGKILL")
    failures[1].pid = 77
    assert describe_failures(failures, 2).startswith("rank 1 of 2 (pid 77) was killed by")


def test_bad_nprocs():
    with pytest.raises(ValueError, match="nprocs must be an int >= 1; got 0"):
        launch(_ranks.rank_and_sum, 0, 1)


def test_a_rank_that_said_nothing_is_named_when_its_peers_saw_only_connection_errors():
    # the launcher's list holds only the peer's error; the killed rank wrote no report
    failures = {0: _failure(1, "RuntimeError: Connection closed by peer", ts=1)}
    reports = {0: {"rank": 0, "error": "RuntimeError: Connection closed by peer", "time": 1}}
    msg = describe_failures(failures, 2, reports)
    assert msg.startswith("rank 1 of 2 stopped without reporting an error"), msg


def test_a_rank_report_outranks_the_launchers_view_of_it():
    failures = {0: _failure(1, "RuntimeError: Connection closed by peer", ts=1)}
    reports = {1: {"rank": 1, "error": "ValueError: bad rows", "time": 2},
               0: {"rank": 0, "error": "RuntimeError: Connection closed by peer", "time": 1}}
    assert describe_failures(failures, 2, reports).startswith(
        "rank 1 of 2 failed: ValueError: bad rows")
