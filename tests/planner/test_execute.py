"""Executed plans (torch's DDP, tensor parallel and pipelining on gloo ranks) give one
process's outputs and gradients. One launch per process count runs every plan."""

from __future__ import annotations

import pytest

from ngra.distributed import launch
from ngra.planner import Devices, Shape, evaluate
from ngra.planner.trace import trace_module

import planner_ranks as ranks
from planner_cases import make_link

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(400)]

TOL = 1e-5
SPLIT = ("col", "shard", "row", "rep", "col_gather")  # Linear, ReLU, Linear, Tanh, Linear


def _mlp_plans(k: int) -> list[dict]:
    chain = trace_module(ranks.mlp(), ranks.ROWS)
    devices = Devices(k, 1e12, make_link(k))
    n = len(chain)
    rep = ("rep",) * n
    if k == 2:
        cases = [(Shape(1, 2, 1, 1), [(0, n, rep, False)]),
                 (Shape(1, 1, 2, 1), [(0, n, SPLIT, False)]),
                 (Shape(1, 1, 2, 2), [(0, n, ("row_slice", "rep", "col", "shard", "row"), True)]),
                 (Shape(2, 1, 1, 4), [(0, 2, rep[:2], False), (2, n, rep[2:], True)]),
                 (Shape(1, 2, 1, 2), [(0, n, rep, True)])]
    else:
        cases = [(Shape(1, 2, 2, 1), [(0, n, SPLIT, False)]),
                 (Shape(1, 4, 1, 2), [(0, n, rep, True)]),
                 (Shape(1, 1, 4, 1), [(0, n, SPLIT, True)]),
                 (Shape(2, 2, 1, 2), [(0, 3, rep[:3], False), (3, n, rep[3:], False)]),
                 (Shape(2, 1, 2, 4), [(0, 3, SPLIT[:3], True),
                                      (3, n, ("rep", "row_slice"), False)]),
                 (Shape(4, 1, 1, 4), [(0, 1, rep[:1], False), (1, 2, rep[:1], False),
                                      (2, 4, rep[:2], False), (4, 5, rep[:1], False)])]
    return [evaluate(chain, devices, s, st).to_json() for s, st in cases]


def _gnn_plans(k: int) -> list[dict]:
    from ngra.planner.gnn import gnn_chain

    model, graph, x, edge_data, _ = ranks._gnn_data()
    chain = gnn_chain(model, graph, x, edge_data, parts=(k,))
    devices = Devices(k, 1e12, make_link(k))
    n = len(chain)
    tp = tuple({"layers.0.mlp.0": "col", "layers.0.mlp.1": "shard", "layers.0.mlp.2": "row",
                "layers.1.mlp.0": "col_gather", "layers.1.mlp.2": "row_slice"}.get(x.name, "rep")
               for x in chain.layers)
    return [evaluate(chain, devices, Shape(1, k, 1, 1), [(0, n, ("rep",) * n, False)]).to_json(),
            evaluate(chain, devices, Shape(1, 1, k, 1), [(0, n, tp, False)]).to_json()]


def _run(k: int) -> None:
    mlp, gnn = _mlp_plans(k), _gnn_plans(k)
    results = launch(ranks.check_plans, k, mlp, gnn, threads=1)
    for rank, rows in enumerate(results):
        assert len(rows) == len(mlp) + len(gnn)
        for r in rows:
            assert r["out"] < TOL and r["grad"] < TOL, (rank, r)
    # every stage of every plan had parameters to check, but the activation-only stage
    assert sum(r["params"] == 0 for rows in results for r in rows) == (1 if k == 4 else 0)


def test_plans_on_two_ranks_match_one_process():
    _run(2)


@pytest.mark.slow
def test_plans_on_four_ranks_match_one_process():
    _run(4)
