"""LiveTensors: every storage an op makes is counted until its last reference goes."""

from __future__ import annotations

import torch
from fresh_python import fresh_python

from ngra.livetensors import LiveTensors, step_peak

MIB = 2**20


def test_counts_allocations_until_freed_and_keeps_the_peak():
    with LiveTensors() as live:
        a = torch.empty(MIB // 4)  # 1 MiB
        b = a * 2  # 1 MiB more
        view = b[10:]  # a view: no new storage
        del b
        assert live.current_bytes == 2 * MIB  # the view keeps b's storage
        del view
        assert live.current_bytes == MIB
        del a
    assert live.current_bytes == 0
    assert live.peak_bytes == 2 * MIB
    ops = sorted(s.op for s in live.at_peak)
    assert ops == ["empty", "mul"]
    assert all("test_livetensors.py" in s.site for s in live.at_peak)


def test_step_peak_counts_what_the_closure_holds_before_it():
    weight = torch.zeros(MIB // 4)  # 1 MiB the step's closure reaches
    model = torch.nn.Linear(256, 256)  # its parameters too

    def step():
        (weight + 1).sum()

    live = step_peak(step, model)
    params = sum(p.nbytes for p in model.parameters())
    assert live.resident_bytes == MIB + params
    assert live.peak_bytes == 2 * MIB + params + 4  # the temporary and its float sum
    split = live.peak_split(num_nodes=MIB // 4, num_edges=0)
    assert split["vertex"] == 2 * MIB and split["other"] == params + 4


def test_other_devices_are_not_counted():
    with LiveTensors("cuda") as live:
        torch.empty(1000)
    assert live.peak_bytes == 0


def test_counting_does_not_import_dynamo():
    """A dispatch mode's first call would import torch._dynamo (130 MB of the process's
    peak) unless the mode opts out (LeanDispatchMode)."""
    code = ("import sys, torch\n"
            "from ngra.livetensors import LiveTensors\n"
            "with LiveTensors() as live:\n"
            "    y = torch.ones(1000) * 2\n"
            "assert live.peak_bytes >= 4000, live.peak_bytes\n"
            "print('torch._dynamo' in sys.modules)\n")
    assert fresh_python(code) == "False"
