"""A rank's fixed cost (issue 41): a fresh process that imports, sets up and steps as a
rank does keeps out the modules it does not need (``torch._dynamo`` through
``torch.optim`` or a dispatch mode, matplotlib through ``ngra.cli``, DTensor through
``split_linears``, sympy through torch's shape checks, ``scipy.linalg`` through numba) and
peaks at most 10% above what it was measured at, counted from its ``import torch``; a
guard shows that sympy alone breaks both checks. A Cora rank, launched as
``ngra train --nprocs 2`` launches it, keeps them out too and peaks under the bound
``experiments/rank_fixed_cost.py`` measured, plus a margin (slow)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from ngra.distributed.link import calibrate
from ngra.training import TrainConfig
from ngra.training.ranks import prepare_shards

#: Modules a rank does not need, as the rank of the launched test reads them: sympy came
#: with the first step (torch.broadcast_shapes, torch.autograd.grad with grad_outputs),
#: scipy.linalg with numba's implementations (ngra.kernels.cpu.load_implementations)
CUT = ("torch._dynamo", "matplotlib", "torch.distributed.tensor", "sympy", "scipy.linalg")

#: A rank's imports and the pieces of its setup and step that loaded them, in a fresh
#: process: numba's implementations as a CPU rank loads them, then GCN and GAT (its
#: generic path: the compiler off) under a memory budget small enough to tile, whose
#: partial sums combine (ngra's gathers) and whose tiles' backward recomputes
#: (torch.autograd.grad with grad_outputs before ngra.kernels.lean). Prints which of the
#: modules in argv[1] it loaded, its RSS after ``import torch`` and its peak (VmHWM), in MB,
#: and whether numba compiled a kernel (its cache did not hold it: compiler memory, not a
#: rank's).
RANK_LIKE = """
import gc, json, sys
def hwm_mb():
    with open("/proc/self/status") as fh:
        return next(int(ln.split()[1]) for ln in fh if ln.startswith("VmHWM:")) / 1024
import torch
torch_mb = hwm_mb()
import ngra.cli  # a rank of the `ngra` console script imports it (spawn)
from ngra.distributed.dense import DenseLayout, split_linears
from ngra.training.optim import Adam
from ngra.training.ranks import run_rank  # noqa: F401
from ngra.kernels.cpu import load_implementations
import ngra
from ngra import compiler
from ngra.models import GATConv, GCNConv
load_implementations()
torch.manual_seed(0)
g = ngra.Graph.from_edge_index(torch.randint(0, 200, (2, 1600)), num_nodes=200).gcn_norm()
model = split_linears(torch.nn.Sequential(torch.nn.Linear(16, 16)), DenseLayout.of(2, None),
                      None)
layers = torch.nn.ModuleList([GCNConv(16, 16), GATConv(16, 4, heads=4)])
opt = Adam([*model.parameters(), *layers.parameters()], lr=0.01, weight_decay=5e-4)
x = torch.randn(200, 16)
for _ in range(2):
    opt.zero_grad()
    with ngra.memory_budget(64 * 1024):
        h = layers[0](g, model(x)).relu()
        with compiler.disabled():
            h = layers[1](g, h)
    h.square().sum().backward()
    opt.step()
opt.load_state_dict(opt.state_dict())
from numba.core.registry import CPUDispatcher
compiled = any(d.stats.cache_misses for d in gc.get_objects() if type(d) is CPUDispatcher)
print(json.dumps({"loaded": [m for m in json.loads(sys.argv[1]) if m in sys.modules],
                  "torch": torch_mb, "peak": hwm_mb(), "compiled": compiled}))
"""

#: :data:`RANK_LIKE` peaked 144 MB above its ``import torch`` (torch 2.13 on the CPU,
#: numba 0.63; 179 MB with sympy, 284 MB with torch.optim's torch._dynamo): the bound is
#: that + 10%, which sympy's 31 MB alone exceeds.
ABOVE_TORCH_BOUND_MB = 158

#: A Cora rank peaked at 378 MB (experiments/results/rank_fixed_cost.md, torch 2.13 on
#: the CPU); 560 MB before the cuts. The margin covers kernels compiled rather than read
#: from numba's cache (about 20 MB) and other torch builds.
PEAK_BOUND_MB = 378 + 25

#: The launching process: ``python -c`` (whose main ``spawn`` does not re-run), so a rank
#: holds what ``launch`` and the rank's function import and nothing of pytest.
LAUNCHER = """
import json, pickle, sys
sys.path.insert(0, sys.argv[1])
import fixed_cost_rank
from ngra.distributed import launch
cfg, folder = pickle.loads(bytes.fromhex(sys.argv[2]))
cut = json.loads(sys.argv[3])
print(json.dumps(launch(fixed_cost_rank.train_and_read, 2, cfg, folder, cut, threads=1)))
"""


def _rank_like(code: str = RANK_LIKE) -> dict:
    """:data:`RANK_LIKE`'s report, from a run whose kernels numba's cache held (a first
    run after a kernel changed compiles it, and LLVM's compiler memory stays: run again)."""
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code, json.dumps(CUT)],
                             capture_output=True, text=True, timeout=100, check=False)
        assert out.returncode == 0, out.stderr[-2000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        if not got["compiled"]:
            break
    return got


@pytest.mark.timeout(240)
def test_a_rank_s_setup_and_step_keep_out_what_it_does_not_need_and_peak_under_the_bound():
    got = _rank_like()
    assert got["loaded"] == []
    above = got["peak"] - got["torch"]
    assert above < ABOVE_TORCH_BOUND_MB, (
        f"a rank-like process peaked {above:.0f} MB above its `import torch` "
        f"({got['peak']:.0f} MB in all); the bound is {ABOVE_TORCH_BOUND_MB} MB")


@pytest.mark.timeout(240)
def test_the_guard_sees_sympy_come_back():
    # what torch.broadcast_shapes or torch.autograd.grad with grad_outputs import: both
    # checks above fail on it (torch.optim's torch._dynamo brings it too, and 100 MB more)
    got = _rank_like(RANK_LIKE.replace("load_implementations()\n", "load_implementations()\n"
                                       "import torch.fx.experimental.symbolic_shapes\n"))
    assert got["loaded"] == ["sympy"]
    assert got["peak"] - got["torch"] > ABOVE_TORCH_BOUND_MB


@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NGRA_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield str(shared_data)


@pytest.mark.slow  # a link calibration and a launch of 2 ranks: ~25 s quiet, 1 min loaded
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_cora_rank_keeps_out_what_it_does_not_need_and_peaks_under_the_bound(data):
    cfg = TrainConfig(model="gcn", dataset="cora", data_root=data, seed=0, progress=False,
                      nprocs=2, epochs=3, exchange="halo", threads=1)
    folder = str(prepare_shards(cfg))
    # a machine's first run calibrates the link, DTensor's cost too (imports DTensor and
    # torch._dynamo), and caches it: measured here once, as a later run finds it
    calibrate(2, refresh=False)
    here = str(Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", LAUNCHER, here,
                          pickle.dumps((cfg, folder)).hex(), json.dumps(CUT)],
                         capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    ranks = json.loads(out.stdout.strip().splitlines()[-1])
    assert [r["loaded"] for r in ranks] == [[], []], ranks
    peaks = [r["peak"] / 2**20 for r in ranks]
    assert max(peaks) < PEAK_BOUND_MB, (f"a Cora rank peaked at {max(peaks):.0f} MB; the "
                                        f"bound is {PEAK_BOUND_MB} MB")
