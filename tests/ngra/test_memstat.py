"""Peak-RSS readings belong to the measured process, not to its parent."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import ngra.memstat as memstat

MIB = 2**20

# The child loads memstat by path: importing the ngra package would pull in torch,
# whose own footprint would blur the numbers.
CHILD = textwrap.dedent(f"""
    import importlib.util, json
    spec = importlib.util.spec_from_file_location("memstat", {memstat.__file__!r})
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    start = m.peak_rss_bytes()
    block = bytearray(200 * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    grown = m.peak_rss_bytes()
    del block
    reset = m.reset_peak_rss()
    print(json.dumps(dict(start=start, grown=grown, reset=reset, after=m.peak_rss_bytes())))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux-only")
def test_child_peak_is_its_own_and_resets():
    parent = bytearray(600 * MIB)  # the parent's peak must not leak into the child's
    for i in range(0, len(parent), 4096):
        parent[i] = 1
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         check=True, timeout=60)
    got = json.loads(out.stdout)
    del parent
    assert got["start"] < 100 * MIB, got  # a bare interpreter, not the 600 MiB parent
    assert got["grown"] >= got["start"] + 190 * MIB, got
    if got["reset"]:
        assert got["after"] < got["grown"] - 150 * MIB, got


def test_rss_readings_are_consistent():
    assert 0 < memstat.rss_bytes() <= memstat.peak_rss_bytes()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_release_large_frees_only_lowers_its_threshold():
    """A rank maps from 8 MiB; a memory budget entered later asks for 1 MiB and gets it;
    asking for 8 MiB again keeps 1 MiB (a fresh process: mallopt is process-wide)."""
    child = textwrap.dedent(f"""
        import importlib.util, json
        spec = importlib.util.spec_from_file_location("memstat", {memstat.__file__!r})
        m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
        seen = []
        for mib in (8, 1, 8):
            seen.append([m.release_large_frees(mib * 2**20), m.mapped_from() // 2**20])
        print(json.dumps(seen))
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert json.loads(out) == [[True, 8], [True, 1], [True, 1]]
