"""GraphedStep's life cycle, on a stand-in for ``torch.cuda`` (no GPU here): warm-up calls
eager on a side stream, the last one watched, then one capture and replays; refusals
known beforehand, found in the warm-up (a host sync, host-drawn dropout seeds) or raised
by the capture itself leave the step eager with the reason, or raise under ``strict``.
What replay does on a real device is the GPU check's (experiments/gpu_bench.py)."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from ngra.kernels.dropout import draw_seeds
from ngra.runtime import cuda_graph
from ngra.runtime.cuda_graph import (CAPTURED, GraphedStep, capture_refusal, host_syncs,
                                     optimizer_refusal)
from ngra.runtime.placement import Placement

DEV = torch.device("cuda", 0)
SYNC_WARNING = "called a synchronizing CUDA operation"


class FakeCuda:
    """The ``torch.cuda`` calls GraphedStep makes. A capture runs the step once with
    ``capturing`` set (as the real one records it) and keeps it; replay runs it again."""

    def __init__(self, fail_capture: bool = False) -> None:
        self.mode, self.capturing, self.fail_capture = 0, False, fail_capture
        self.streams: list[str] = []
        self.replays = 0

    def install(self, monkeypatch) -> None:
        fake = self

        class Stream:
            def __init__(self, device=None):
                self.name = "side"

            def wait_stream(self, other):
                pass

        class CUDAGraph:
            def __init__(self):
                self.step = None

            def replay(self):
                fake.replays += 1
                self.step()

        @contextlib.contextmanager
        def stream(s):
            fake.streams.append(s.name)
            yield

        @contextlib.contextmanager
        def graph(g):
            fake.capturing = True
            try:
                yield
            finally:
                fake.capturing = False
            if fake.fail_capture:
                raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
            g.step = fake.captured_step

        for name, value in {
            "Stream": Stream, "CUDAGraph": CUDAGraph, "stream": stream, "graph": graph,
            "current_stream": lambda device=None: Stream(), "device": lambda d: contextlib.nullcontext(),
            "synchronize": lambda device=None: None, "empty_cache": lambda: None,
            "get_sync_debug_mode": lambda: fake.mode,
            "set_sync_debug_mode": lambda m: setattr(fake, "mode", m),
        }.items():
            monkeypatch.setattr(torch.cuda, name, value, raising=False)


class Step:
    """A step that counts its eager runs and can sync or draw host seeds."""

    def __init__(self, cuda: FakeCuda, sync: bool = False, host_seeds: bool = False) -> None:
        self.cuda, self.sync, self.host_seeds = cuda, sync, host_seeds
        self.out = torch.zeros(())
        self.runs = 0
        cuda.captured_step = self

    def __call__(self) -> torch.Tensor:
        self.runs += 1
        self.out += 1
        if self.sync and self.cuda.mode == "warn":
            warnings.warn(SYNC_WARNING)
        if self.host_seeds:
            draw_seeds(0.5)
        return self.out


@pytest.fixture
def cuda(monkeypatch):
    fake = FakeCuda()
    fake.install(monkeypatch)
    return fake


def test_warms_up_captures_once_then_replays(cuda):
    step = Step(cuda)
    g = GraphedStep(step, DEV, warmup=2)
    assert g.describe().startswith("not captured: the run ended within its 2")
    outs = [float(g()) for _ in range(5)]
    assert g.status == CAPTURED and g.describe() == CAPTURED
    # 2 eager warm-ups (side stream), 1 capture recording, then each call 1 replay
    assert cuda.streams == ["side", "side"] and cuda.replays == 3 and step.runs == 2 + 1 + 3
    assert outs == [1.0, 2.0, 4.0, 5.0, 6.0]  # the recording itself updates nothing real
    assert cuda.mode == 0  # sync debug mode restored after the watched warm-up


def test_known_refusal_runs_every_call_eagerly(cuda):
    step = Step(cuda)
    g = GraphedStep(step, DEV, refusal="not a CUDA device (cpu)")
    for _ in range(4):
        g()
    assert step.runs == 4 and cuda.replays == 0 and g.describe() == "not a CUDA device (cpu)"


@pytest.mark.parametrize("strict", [False, True])
def test_a_host_sync_in_warmup_refuses_capture(cuda, strict, caplog):
    step = Step(cuda, sync=True)
    g = GraphedStep(step, DEV, warmup=1, strict=strict)
    if strict:
        with pytest.raises(RuntimeError, match="--cuda-graphs on.*synchronizes with the host"):
            g()
        return
    for _ in range(3):
        g()
    assert g.status.startswith("the step synchronizes with the host (1 time(s)")
    assert SYNC_WARNING in g.status and cuda.replays == 0 and step.runs == 3
    assert "runs eagerly" in caplog.text


def test_host_drawn_dropout_seeds_refuse_capture(cuda):
    step = Step(cuda, host_seeds=True)
    g = GraphedStep(step, DEV, warmup=1)
    g()
    g()
    assert g.status.startswith("ngra dropout drew its seeds on the host (1 draw(s), p = 0.5)")
    assert cuda.replays == 0


def test_failed_capture_falls_back_to_eager(monkeypatch):
    cuda = FakeCuda(fail_capture=True)
    cuda.install(monkeypatch)
    step = Step(cuda)
    g = GraphedStep(step, DEV, warmup=1)
    outs = [float(g()) for _ in range(3)]
    assert g.status.startswith("capture failed: RuntimeError: CUDA error: operation not permitted")
    # warm-up, the (discarded) recording, the same call run eagerly, one more eager call
    assert step.runs == 4 and cuda.replays == 0 and outs == [1.0, 3.0, 4.0]


def test_warmup_must_be_positive():
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        GraphedStep(lambda: torch.zeros(()), DEV, warmup=0)


def test_capture_refusal_names_the_reason():
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert capture_refusal(torch.device("cpu")) == "not a CUDA device (cpu)"
    streaming = Placement(DEV, False, 1 << 30, 2 << 30, 1 << 30)
    assert capture_refusal(DEV, streaming).startswith("streaming placement")
    budget = Placement(DEV, True, 512 << 20, 1 << 20, 512 << 20)
    assert capture_refusal(DEV, budget).startswith("a memory budget (512 MiB)")
    resident = Placement(DEV, True, None, 1 << 20, 1 << 30)
    assert capture_refusal(DEV, resident, torch.optim.Adam(p, capturable=True)) is None
    assert capture_refusal(DEV, resident, torch.optim.Adam(p)) == \
        "optimizer Adam was built without capturable=True"
    assert optimizer_refusal(torch.optim.SGD(p, lr=0.1)) == "optimizer SGD has no capturable mode"
    assert cuda_graph.MODES == ("auto", "on", "off")


def test_train_config_and_summary():
    """``--cuda-graphs``: validated before any data is loaded; the summary says why a CPU
    run's step is not captured, or that capture is off."""
    from ngra.training.config import TrainConfig, check_config
    from ngra.training.run import train

    with pytest.raises(ValueError, match="--cuda-graphs must be one of"):
        check_config(TrainConfig(cuda_graphs="yes"))
    with pytest.raises(ValueError, match="--cuda-graphs on captures.*runs on the CPU"):
        check_config(TrainConfig(cuda_graphs="on"))
    with pytest.raises(ValueError, match="--memory-budget"):
        check_config(TrainConfig(cuda_graphs="on", device="cuda", memory_budget="1GB"))
    spec = "rmat:scale=6,edge_factor=4,feat=8,classes=4,seed=0"
    for mode, want in (("auto", "not a CUDA device (cpu)"), ("off", "off (--cuda-graphs off)")):
        summary = train(TrainConfig(model="gcn", dataset=spec, epochs=2, progress=False,
                                    cuda_graphs=mode))
        assert summary["cuda_graph"] == want and summary["config"]["cuda_graphs"] == mode


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_training_matches_eager_on_cuda():
    """On a GPU: GAT trained with its step replayed from a CUDA graph (``on``: a refusal
    fails the test with its reason) has the eager run's losses, epoch by epoch (no
    dropout: the same arithmetic); with the zoo's dropouts it captures and trains."""
    from ngra.training import TrainConfig
    from ngra.training.run import train

    def run(mode: str, **kw):
        return train(TrainConfig(model="gat", dataset="sbm:nodes=500", epochs=6,
                                 progress=False, device="cuda", cuda_graphs=mode, **kw))

    plain = {"dropout": 0.0, "attention_dropout": 0.0}
    eager, graphed = run("off", **plain), run("on", **plain)
    assert eager["cuda_graph"] == "off (--cuda-graphs off)" and graphed["cuda_graph"] == CAPTURED
    want = [h["loss"] for h in eager["history"]]
    got = [h["loss"] for h in graphed["history"]]
    assert got == pytest.approx(want, rel=1e-3)
    dropped = run("auto")
    losses = [h["loss"] for h in dropped["history"]]
    assert dropped["cuda_graph"] == CAPTURED and all(torch.isfinite(torch.tensor(losses)))
    assert len(set(losses[3:])) == len(losses[3:])  # replays draw fresh masks and train


def test_sync_debug_modes_own_notice_is_not_a_host_synchronization():
    # torch 2.11 warns once a process when sync debug mode is turned on; on an H200 that
    # notice, caught in the first model's warm-up, refused the capture of a step with no sync
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("Synchronization debug mode is a prototype feature and does not yet "
                      "detect all synchronizing operations (Triggered internally at ...)")
        warnings.warn("called a synchronizing CUDA operation\nmore lines")
        warnings.warn("something else")
    assert host_syncs(caught) == ["called a synchronizing CUDA operation"]
