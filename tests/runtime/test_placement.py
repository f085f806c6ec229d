"""--device and the device-memory placement: resident when the run fits the device's
memory, streaming within a device-sized budget when it does not; clear errors without
CUDA. The decision takes the device memory as a number, so it is checked here on CPU."""

from __future__ import annotations

import pytest
import torch

from ngra import Graph
from ngra.cli import main
from ngra.models import build_model
from ngra.runtime import placement as pl

CUDA = torch.device("cuda", 0)
MIB = 2**20


def _run_parts(n=1000, e=16000, feat=64):
    gen = torch.Generator().manual_seed(0)
    graph = Graph.from_edge_index(torch.randint(0, n, (2, e), generator=gen), num_nodes=n)
    x = torch.randn(n, feat, generator=gen)
    model = build_model("gcn", feat, 8, hidden=64)
    return graph, x, model


def test_resident_bytes_counts_graph_features_activations_and_parameters():
    graph, x, model = _run_parts()
    need = pl.resident_bytes(graph, x, model)
    params = sum(p.numel() * 4 for p in model.parameters())
    floor = x.numel() * 4 + 2 * graph.num_edges * 8 + pl.PARAM_COPIES * params
    assert floor < need < 64 * MIB
    # more vertices or wider features need more
    g2, x2, m2 = _run_parts(n=4000, e=64000)
    assert pl.resident_bytes(g2, x2, m2) > 3 * need
    assert pl.resident_bytes(graph, x, model, extra=10 * MIB) == need + 10 * MIB


def test_resident_bytes_of_factored_weights_makes_no_edge_array():
    """GCN's graph keeps its normalization as two [N] factors; sizing it must not build
    the [E] weights (nor cache the [E] destination ids they are gathered with)."""
    graph, x, model = _run_parts()
    norm = graph.gcn_norm(add_self_loops=True, order="csc")
    need = pl.resident_bytes(norm, x, model)
    assert "dst" not in norm._cache
    assert need < pl.resident_bytes(graph, x, model) + 4 * norm.num_nodes * 8 + MIB


@pytest.mark.parametrize("free_mib,budget_mib,resident,want_budget_mib", [
    (80_000, None, True, None),          # fits an H100: resident, 1 x 1 grid
    (4, None, False, 4 * 0.85),          # too small: stream within the usable device memory
    (80_000, 2, False, 2),               # a --memory-budget below the need streams within it
    (80_000, 4_000, True, 4_000),        # a budget that fits stays resident (and a budget)
])
def test_placement_follows_the_device_memory(free_mib, budget_mib, resident, want_budget_mib):
    graph, x, model = _run_parts()
    need = pl.resident_bytes(graph, x, model)
    assert 4 * 0.85 * MIB < need < 4000 * MIB
    got = pl.plan_placement(CUDA, need, device_bytes=free_mib * MIB,
                            budget=None if budget_mib is None else budget_mib * MIB)
    assert got.resident is resident
    if want_budget_mib is None:
        assert got.budget is None
    else:
        assert got.budget == pytest.approx(want_budget_mib * MIB, rel=1e-6)
    assert ("device-resident" if resident else "streaming") in got.describe()


def test_cpu_placement_is_host_memory():
    got = pl.plan_placement(torch.device("cpu"), 123, budget=1 << 30)
    assert got.resident and got.budget == 1 << 30 and "cpu" in got.describe()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_absent_is_a_clear_error(name):
    with pytest.raises(ValueError, match="CUDA is not available.*Use --device cpu"):
        pl.resolve_device(name)


@pytest.mark.parametrize("name", ["tpu", "gpu0", "mps"])
def test_unknown_device_names(name):
    with pytest.raises(ValueError, match="--device must be cpu, cuda or cuda:N"):
        pl.resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
@pytest.mark.parametrize("command", ["train", "explain"])
def test_cli_device_cuda_without_cuda(command, capsys):
    assert main([command, "--model", "gcn", "--dataset", "sbm:nodes=200", "--device",
                 "cuda"] + (["--epochs", "1", "--no-progress"] if command == "train" else [])) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_train_on_cpu_reports_its_placement(tmp_path):
    from ngra.training import TrainConfig
    from ngra.training.run import train

    s = train(TrainConfig(model="gcn", dataset="sbm:nodes=200", epochs=2, progress=False,
                          device="cpu"))
    assert s["device"] == "cpu" and s["placement"].startswith("cpu")
    assert s["config"]["device"] == "cpu"


def test_graph_to_moves_arrays_and_reverse_csr():
    graph, _, _ = _run_parts(n=20, e=50)
    assert graph.to("cpu") is graph
    csr = graph.csr()
    meta = graph.to("meta")
    assert meta.indptr.device.type == "meta" and meta.num_nodes == graph.num_nodes
    assert meta.csr().indices.device.type == "meta" and csr.indices.device.type == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_resident_training_on_cuda_keeps_everything_on_the_device():
    from ngra.training import TrainConfig
    from ngra.training.run import train

    s = train(TrainConfig(model="gat", dataset="sbm:nodes=500", epochs=3, progress=False,
                          device="cuda"))
    assert "device-resident" in s["placement"] and s["peak_device_mb"] > 0
