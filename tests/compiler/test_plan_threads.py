"""A cached plan is a value: one layer called from two threads at once, with different
inputs, gives each call its own single-threaded result (forward and backward). The two
calls meet inside the edge stage, so both have run ``pre`` before either runs ``post``.

The layers cover what ``pre`` hands on to its call's edge stage and ``post`` (its carry):
GCN (a Linear hoisted into pre, nothing handed on), the self-term layer of
``test_patterns`` (the vertex stage's Linear of x made by pre with its own, handed to
post) and GAT (how to make the softmax value again in backward, handed to the edge
stage; this folder's conftest makes every value that way).
"""

from __future__ import annotations

import threading

import pytest
import torch
from _compiler_cases import make_graph
from test_patterns import SelfTermSum

from ngra import kernels
from ngra.compiler import compile_layer
from ngra.models.gat import GATConv
from ngra.models.gcn import GCNConv
from ngra.runtime.executor import edge_data_csc

F_IN, N, ROUNDS = 5, 60, 30
# float32 (GCN fuses with its float32 weights); a backward on 2 threads may sum in
# another order. Another call's state would give another input's result.
TOL = {"rtol": 1e-5, "atol": 1e-6}

LAYERS = {
    "gcn": lambda: GCNConv(F_IN, 4),
    "self_term": lambda: SelfTermSum(F_IN, 3, "param", "sum", True),
    "gat": lambda: GATConv(F_IN, 3, heads=2),
}
# what the compiled plan's pre hands on, per layer (None: nothing)
CARRIES = {"gcn": None, "self_term": "vertex_linears", "gat": "recompute"}


def _call(layer, g, x):
    out = layer(g, x)
    (gx,) = torch.autograd.grad(out, [x], torch.ones_like(out))
    return out.detach(), gx


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_overlapping_calls_of_one_plan_keep_their_own_state(name, monkeypatch):
    torch.manual_seed(0)
    g = make_graph("random", N)
    if name == "gcn":
        g = g.gcn_norm()  # GCN reads its edge weights
    layer = LAYERS[name]()
    xs = [torch.randn(N, F_IN, requires_grad=True) for _ in range(2)]
    plan = compile_layer(layer, g, xs[0], edge_data_csc(g, None))
    assert plan.kind == "compiled", "\n".join(plan.describe())
    carry = plan.pre(xs[0].detach()).carry
    want = CARRIES[name]
    assert (carry is None) if want is None else getattr(carry, want) is not None
    refs = [_call(layer, g, x) for x in xs]

    barrier = threading.Barrier(2, timeout=60)
    errors: list[BaseException] = []
    edge = plan.edge

    def meeting_edge(*args, **kwargs):
        barrier.wait()  # both calls are past pre: their stages overlap from here
        return edge(*args, **kwargs)

    monkeypatch.setattr(plan, "edge", meeting_edge)
    remade = []  # one Recompute per GAT call: each call's edge stage got its own recipe
    recompute = kernels.Recompute
    monkeypatch.setattr(kernels, "Recompute", lambda *a: remade.append(1) or recompute(*a))

    def worker(i: int) -> None:
        try:
            for _ in range(ROUNDS):
                out, gx = _call(layer, g, xs[i])
                torch.testing.assert_close(out, refs[i][0], **TOL)
                torch.testing.assert_close(gx, refs[i][1], **TOL)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    if errors:
        raise errors[0]
    assert len(remade) == (2 * ROUNDS if name == "gat" else 0)


def test_first_calls_from_two_threads_compile_once():
    """Two threads calling a fresh layer at once: one traces, the other finds its plan."""
    import threading
    import time

    import torch
    from torch import nn

    import ngra
    from ngra.compiler import driver

    class Lin(ngra.SagaLayer):
        gather = "sum"

        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 3)

        def apply_edge(self, edge):
            time.sleep(0.02)  # the other thread starts its trace meanwhile
            return edge.src

        def apply_vertex(self, vertex, acc):
            return self.lin(acc)

    g = ngra.Graph.from_edge_index(torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]), num_nodes=4)
    x = torch.randn(4, 6)
    for _ in range(5):
        layer = Lin()
        want = layer(g, x).detach()
        driver.clear_cache()
        barrier, out, errors = threading.Barrier(2), [None, None], []

        def call(i):
            try:
                barrier.wait()
                out[i] = layer(g, x).detach()
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert all(torch.equal(o, want) for o in out)
