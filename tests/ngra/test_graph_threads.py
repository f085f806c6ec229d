"""Threads sharing one Graph (issue 37): what a Graph builds on first use (the reverse CSR
and its perm, each edge's destination, the runtime's grid) is built once under the
graph's lock, whichever threads make the first use at once, and every thread gets the
same object; layers called from many threads on one fresh Graph give the sequential
results.
"""

from __future__ import annotations

import time

import torch
from thread_race import run_threads

import ngra.graph as graph_module
from ngra.graph import Graph
from ngra.models.gat import GATConv
from ngra.models.gcn import GCNConv
from ngra.models.sage import SAGEConv

THREADS, ROUNDS = 8, 12


def _race(fn, n: int = THREADS) -> list:
    return run_threads(fn, n, timeout=60)


def _graph(n: int = 300, e: int = 2000, seed: int = 0) -> Graph:
    g = torch.Generator().manual_seed(seed)
    return Graph.from_edge_index(torch.randint(0, n, (2, e), generator=g), num_nodes=n)


def test_racing_first_uses_build_once_and_share_one_object(monkeypatch):
    builds = []
    real = graph_module.transpose_csc

    def slow_transpose(*args, **kwargs):  # a wide window for a second builder to enter
        builds.append(kwargs.get("with_perm", True))
        time.sleep(0.02)
        return real(*args, **kwargs)

    monkeypatch.setattr(graph_module, "transpose_csc", slow_transpose)
    for _ in range(ROUNDS):
        builds.clear()
        g = _graph()
        csrs = _race(lambda i: g.csr())
        perms = _race(lambda i: g.csr().perm)
        dsts = _race(lambda i: g.dst_index())
        assert all(c is csrs[0] for c in csrs)
        assert all(p is perms[0] for p in perms) and all(d is dsts[0] for d in dsts)
        assert builds == [False, True]  # the CSR once, its perm once
        ip, ix, perm = real(g.indptr, g.indices, g.num_nodes)
        assert torch.equal(csrs[0].indptr, ip) and torch.equal(csrs[0].indices, ix)
        assert torch.equal(perms[0], perm)


def test_cached_builds_once_per_key():
    g = _graph()
    calls = []

    def make():
        calls.append(1)
        time.sleep(0.02)
        return object()

    got = _race(lambda i: g.cached("k", make))
    assert len(calls) == 1 and all(o is got[0] for o in got)


def _call(layer, g, x):
    x = x.clone().requires_grad_(True)
    out = layer(g, x)
    (gx,) = torch.autograd.grad(out, [x], torch.ones_like(out))
    return out.detach(), gx


def test_layers_on_one_fresh_graph_from_many_threads_equal_sequential_calls():
    torch.manual_seed(0)
    layers = [GCNConv(6, 4), SAGEConv(6, 4), GATConv(6, 3, heads=2)]
    x = torch.randn(300, 6)
    for layer in layers:  # compiled once beforehand: the race here is the graph's
        _call(layer, _graph(seed=99).gcn_norm(), x)
    for r in range(ROUNDS // 2):
        want = [_call(layer, _graph(seed=r).gcn_norm(), x) for layer in layers]
        g = _graph(seed=r).gcn_norm()  # fresh: no CSR, no grid yet, shared by every thread
        got = _race(lambda i: _call(layers[i % len(layers)], g, x))
        for i, (out, gx) in enumerate(got):
            w_out, w_gx = want[i % len(layers)]
            torch.testing.assert_close(out, w_out, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(gx, w_gx, rtol=1e-5, atol=1e-6)
