"""Resource guards: ``--nprocs K`` and ``--threads T`` checked against the machine.

Each training process pays a fixed cost before any data (the interpreter, torch, numba,
gloo buffers: :data:`PROCESS_FIXED_BYTES`, measured on a CPU rank). :func:`check_resources`
refuses ``K`` processes whose fixed cost alone exceeds the memory available
(``MemAvailable``), with the figures and the largest ``K`` that fits; and warns when
``K x T`` compute threads exceed the cores this process may run on (each thread then
waits for a core: a run slows down, it does not fail). ``allow_oversubscribe``
(``--allow-oversubscribe``) skips both.
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

from ngra.diskspace import format_bytes

__all__ = ["Machine", "PROCESS_FIXED_BYTES", "check_resources", "machine"]

log = logging.getLogger(__name__)

#: Resident bytes of one training process before its data (a 2-rank gloo run's ranks
#: measured here: interpreter, torch, numba and the process group).
PROCESS_FIXED_BYTES = 435 * 10**6


class Machine(NamedTuple):
    """What this process may use: ``cores`` (its CPU affinity), ``available`` bytes of memory."""

    cores: int
    available: int | None


def machine() -> Machine:
    """The cores this process may run on and the memory available now (``None``: unknown)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    available = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    return Machine(max(cores, 1), available)


def check_resources(nprocs: int, threads: int | None, allow_oversubscribe: bool = False,
                    here: Machine | None = None) -> list[str]:
    """Refuse ``nprocs`` processes that cannot fit in memory (``ValueError`` with the
    figures); return (and log) the warnings of an oversubscribed run. ``threads`` is each
    process's compute threads (``None``: the cores shared out, as ranks do)."""
    if allow_oversubscribe:
        return []
    here = here or machine()
    need = nprocs * PROCESS_FIXED_BYTES
    if nprocs > 1 and here.available is not None and need > here.available:
        fits = max(1, here.available // PROCESS_FIXED_BYTES)
        raise ValueError(
            f"--nprocs {nprocs} needs at least {format_bytes(need)} of memory before any "
            f"data ({nprocs} processes x {format_bytes(PROCESS_FIXED_BYTES)} each), but "
            f"{format_bytes(here.available)} is available; use --nprocs {fits} or fewer, or "
            "--allow-oversubscribe to start them anyway.")
    per = threads or max(1, here.cores // nprocs)
    total = nprocs * per
    warnings = []
    if total > here.cores:
        what = (f"--threads {threads}" if nprocs == 1 else
                f"--nprocs {nprocs} x {per} threads = {total} threads")
        warnings.append(
            f"{what} on {here.cores} cores: the threads take turns on the cores and the run "
            f"is slower than with {max(1, here.cores // nprocs) if nprocs > 1 else here.cores}"
            f"{' threads a process' if nprocs > 1 else ' threads'}"
            + (f" (or --nprocs {here.cores} or fewer)" if nprocs > here.cores else "")
            + "; --allow-oversubscribe silences this.")
    for w in warnings:
        log.warning("%s", w)
    return warnings
