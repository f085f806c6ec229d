"""Evaluation is deterministic on the CPU: every zoo model, called again and again in eval
mode on the same input, gives the same bits, on 1 and 2 threads, with and without grad,
whole-graph or tiled under a memory budget; and a model rebuilt from its saved state_dict
gives the bits the saved one gave.

The inputs are what makes evaluation take different paths on different calls: bag-of-words
features (mostly zero, over 1 MiB), which the first Linear multiplies over their non-zeros
(:mod:`ngra.kernels.sparse_input`: a scan at the first call, a CSR copy from the second),
and a fresh tensor in each test, so that its first call is a first sight.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

import ngra
from ngra.models import MODELS, build_model, prepare
from ngra.probes import Recorder
from ngra.runtime.budget import grid_shape

N, F, CLASSES, TYPES = 600, 512, 4, 3  # 600 x 512 float32: 1.2 MiB
CALLS = 4
BUDGET = "1MB"


def _graph_and_inputs(seed: int = 0, n: int = N, f: int = F):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (6 * n,), generator=gen)
    dst = torch.randint(0, n, (6 * n,), generator=gen)
    hub = torch.arange(n)  # a hub with every vertex as in-neighbour: a skewed degree
    graph = ngra.Graph.from_edge_index(torch.stack([torch.cat([src, hub]),
                                                    torch.cat([dst, torch.zeros_like(hub)])]),
                                       num_nodes=n)
    x = torch.rand(n, f, generator=gen) * (torch.rand(n, f, generator=gen) < 0.02)
    edge_type = torch.randint(0, TYPES, (graph.num_edges,), generator=gen)
    return graph, x, edge_type


def _model(name: str, seed: int = 0, f: int = F):
    torch.manual_seed(seed)
    return build_model(name, f, CLASSES, num_edge_types=TYPES).eval()


def _calls(model, graph, x, edge_data, grad: bool, budget: str | None, n: int = CALLS,
           grid: tuple[int, int] | None = None):
    outs = []
    for _ in range(n):
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.enable_grad() if grad else torch.no_grad())
            if budget is not None:
                stack.enter_context(ngra.memory_budget(budget))
            if grid is not None:
                stack.enter_context(grid_shape(*grid))
            outs.append(model(graph, x, edge_data).detach())
    return outs


def _distinct(outs) -> int:
    seen: list[torch.Tensor] = []
    for o in outs:
        if not any(torch.equal(o, s) for s in seen):
            seen.append(o)
    return len(seen)


@pytest.fixture
def threads_on_small_graphs(monkeypatch):
    """``set(threads)``: that many torch threads, and the numba kernels split even these
    small graphs' rows over them (they run below ~1 MiB of work on one thread)."""
    cpu_util = pytest.importorskip("ngra.kernels.cpu.util")

    def set_threads(threads: int) -> None:
        torch.set_num_threads(threads)
        monkeypatch.setattr(cpu_util, "_MIN_PARALLEL_BYTES", 0)

    return set_threads


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", list(MODELS))
def test_repeated_eval_calls_are_bit_identical(name, threads, grad, threads_on_small_graphs):
    threads_on_small_graphs(threads)
    graph, x, edge_type = _graph_and_inputs()
    g, edge_data = prepare(name, graph, edge_type, TYPES)
    outs = _calls(_model(name), g, x, edge_data, grad, None)
    assert _distinct(outs) == 1, f"{name}: {_distinct(outs)} distinct outputs in {CALLS} calls"


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", list(MODELS))
def test_repeated_eval_calls_on_tiles_under_a_budget_are_bit_identical(
        name, threads, threads_on_small_graphs):
    """A 3 x 2 grid (this small graph fits the budget whole; the grid forces the tiled
    walk a larger graph takes)."""
    threads_on_small_graphs(threads)
    graph, x, edge_type = _graph_and_inputs(seed=1)
    g, edge_data = prepare(name, graph, edge_type, TYPES)
    outs = _calls(_model(name), g, x, edge_data, False, BUDGET, grid=(3, 2))
    assert _distinct(outs) == 1, f"{name}: {_distinct(outs)} distinct outputs in {CALLS} calls"


def test_a_budget_that_tiles_gives_the_same_bits_every_call():
    """The grid the budget picks by measuring a sample tile (its choice cached on the
    graph after the first call) walks the same order every call."""
    name, n, f = "ggnn", 2000, 160  # 1.2 MiB of features; 256 KB tiles GG-NN's edge stage
    graph, x, edge_type = _graph_and_inputs(seed=3, n=n, f=f)
    g, edge_data = prepare(name, graph, edge_type, TYPES)
    with Recorder() as rec:
        outs = _calls(_model(name, f=f), g, x, edge_data, False, "256KB", n=3)
    assert any(c.num_dst_parts * c.num_src_parts > 1 for c in rec.notes["grid"]), "no tiling"
    assert _distinct(outs) == 1, f"{name}: {_distinct(outs)} distinct outputs in 3 calls"


@pytest.mark.parametrize("name", list(MODELS))
def test_a_state_dict_round_trip_gives_the_same_bits(name):
    graph, x, edge_type = _graph_and_inputs(seed=2)
    g, edge_data = prepare(name, graph, edge_type, TYPES)
    model = _model(name, seed=0)
    (want,) = _calls(model, g, x, edge_data, False, None, n=1)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    again = _model(name, seed=1)  # other initial weights, replaced by the saved ones
    again.load_state_dict(torch.load(buf, weights_only=True))
    (got,) = _calls(again, g, x, edge_data, False, None, n=1)
    assert torch.equal(got, want)
