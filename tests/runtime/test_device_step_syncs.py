"""The device-resident training step reads nothing on the host once warm.

On CUDA every ``.item()``, ``int(t)``, ``bool(t)``, ``.tolist()``, ``.cpu()``, boolean-mask
index or tensor made from host data in a step waits for the device to drain its queue, and
a CUDA graph cannot hold it (:mod:`ngra.runtime.cuda_graph`). Without a GPU the same code
runs here: the gpu backend's kernels on CPU tensors in Triton's interpreter, while a
``TorchFunctionMode`` records every such call that ngra's own code (``ngra/``,
``kernels/``) makes, with where it was made. The first step may read (Triton compiles,
checks scan a tensor once, caches fill); the second must not.

Torch's non-capturable Adam reads its step count on the host (``_get_value``), which is
why training that captures its step builds Adam with ``capturable=True``; this test's
optimizer is torch's and is not ngra's code, so its reads are not counted here.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from ngra import kernels
from ngra.characterize.workloads import build_ngra, prepare_workload
from ngra.datasets import load
from ngra.training.loop import Session, _device_step

REPO = Path(__file__).resolve().parents[2]
OURS = (str(REPO / "ngra") + "/", str(REPO / "kernels") + "/")
#: calls that read a device tensor on the host, or wait for the device
HOST_READS = {"item", "__bool__", "__int__", "__float__", "__index__", "tolist", "cpu", "numpy",
              "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive",
              "bincount", "repeat_interleave"}
#: make a tensor from host data (on CUDA: a pageable copy the host waits for)
FROM_HOST = {"tensor", "as_tensor"}


class HostReads(TorchFunctionMode):
    """Records ``(call, file:line (function))`` of every host read ngra's code makes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self._is_read(name, args, kwargs):
            # made by ngra's code itself: not by torch's optimizer, nor by Triton's
            # interpreter copying kernel arguments
            caller = traceback.extract_stack(limit=2)[0]
            if caller.filename.startswith(OURS):
                where = f"{Path(caller.filename).relative_to(REPO)}:{caller.lineno} ({caller.name})"
                self.calls.append((name, where))
        return func(*args, **kwargs)

    @staticmethod
    def _is_read(name, args, kwargs) -> bool:
        if name in HOST_READS:
            return True
        if name in FROM_HOST:
            return bool(args) and not isinstance(args[0], torch.Tensor)
        if name == "__getitem__" and len(args) > 1:
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
        if name == "to":  # to the host
            dev = kwargs.get("device", args[1] if len(args) > 1 else None)
            return isinstance(dev, (str, torch.device)) and torch.device(dev).type == "cpu" \
                and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu"
        return False


@pytest.fixture(scope="module")
def dataset():
    return load("rmat:scale=6,edge_factor=4,feat=8,classes=4,seed=0", progress=False)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_second_training_step_reads_nothing_on_the_host(dataset, model):
    """Two steps of fit's device step (capturable Adam aside) with dropout, and GAT's
    attention dropout, on: the second makes no host read in ngra's code."""
    w = prepare_workload(dataset, model, hidden=16, heads=2)
    torch.manual_seed(0)
    net = build_ngra(w, dropout=0.5, attention_dropout=0.5 if model == "gat" else 0.0)
    masks = {"train": w.train_mask}
    s = Session(net, w.graph, w.x, w.edge_data, w.y, masks, None, w.num_nodes, w.num_edges)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    step = _device_step(s, opt)
    with kernels.use_backend("gpu"):
        net.train()
        first = step()
        reads = HostReads()
        with reads:
            second = step()
    assert reads.calls == [], "host reads in the steady-state step:\n" + "\n".join(
        f"  {name} at {where}" for name, where in reads.calls)
    assert first.shape == second.shape == (5,) and bool(second[1:].all())  # finite flags


def test_the_recorder_sees_what_it_must():
    """The recorder itself: ngra's host reads are caught, with where; others' are not."""
    from ngra.kernels.dropout import draw_seeds

    x = torch.randn(4, 3)
    with HostReads() as reads:
        draw_seeds(0.5)  # host seeds: int() of a drawn tensor, twice
        draw_seeds(0.5, torch.device("cpu"))  # device seeds: no read
        x[x > 0]  # the test's own code: not ngra's, not recorded
    assert [name for name, _ in reads.calls] == ["__int__", "__int__"]
    assert all("kernels/dropout.py" in where for _, where in reads.calls)
