"""Threads released at once on one call: the race harness of the thread-safety tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def run_threads(fn: Callable[[int], Any], n: int, timeout: float = 120) -> list[Any]:
    """``fn(i)`` in ``n`` threads released together by a barrier; their results by thread.
    The first error of any thread is raised here; a thread still running after
    ``timeout`` seconds fails the call."""
    barrier = threading.Barrier(n, timeout=timeout)
    out: list[Any] = [None] * n
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait()
            out[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - raised by the calling thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    if errors:
        raise errors[0]
    return out
