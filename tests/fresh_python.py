"""Run Python source in a fresh interpreter: what importing or running something loads,
without this test process's modules."""

from __future__ import annotations

import subprocess
import sys


def fresh_python(code: str, timeout: float = 120) -> str:
    """``code``'s stdout, stripped; fails the test with its stderr's end if it fails."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=timeout, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()
