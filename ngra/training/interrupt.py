"""Interrupted runs: ``SIGTERM`` handled like ``SIGINT``, and the line that says where to resume.

Inside :func:`interruptible`, ``SIGINT`` (Ctrl-C) and ``SIGTERM`` (``kill``, a batch
scheduler's stop) raise :class:`Interrupted` in the main thread. It derives from
``KeyboardInterrupt``, so the clean-ups written for Ctrl-C run for both: a checkpoint
being written is removed (the previous one stays the newest), a cache entry being built
is discarded. With ``--nprocs K`` torch's elastic launcher takes the signals over while
its ranks run (it stops them and raises its ``SignalException``): that becomes
:class:`Interrupted` too. ``ngra`` then exits with ``128 + signal`` (130, 143) and one line from
:func:`interrupted_line` naming the last complete checkpoint and the command that resumes
from it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import SignalException

from ngra.errors import CheckpointError
from ngra.training.checkpoint import CHECKPOINT_NAME, PREVIOUS_NAME, load_checkpoint

__all__ = ["Interrupted", "interruptible", "interrupted_line", "last_checkpoint",
           "resume_note"]


class Interrupted(KeyboardInterrupt):
    """The run got ``SIGINT`` or ``SIGTERM``.

    Attributes:
        signum: the signal's number.
        exit_code: ``128 + signum`` (130 for SIGINT, 143 for SIGTERM), as a shell reports it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


def _raise(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """``SIGINT`` and ``SIGTERM`` raise :class:`Interrupted` inside the block (in the main
    thread; elsewhere the block runs with the handlers as they are)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGINT, signal.SIGTERM)
    before = {s: signal.getsignal(s) for s in sigs}
    for s in sigs:
        signal.signal(s, _raise)
    try:
        yield
    except SignalException as exc:  # the launcher stopped the ranks on this signal
        raise Interrupted(int(exc.sigval)) from None
    finally:
        for s, h in before.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


def last_checkpoint(folder: str | Path | None) -> tuple[Path, int] | None:
    """``(path, epoch)`` of the newest intact checkpoint under ``folder`` (``None``: none)."""
    if folder is None or not Path(folder).is_dir():
        return None
    found = []
    for name in (CHECKPOINT_NAME, PREVIOUS_NAME):
        for p in Path(folder).rglob(name):
            try:
                found.append((p.stat().st_mtime_ns, p))
            except OSError:
                continue
    for _, p in sorted(found, reverse=True):
        try:
            return p, int(load_checkpoint(p, ("epoch",))["epoch"])
        except (CheckpointError, OSError, ValueError, TypeError):
            continue
    return None


def interrupted_line(exc: Interrupted, command: str, checkpoint: str | None,
                     argv: Sequence[str]) -> str:
    """The one line ``ngra`` prints when ``exc`` stopped ``command``."""
    head = f"ngra {command}: interrupted by {signal.Signals(exc.signum).name}"
    if command != "train":
        return head + "."
    return head + "; " + resume_note(checkpoint, argv)


def resume_note(checkpoint: str | None, argv: Sequence[str]) -> str:
    """Where a stopped ``ngra train`` (``argv``, its ``--checkpoint`` folder ``checkpoint``)
    can resume from: the last complete checkpoint and the command, or why there is none."""
    if checkpoint is None:
        return "no checkpoint was written (add --checkpoint DIR to make a run resumable)."
    last = last_checkpoint(checkpoint)
    if last is None:
        return f"no complete checkpoint in {checkpoint} yet (nothing to resume from)."
    args = list(argv) + ([] if "--resume" in argv else ["--resume"])
    return (f"the last complete checkpoint is {last[0]} (epoch {last[1]}); resume "
            f"with: ngra {' '.join(args)}")
