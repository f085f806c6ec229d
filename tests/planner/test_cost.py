"""The cost model's formulas, each against its textbook form."""

from __future__ import annotations

import pytest

from ngra.planner import Chain, Devices, Layer, Shape, evaluate
from ngra.planner.cost import (
    BYTES, DDP_BUCKET, DDP_FIRST_BUCKET, ddp_all_reduce, layer_configs, layer_cost,
    makespan_1f1b, memory_bytes, pipeline_time, stage_cost,
)

from planner_cases import make_link


def _mlp(widths=(64, 256, 256, 64), rows=1024) -> Chain:
    layers = []
    for k, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(Layer(f"lin{k}", "linear", a, b, param_bytes=4 * (a * b + b),
                            saved_width=a, splits=("col", "row"), module=str(2 * k)))
        if k < len(widths) - 2:
            layers.append(Layer(f"relu{k}", "elementwise", b, b, saved_width=b))
    return Chain("mlp", tuple(layers), rows, widths[0])


def test_ring_all_reduce():
    alpha, beta = 3e-5, 2e-9
    link = make_link(8, alpha, beta)
    n = 12 << 20
    for p in (2, 4, 8):
        assert link.all_reduce(n, p) == pytest.approx(2 * (p - 1) / p * n * beta
                                                      + 2 * (p - 1) * alpha)
    assert link.all_reduce(n, 1) == 0.0


def test_ddp_all_reduce_pays_a_latency_per_bucket():
    alpha, beta = 3e-5, 2e-9
    link = make_link(4, alpha, beta)
    n = DDP_FIRST_BUCKET + 2 * DDP_BUCKET + 5
    buckets = 4
    assert ddp_all_reduce(link, n, 4) == pytest.approx(
        2 * 3 / 4 * n * beta + buckets * 2 * 3 * alpha)
    assert ddp_all_reduce(link, n, 1) == 0.0


def test_1f1b_makespan_of_uniform_stages():
    tf, tb = 0.003, 0.007
    for m in (1, 4, 9):
        for p in (1, 2, 4):
            assert makespan_1f1b([tf + tb] * p, m) == pytest.approx((m + p - 1) * (tf + tb))


def test_uniform_pipeline_plan_time_is_the_1f1b_makespan():
    # four identical stages: the plan's time is (m + p - 1)(t_f + t_b) plus the flush
    chain = Chain("uniform", tuple(Layer(f"l{i}", "linear", 128, 128, param_bytes=4 * 128 * 128,
                                         saved_width=128, splits=("col", "row"), module=str(i))
                                   for i in range(4)), 256, 128)
    devices = Devices(4, 1e12, make_link(4))
    m = 8
    plan = evaluate(chain, devices, Shape(4, 1, 1, m),
                    [(i, i + 1, ("rep",), False) for i in range(4)])
    mid = plan.stages[1]
    # inner stages are alike (send forward, receive backward) and slowest
    assert plan.stages[2].forward_s == pytest.approx(mid.forward_s)
    flush = plan.breakdown.optimizer + plan.breakdown.grad_accumulation
    assert plan.breakdown.dp_all_reduce == 0.0
    assert plan.predicted_time_s == pytest.approx(
        (m - 1) * (mid.forward_s + mid.backward_s)
        + sum(s.forward_s + s.backward_s for s in plan.stages) + flush)
    assert plan.breakdown.total == pytest.approx(plan.predicted_time_s)


def test_memory_of_recomputed_vs_stored_activations():
    params, saved, stage_in, transient = 1000.0, 300.0, 40.0, 7.0
    for k in (1, 3):
        stored = memory_bytes(params, saved, stage_in, transient, k, False, 1, 2)
        again = memory_bytes(params, saved, stage_in, transient, k, True, 1, 2)
        assert stored == params * 4 + k * saved + transient
        assert again == params * 4 + k * stage_in + saved + transient
    # DDP keeps a gradient bucket copy per replica
    assert memory_bytes(params, 0, 0, 0, 1, False, 2, 2) == params * 5


def test_recompute_stage_memory_and_time(link):
    chain = _mlp(rows=4096)
    devices = Devices(1, 1e12, link)
    shape = Shape(1, 1, 1, 1)
    n = len(chain)
    kept = stage_cost(chain, devices, shape, 0, n, ("rep",) * n, False)
    again = stage_cost(chain, devices, shape, 0, n, ("rep",) * n, True)
    saved = sum(layer.saved_width for layer in chain.layers) * 4096 * BYTES
    assert kept.saved == again.saved == saved
    assert again.stage_input == 4096 * chain.input_width * BYTES
    # with several micro-batches in flight only their inputs stay, not their activations
    assert again.memory(4, 1, 2) < kept.memory(4, 1, 2)
    assert again.memory(1, 1, 2) > kept.memory(1, 1, 2)  # one in flight: nothing to gain
    assert again.time == pytest.approx(kept.time + kept.forward)


def test_tensor_parallel_collectives(link):
    chain = _mlp(rows=512)
    shape = Shape(1, 1, 4, 1)
    r, a, b = 512, 256, 256
    f, bw, params, saved = layer_cost(chain, 2, link, shape, "col")  # lin1: 256 -> 256
    assert f[2] == 0 and bw[2] == pytest.approx(link.all_reduce(r * a * BYTES, 4))
    assert params == chain.layers[2].param_bytes / 4 and saved == r * a * BYTES
    f, bw, params, saved = layer_cost(chain, 2, link, shape, "row")
    assert f[2] == pytest.approx(link.all_reduce(r * b * BYTES, 4)) and bw[2] == 0
    assert saved == r * a * BYTES / 4
    f, bw, _, _ = layer_cost(chain, 2, link, shape, "col_gather")
    assert f[3] == pytest.approx(link.all_gather(r * b * BYTES, 4))
    f, bw, _, _ = layer_cost(chain, 2, link, shape, "row_slice")
    assert bw[3] == pytest.approx(link.all_gather(r * a * BYTES, 4))
    # the first layer reads the input: no input gradient, so no backward collective
    f, bw, _, _ = layer_cost(chain, 0, link, shape, "col")
    assert bw[2] == 0
    assert layer_configs(chain, 1, 4) == ["rep", "shard"]
    assert layer_configs(chain, len(chain) - 1, 4) == ["rep", "col_gather", "row", "row_slice"]


def test_layouts_must_chain(link):
    chain = _mlp()
    devices = Devices(2, 1e12, link)
    shape = Shape(1, 1, 2, 1)
    with pytest.raises(ValueError, match="split input after a whole output"):
        stage_cost(chain, devices, shape, 0, 5, ("rep", "rep", "row", "rep", "rep"), False)
    with pytest.raises(ValueError, match="ends on a split output"):
        stage_cost(chain, devices, shape, 0, 3, ("rep", "rep", "col"), False)


def test_graph_layer_exchanges_the_halo():
    link = make_link(4, 1e-4, 1e-9)
    graph = Layer("g", "graph", 64, 64, edges=10_000, read_width=64, exchange_width=64)
    lin = Layer("w", "linear", 64, 16, param_bytes=4 * 64 * 16, saved_width=64)
    chain = Chain("gnn", (lin, graph), 1000, 64, halo=((2, 300), (4, 450)))
    for d, halo in ((2, 300), (4, 450)):
        f, b, _, _ = layer_cost(chain, 1, link, Shape(1, d, 4 // d, 1), "rep")
        assert f[4] == b[4] == pytest.approx(link.all_to_all(halo * 64 * BYTES, d))
        assert f[0] == pytest.approx(link.gather_time(10_000 / d * 64 * BYTES))
    f, _, _, _ = layer_cost(chain, 1, link, Shape(1, 1, 4, 1), "rep")
    assert f[4] == 0.0
    with pytest.raises(ValueError, match="no halo size for a 8-way partition"):
        chain.halo_rows(8)


def test_ranks_sharing_cores_take_the_longer_of_path_and_work():
    import dataclasses

    chain = _mlp((256, 1024, 256), rows=512)  # an unbalanced two-stage split
    stages = [(0, 2, ("rep", "rep"), False), (2, 3, ("rep",), False)]
    own = make_link(2)
    shape = Shape(2, 1, 1, 4)
    for shared in (1.0, 2.0, 8.0):
        devices = Devices(2, 1e12, dataclasses.replace(own, shared=shared))
        plan = evaluate(chain, devices, shape, stages)
        costs = [stage_cost(chain, devices, shape, i, j, c, rc) for i, j, c, rc in stages]
        path, work = pipeline_time(costs, 4)
        assert path == pytest.approx(makespan_1f1b([c.solo_time for c in costs], 4))
        assert work == pytest.approx(4 / 2 * sum(c.time for c in costs))
        flush = sum(c.step_time for c in costs)
        assert plan.predicted_time_s == pytest.approx(max(path, work) + flush)
        assert plan.breakdown.total == pytest.approx(plan.predicted_time_s)
        if shared == 1.0:  # a device per rank: the makespan, as ever
            assert path >= work
        if shared == 8.0:  # compute 8x faster alone: the shared work decides
            assert work > path and plan.breakdown.pipeline_bubble == 0
