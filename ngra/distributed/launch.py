"""Starting K ranks with torch's elastic launcher, and naming the rank that failed.

:func:`launch` runs ``fn(*args)`` in ``nprocs`` processes through
``torch.distributed.launcher.api.elastic_launch`` (what ``torchrun`` runs: a c10d
rendezvous on a free port of 127.0.0.1, no restarts), each with the default process
group initialized (gloo on the CPU, NCCL with one GPU a rank) and ``threads`` torch
threads. ``torchrun --nproc_per_node K -m ngra train ...`` starts the same workers
from the outside; :func:`in_worker` tells a process that it is one of them.

Faults: when a rank raises or is killed, the launcher's agent tears the other ranks
down within a few seconds (their collectives fail with "Connection closed by peer"
first, or they are terminated) and raises ``ChildFailedError``. Its "root cause" is
whichever failure it saw first, often a healthy peer's connection error, so
:func:`describe_failures` names the real cause itself: a rank ended by a signal, else
a rank whose error is not a peer-connection error, else the earliest failure. Every
collective also has a timeout (``timeout_s``), so a rank that stops answering without
dying ends the run instead of hanging it.

Interrupts: ``SIGINT`` / ``SIGTERM`` to the launching process make the launcher stop the
ranks and raise its ``SignalException`` (:mod:`ngra.training.interrupt` turns it into one
line); its own log lines about it are silenced (:func:`_quiet_elastic`), a rank that gets
Ctrl-C itself (the terminal's whole process group) leaves without a message, and ranks
hold no named semaphores (tqdm's lock) that a stopped rank would leak.

Fixed cost: a rank is a fresh interpreter (``spawn``), and what it imports it pays for
before any data. A Cora GCN rank on the CPU peaks at about 377 MB
(``experiments/rank_fixed_cost.py``, torch 2.13, numba 0.63; the target is 380): the
interpreter 15, ``import torch`` 205 (libtorch's pages, its operator registrations, torch's
Python modules), ``import numba`` 56 (mostly libllvmlite's pages), ngra's modules 19, gloo
2, the shard 2, numba's implementations 42 (the NRT module, which LLVM compiles even when
every kernel comes from numba's cache, and numba's registries), the first step 32 (kernels
read from numba's cache, the shard's features paged in, activations), later steps 2-3.
These are what is left; glibc arenas (``MALLOC_ARENA_MAX=2``) change nothing at one thread.
A first run after a kernel changed compiles it instead, about 20 MB more. Kept out, 180 MB:
``torch._dynamo`` (``torch.optim``'s wrappers import it; ngra trains with
:class:`ngra.training.optim.Adam`), matplotlib (a rank of the ``ngra`` console script
re-imports ``ngra.cli``, which loads its plotting commands only when they run), DTensor
(only for plans that split a Linear), sympy 35 (``torch.broadcast_shapes`` and
``torch.autograd.grad`` with ``grad_outputs`` import it: ngra calls
:mod:`ngra.kernels.lean`'s instead) and ``scipy.linalg`` 14 (numba imports it to ask
whether BLAS exists: :func:`ngra.training.ranks.run_rank` loads numba's implementations
without it). A first run on a machine also calibrates the link, DTensor's cost included,
and caches it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ngra.errors import DistributedError

__all__ = ["DistributedError", "launch", "in_worker", "init_process_group", "free_port",
           "describe_failures", "DEFAULT_TIMEOUT_S"]

log = logging.getLogger(__name__)

#: Seconds a collective may wait for its peers before the run fails (not hangs).
DEFAULT_TIMEOUT_S = 300.0

#: Errors a healthy rank reports when a peer died first: not the cause of a failure.
_PEER_ERRORS = ("connection closed by peer", "connection reset by peer", "broken pipe",
                "connection refused", "socket closed", "recvbytes", "sendbytes",
                "read error", "write error", "timed out", "timeout", "got signal")
#: Seconds a rank that saw a peer's failure waits before exiting (the launcher polls 2/s).
_PEER_GRACE_S = 2.0
_ELASTIC_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher",
                    "torch.multiprocessing")


def in_worker() -> bool:
    """Whether this process is a rank started by :func:`launch` or ``torchrun``."""
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_process_group(backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                       device: str = "cpu") -> None:
    """Initialize the default group from the launcher's environment (``env://``).

    ``backend`` defaults to NCCL when ``device`` is ``"cuda"`` (one GPU a rank: the
    rank's ``LOCAL_RANK``), else gloo. Idempotent.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if backend is None:
        backend = "nccl" if device == "cuda" else "gloo"
    kw: dict[str, Any] = {}
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        kw["device_id"] = torch.device("cuda", local)
        # NCCL moves CUDA tensors; the small CPU ones (metric sums, objects) go over gloo
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)


@contextlib.contextmanager
def _quiet_elastic() -> Iterator[None]:
    """The launcher logs every failure with tracebacks at ERROR, and a signal's stop ("Received
    15 death signal, shutting down workers") at WARNING; we name them once ourselves. Its
    modules' loggers carry their own levels, so each is quieted, not only the parents."""
    names = {*_ELASTIC_LOGGERS, *(n for n in logging.root.manager.loggerDict
                                  if n.startswith(_ELASTIC_LOGGERS))}
    loggers = [logging.getLogger(n) for n in sorted(names)]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _worker(fn: Callable[..., Any], backend: str | None, timeout_s: float, threads: int | None,
            device: str, reports: str, args: tuple) -> Any:
    """One rank: threads, the default process group, ``fn(*args)``, clean shutdown.

    An exception is also written to ``reports/rank<R>.json`` (type, message, time), so
    that the launcher can tell the failure that started a teardown from the peers'
    connection errors that followed it (its own failure list may hold only the latter).
    """
    import torch.distributed as dist

    for name in _ELASTIC_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # progress bars lock with a thread lock: tqdm's default is a named semaphore, which a
    # rank stopped by a signal leaves for the resource tracker to warn about
    tqdm.set_lock(threading.RLock())
    if threads:
        torch.set_num_threads(threads)
    try:
        init_process_group(backend, timeout_s, device)
        result = fn(*args)
    except KeyboardInterrupt:
        # Ctrl-C reaches every process of the terminal's group: the launcher reports it
        # once (ngra: one line naming the last checkpoint); the ranks leave without a word
        os._exit(128 + signal.SIGINT)
    except BaseException as exc:
        rank = int(os.environ.get("RANK", "-1"))
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        report = {"rank": rank, "error": text, "time": time.time(), "pid": os.getpid(),
                  "traceback": traceback.format_exc()}
        with contextlib.suppress(OSError):
            Path(reports, f"rank{rank}.json").write_text(json.dumps(report))
        if _is_peer(text):
            # a peer failed first: give the launcher a moment to see that failure (a
            # signal death leaves no report) before this one
            time.sleep(_PEER_GRACE_S)
        else:
            sys.stderr.write(f"ngra: rank {rank}: {text}\n")
            sys.stderr.flush()
        # Leave now: tearing the process group down (or the interpreter's own shutdown)
        # can block on a peer still waiting in a collective.
        os._exit(1)
    if dist.is_initialized():
        dist.destroy_process_group()
    return result


def launch(fn: Callable[..., Any], nprocs: int, *args: Any, backend: str | None = None,
           device: str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S,
           threads: int | None = None, monitor_interval: float = 0.5) -> list[Any]:
    """Run ``fn(*args)`` on ``nprocs`` ranks; returns each rank's result, by rank.

    ``fn`` must be picklable (a module-level function): ranks are started with the
    ``spawn`` method. Inside ``fn`` the default process group is initialized.

    Raises:
        ValueError: ``nprocs`` < 1.
        DistributedError: a rank raised or was killed; the message names it and why.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be an int >= 1; got {nprocs!r}.")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nprocs,
                          rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}",
                          run_id=f"ngra-{uuid.uuid4().hex[:8]}", max_restarts=0,
                          monitor_interval=monitor_interval, start_method="spawn")
    with _quiet_elastic(), tempfile.TemporaryDirectory(prefix="ngra-ranks-") as reports:
        try:
            results = elastic_launch(config, _worker)(fn, backend, timeout_s, threads, device,
                                                      reports, args)
        except ChildFailedError as exc:
            found = _read_reports(reports)
            for rank in sorted(found):
                log.info("rank %d failed:\n%s", rank, found[rank].get("traceback", ""))
            message = describe_failures(exc.failures, nprocs, found)
            raise DistributedError(message, cause=_cause_type(found)) from None
    return [results[r] for r in sorted(results)]


def _read_reports(folder: str) -> dict[int, dict[str, Any]]:
    out = {}
    for path in Path(folder).glob("rank*.json"):
        with contextlib.suppress(OSError, ValueError):
            report = json.loads(path.read_text())
            out[int(report["rank"])] = report
    return out


def describe_failures(failures: dict[int, Any], world_size: int,
                      reports: dict[int, dict[str, Any]] | None = None) -> str:
    """One message naming the rank that caused a failed run and its cause.

    ``failures`` maps global rank -> the launcher's ``ProcessFailure`` (``exitcode``,
    ``error_file``, ``message``, ``timestamp``); ``reports`` maps rank -> the error a
    rank wrote itself (``{"error": "Type: message", "time": t}``). The cause, in order:
    a rank ended by a signal; a rank whose error is not a peer-connection error (the
    earliest); a rank that failed without saying why; else the earliest failure.
    """
    reports = reports or {}
    causes: dict[int, tuple[str, str, float]] = {}
    for rank, f in failures.items():
        kind, text = _cause(f)
        pid = getattr(f, "pid", None)
        text = f"(pid {pid}) {text}" if pid else text
        causes[rank] = (kind, text, float(getattr(f, "timestamp", 0) or 0))
    for rank, rep in reports.items():
        text = str(rep.get("error", ""))
        kind = "peer" if _is_peer(text) else "error"
        if rank not in causes or causes[rank][0] in ("exit", "peer"):
            pid = f"(pid {rep['pid']}) " if rep.get("pid") else ""
            causes[rank] = (kind, f"{pid}failed: {text}", float(rep.get("time", 0)))
    if not causes:
        return f"a rank of {world_size} failed without a report."
    order = {"signal": 0, "error": 1, "exit": 2, "peer": 3}
    first = min(causes, key=lambda r: (order[causes[r][0]], causes[r][2], r))
    head = f"rank {first} of {world_size} {causes[first][1]}"
    if causes[first][0] == "peer":
        silent = sorted(set(range(world_size)) - set(reports))
        if silent:  # the peers lost a rank that never said why: it is the likely cause
            head = (f"rank {silent[0]} of {world_size} stopped without reporting an error "
                    f"(killed or crashed); rank {first} then {causes[first][1]}")
    others = sorted(r for r in causes if r != first)
    if others:
        head += (f"; rank{'s' if len(others) > 1 else ''} "
                 f"{', '.join(map(str, others))} then stopped")
    return head + "."


def _cause_type(reports: dict[int, dict[str, Any]]) -> str | None:
    """The exception type of the first rank that failed with an error of its own."""
    own = sorted((r.get("time", 0), str(r.get("error", ""))) for r in reports.values()
                 if not _is_peer(str(r.get("error", ""))))
    return own[0][1].split(":", 1)[0] if own else None


def _is_peer(text: str) -> bool:
    return any(p in text.lower() for p in _PEER_ERRORS)


def _cause(failure: Any) -> tuple[str, str]:
    """``(kind, text)``: kind is "signal", "error", "peer" (a peer's death seen as a
    connection error) or "exit"."""
    code = int(getattr(failure, "exitcode", 1) or 0)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return "signal", f"was killed by {name} (signal {-code})"
    message = _error_message(failure)
    if message and "pytorch.org/docs/stable/elastic/errors" not in message:
        kind = "peer" if _is_peer(message) else "error"
        return kind, f"failed: {message}"
    return "exit", (f"exited with code {code} before reporting an error (see its output; a "
                    "script that starts ranks needs `if __name__ == '__main__':`)")


def _error_message(failure: Any) -> str:
    """The exception line the rank's error file (torchelastic's ``record``) holds."""
    path = getattr(failure, "error_file", None)
    if path and os.path.isfile(path):
        try:
            data = json.loads(open(path, encoding="utf-8").read())
            msg = data.get("message", data)
            if isinstance(msg, dict):
                msg = msg.get("message", "")
            return str(msg).strip().splitlines()[-1] if str(msg).strip() else ""
        except (OSError, ValueError):
            pass
    msg = getattr(failure, "message", "")
    if isinstance(msg, dict):
        msg = msg.get("message", "")
    return str(msg or "").strip().splitlines()[-1] if str(msg or "").strip() else ""
