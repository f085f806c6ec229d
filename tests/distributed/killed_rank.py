"""Kill one rank of a training run once it is under way (the killed-rank tests)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable


def kill_a_rank(cmd: list[str], checkpoint: Path, is_rank: Callable[[str], bool],
                env: dict[str, str] | None = None) -> tuple[Any, list[Any], int | None, str, float]:
    """Start ``cmd`` (a run that checkpoints to ``checkpoint`` every epoch), SIGKILL its
    last rank (a descendant whose command line ``is_rank``) once the first checkpoint is
    written, and wait for the run to end. Returns ``(victim, ranks, returncode, stderr,
    seconds from the kill to the end)``; the run is killed if it outlives 60 s."""
    import psutil  # the callers skip without it

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        deadline = time.monotonic() + 300
        while not (checkpoint / "checkpoint.pt").exists():  # training is under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        ranks = [p for p in psutil.Process(proc.pid).children(True)
                 if is_rank(" ".join(p.cmdline()))]
        assert len(ranks) == 2, [p.cmdline() for p in ranks]
        victim = ranks[-1]
        victim.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        return victim, ranks, proc.returncode, err, time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
