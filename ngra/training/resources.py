"""Resource guards: ``--nprocs K`` and ``--threads T`` checked against the machine.

Each training process pays a fixed cost before any data (the interpreter, torch, numba,
gloo buffers: :data:`PROCESS_FIXED_BYTES`, measured on a CPU rank). :func:`check_resources`
refuses ``K`` processes whose fixed cost alone exceeds the memory available
(``MemAvailable``), with the figures and the largest ``K`` that fits; and warns when
``K x T`` compute threads exceed the cores this process may run on (each thread then
waits for a core: a run slows down, it does not fail). ``allow_oversubscribe``
(``--allow-oversubscribe``) skips both.

Once the partition is made and each rank's shard written, :func:`check_rank_data` checks
again with each rank's share of the data added (its shard's bytes: its rows' features,
labels and masks, its in-edges and its halo lists, which the rank maps and reads): the
refusal names the total, the largest share with its rows and edges, and the memory
available, before any rank starts. Under ``torchrun`` (``RANK``, ``WORLD_SIZE`` and
``LOCAL_WORLD_SIZE`` set) the processes exist already: only the shares of this host's
ranks (:func:`local_ranks`) are counted against what is available.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import NamedTuple

from ngra.diskspace import format_bytes

__all__ = ["Machine", "PROCESS_FIXED_BYTES", "RankShare", "check_rank_data", "check_resources",
           "local_ranks", "machine"]

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


class RankShare(NamedTuple):
    """One rank's share of the data: ``bytes`` it maps (its shard), its ``rows`` (owned
    vertices) and ``edges`` (in-edges)."""

    bytes: int
    rows: int
    edges: int


def local_ranks(env: dict[str, str] | None = None) -> range | None:
    """The global ranks on this host under ``torchrun`` (``RANK``, ``WORLD_SIZE`` and
    ``LOCAL_WORLD_SIZE`` set; hosts hold consecutive ranks), else ``None``."""
    env = os.environ if env is None else env
    try:
        rank, local = int(env["RANK"]), int(env["LOCAL_WORLD_SIZE"])
        world = int(env["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None
    first = rank - rank % max(local, 1)
    return range(first, min(first + local, world))


def check_rank_data(shares: Sequence[RankShare], allow_oversubscribe: bool = False,
                    here: Machine | None = None, ranks: Sequence[int] | None = None,
                    started: bool = False) -> None:
    """Refuse (``ValueError`` with the figures) ranks that cannot hold their shares of the
    data: ``shares`` by rank; ``ranks`` those on this host (default: all); ``started``:
    their processes run already (``torchrun``: the memory available has their fixed
    cost taken off, so only the data is counted)."""
    if allow_oversubscribe:
        return
    here = here or machine()
    ranks = range(len(shares)) if ranks is None else ranks
    if here.available is None or not ranks:
        return
    k = len(ranks)
    data = sum(shares[r].bytes for r in ranks)
    fixed = 0 if started else k * PROCESS_FIXED_BYTES
    if fixed + data <= here.available:
        return
    big = max(ranks, key=lambda r: shares[r].bytes)
    s = shares[big]
    procs = "" if started else (f"{k} processes x {format_bytes(PROCESS_FIXED_BYTES)} "
                                "each, plus ")
    where = (f"the {k} ranks on this host ({ranks[0]}-{ranks[-1]} of {len(shares)})"
             if k != len(shares) else f"{k} processes")
    raise ValueError(
        f"{where} need about {format_bytes(fixed + data)} of memory: {procs}their shares of "
        f"the data, {format_bytes(data)} in all (the largest, rank {big}'s: {s.rows} rows "
        f"and {s.edges} edges, {format_bytes(s.bytes)}), but {format_bytes(here.available)} "
        "is available; use fewer processes, a machine with more memory, or "
        "--allow-oversubscribe to start them anyway.")
