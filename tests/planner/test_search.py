"""The DP search against exhaustive enumeration, the ranked output, and bad input."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from ngra.planner import (
    Chain, Devices, Layer, NoFeasiblePlan, ParallelPlan, Shape, evaluate, exhaustive, load_plans,
    search,
)
from ngra.planner.search import shapes

from planner_cases import make_link, random_chain


def _by_shape(plans):
    return {p.shape: p.predicted_time_s for p in plans}


@pytest.mark.parametrize("seed", range(40))
def test_dp_equals_exhaustive_on_random_chains(seed):
    rnd = random.Random(seed)
    k = rnd.choice([1, 2, 4])
    chain = random_chain(rnd, rnd.randint(1, 4))
    devices = Devices(k, rnd.choice([1e12, 2e8, 5e7, 1e7]), make_link(k, rnd=rnd))
    try:
        dp = search(chain, devices)
    except NoFeasiblePlan as exc:
        with pytest.raises(NoFeasiblePlan) as oracle:
            exhaustive(chain, devices)
        assert oracle.value.min_memory_bytes == pytest.approx(exc.min_memory_bytes)
        return
    best = exhaustive(chain, devices)
    got, want = _by_shape(dp), _by_shape(best)
    assert got.keys() == want.keys()
    for shape in want:
        assert got[shape] == pytest.approx(want[shape], rel=1e-9), shape
    assert [p.predicted_time_s for p in dp] == sorted(p.predicted_time_s for p in dp)
    for p in dp:  # what the DP returns is what evaluating its choices gives
        again = evaluate(chain, devices, p.shape,
                         [(s.start, s.stop, s.configs, s.recompute) for s in p.stages])
        assert again.predicted_time_s == pytest.approx(p.predicted_time_s, rel=1e-9)
        assert p.peak_memory_bytes <= devices.memory_bytes


def test_plans_are_json_and_sorted(tmp_path):
    rnd = random.Random(7)
    chain = random_chain(rnd, 6)
    plans = search(chain, Devices(4, 1e12, make_link(4)))
    path = tmp_path / "plans.json"
    path.write_text(json.dumps({"plans": [p.to_json() for p in plans]}))
    back = load_plans(json.loads(path.read_text()))
    assert back == plans
    assert all(isinstance(p, ParallelPlan) for p in back)
    top = plans[0]
    assert top.breakdown.total == pytest.approx(top.predicted_time_s)
    assert len(top.memory_per_device) == 4
    assert {"label", "configs", "predicted_time_s"} <= set(top.record())


def test_a_graph_chain_is_neither_pipelined_nor_micro_batched(link):
    layers = (Layer("w", "linear", 64, 64, param_bytes=4 * 64 * 64, saved_width=64,
                    splits=("col", "row"), module="w"),
              Layer("g", "graph", 64, 64, edges=5000, read_width=64, exchange_width=64),
              Layer("v", "linear", 64, 8, param_bytes=4 * 64 * 8, saved_width=64))
    chain = Chain("gnn", layers, 1000, 64, halo=((2, 100), (4, 200)))
    got = shapes(chain, Devices(4, 1e12, link))
    assert {s.pipeline for s in got} == {1} and {s.micro_batches for s in got} == {1}
    assert {(s.data, s.tensor) for s in got} == {(1, 4), (2, 2), (4, 1)}


def test_the_exchange_changes_the_pick():
    # a narrow network on a graph: DP splits the work; a halo of every row makes its
    # exchange cost more than the work it saves, and replication (tensor degree) wins
    link = dataclasses.replace(make_link(4, 1e-5, 1e-9), gemm_flops=1e12, gather_bytes=1e11)
    layers = (Layer("w", "linear", 256, 256, param_bytes=4 * 256 * 256, saved_width=256),
              Layer("g", "graph", 256, 256, edges=40_000, read_width=256, exchange_width=256),
              Layer("v", "linear", 256, 16, param_bytes=4 * 256 * 16, saved_width=256))
    small = Chain("gnn", layers, 20_000, 256, halo=((2, 100), (4, 100)))
    large = Chain("gnn", layers, 20_000, 256, halo=((2, 20_000), (4, 20_000)))
    devices = Devices(4, 1e12, link)
    assert search(small, devices)[0].data == 4
    assert search(large, devices)[0].data == 1


def test_no_feasible_plan_names_the_memory_that_would_fit(link):
    chain = Chain("big", (Layer("w", "linear", 4096, 4096, param_bytes=4 * 4096 * 4096,
                                saved_width=4096, splits=("col", "row"), module="w"),), 64, 4096)
    with pytest.raises(NoFeasiblePlan) as err:
        search(chain, Devices(2, 50e6, link))
    need = err.value.min_memory_bytes
    assert f"{need / 2**20:,.1f} MiB per device" in str(err.value)
    assert "tensor 2" in str(err.value)  # splitting the weight is what fits best
    plans = search(chain, Devices(2, need, link))
    assert min(p.peak_memory_bytes for p in plans) == pytest.approx(need)


@pytest.mark.parametrize("count", [0, -1, 1.5, True])
def test_bad_device_counts(link, count):
    with pytest.raises(ValueError, match="devices must be an int >= 1"):
        Devices(count, 1e9, link)


def test_bad_plans_and_stages(link):
    chain = random_chain(random.Random(1), 3)
    devices = Devices(2, 1e12, link)
    with pytest.raises(ValueError, match="contiguous, non-empty stages"):
        evaluate(chain, devices, Shape(2, 1, 1, 1), [(0, 1, ("rep",), False),
                                                     (2, 3, ("rep",), False)])
    with pytest.raises(ValueError, match="micro-batch counts must be >= 1"):
        search(chain, devices, micro_batches=[0])
    with pytest.raises(ValueError, match="not a plan record"):
        load_plans({"plans": [{"chain": "x"}]})
    with pytest.raises(ValueError, match="reads \\[3\\]"):
        Chain("bad", (Layer("a", "linear", 4, 4, inputs=(3,)),), 10, 4)


def test_choose_plan_auto_or_from_a_file(tmp_path):
    from ngra.planner import choose_plan

    chain = random_chain(random.Random(3), 4)
    devices = Devices(2, 1e12, make_link(2))
    plans = search(chain, devices)
    assert choose_plan("auto", chain, devices) == plans[0]
    path = tmp_path / "plans.json"
    path.write_text(json.dumps({"plans": [p.to_json() for p in plans[::-1]]}))
    assert choose_plan(str(path), chain, devices) == plans[-1]  # the file's first
    with pytest.raises(ValueError, match="no plan for 'random' .* on 4 devices"):
        choose_plan(str(path), chain, Devices(4, 1e12, make_link(4)))
    with pytest.raises(ValueError, match="cannot read a plans file"):
        choose_plan(str(tmp_path / "missing.json"), chain, devices)
