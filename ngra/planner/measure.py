"""Checking predictions: run candidate plans of a chain on gloo ranks and time their steps.

:class:`ChainModule` makes any :class:`~ngra.planner.chain.Chain` executable with the
same shapes: ``nn.Linear`` of its widths, ReLU for element-wise layers, a row-wise
stand-in for the other layers (concatenate the inputs, fold or cut to the output
width, plus its parameters), and for a graph layer what a rank of a row-partitioned
GNN does: receive the halo (an ``all_to_all`` among the ``d`` replicas, the busiest
rank's row count from every rank, differentiable) and sum its own in-edges' source
rows with :func:`ngra.kernels.gspmm` over its part of the real graph (contiguous,
edge-balanced destination ranges, as :func:`~ngra.planner.gnn.partition_halo` assumes by default).
A chain without graph layers or branches becomes an ``nn.Sequential``, so pipeline
plans run too.

:func:`measure_cases` launches the ranks once and runs the plans in interleaved
rounds (plan A, B, C, then A, B, C again), each plan's model built afresh per round,
so that a machine whose load changes affects every plan alike; a step's time is the
slowest rank's, between barriers; each plan gets the median over all its timed steps.
Its memory (first round) is the largest rank's peak of live tensors during one more
step, from torch's memory profiler, plus the parameters and optimizer states alive
before it: the tensors the cost model counts, without allocator slack (DDP's gradient
buckets, which the model counts, are not among the tensors the profiler sees before
the step).
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ngra.planner.chain import Chain
from ngra.planner.plan import ParallelPlan
from ngra.partition.kway import edge_balanced_ranges
from ngra.memstat import tensor_peak_bytes
from ngra.distributed import launch
from ngra.kernels import gspmm

__all__ = ["ChainModule", "chain_module", "measure_cases", "kendall_tau",
           "row_ranges"]

log = logging.getLogger(__name__)


def _fit_width(h: torch.Tensor, out: int) -> torch.Tensor:
    """``[rows, w]`` -> ``[rows, out]``: fold groups of columns, cut, or pad."""
    w = h.shape[1]
    if w == out:
        return h
    if w % out == 0:
        return h.view(h.shape[0], out, w // out).sum(-1)
    return h[:, :out] if out < w else F.pad(h, (0, out - w))


class _Other(nn.Module):
    def __init__(self, out: int, params: int) -> None:
        super().__init__()
        self.out = out
        self.p = nn.Parameter(torch.zeros(params)) if params else None

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        h = _fit_width(torch.cat(xs, -1) if len(xs) > 1 else xs[0], self.out)
        return h * 1.0 if self.p is None else h + self.p.mean()


def _local_graph(indptr: torch.Tensor, indices: torch.Tensor, lo: int, hi: int
                 ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The in-edges of destinations ``[lo, hi)``: local CSC whose sources are the rank's
    rows ``0 .. hi-lo-1`` then its halo rows; returns ``(indptr, indices, halo)``."""
    ptr = indptr[lo:hi + 1] - indptr[lo]
    src = indices[indptr[lo]:indptr[hi]].to(torch.int64)
    remote = (src < lo) | (src >= hi)
    ids, inverse = torch.unique(src[remote], return_inverse=True)
    local = src - lo
    local[remote] = (hi - lo) + inverse
    return ptr.to(torch.int64), local, int(ids.numel())


class _Graph(nn.Module):
    """A graph layer on one rank: halo exchange and aggregation (module docstring)."""

    def __init__(self, chain: Chain, i: int, graph: tuple[torch.Tensor, torch.Tensor] | None,
                 ranges: list[tuple[int, int]], replica: int, group: Any) -> None:
        super().__init__()
        layer = chain.layers[i]
        self.out, self.exchange = layer.out_width, layer.exchange_width
        self.d, self.group, self.replica = len(ranges), group, replica
        self.per_peer = -(-chain.halo_rows(self.d) // max(self.d - 1, 1))
        if graph is None:
            raise ValueError(f"chain {chain.name!r} has graph layers: pass the graph.")
        lo, hi = ranges[replica]
        self.indptr, self.indices, self.halo = _local_graph(*graph, lo, hi)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        h = torch.cat(xs, -1) if len(xs) > 1 else xs[0]
        if self.d > 1:
            import torch.distributed._functional_collectives as funcol

            rows = torch.arange(self.per_peer) % max(h.shape[0], 1)
            send = h[:, :self.exchange].index_select(0, rows).repeat(self.d - 1, 1)
            sizes = [0 if j == self.replica else self.per_peer for j in range(self.d)]
            # differentiable: backward sends the halo rows' gradients back the same way
            got = funcol.wait_tensor(funcol.all_to_all_single_autograd(send, sizes, sizes,
                                                                       self.group))
            halo = F.pad(got[:self.halo], (0, h.shape[1] - self.exchange))
            h = torch.cat([h, halo])
        return _fit_width(gspmm(self.indptr, self.indices, h, reduce="sum"), self.out)


class ChainModule(nn.Module):
    """A chain with branches or graph layers as a module (see the module docstring)."""

    def __init__(self, chain: Chain, graph: tuple[torch.Tensor, torch.Tensor] | None = None,
                 ranges: list[tuple[int, int]] | None = None, replica: int = 0,
                 group: Any = None) -> None:
        super().__init__()
        self.chain = chain
        ranges = ranges or [(0, chain.rows)]
        for i, layer in enumerate(chain.layers):
            if layer.kind == "graph":
                mod: nn.Module = _Graph(chain, i, graph, ranges, replica, group)
            else:
                mod = _layer_module(chain, i)
            self.add_module(str(i), mod)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        env = {-1: x}
        for i in range(len(self.chain)):
            env[i] = getattr(self, str(i))(*(env[j] for j in self.chain.inputs(i)))
        return env[len(self.chain) - 1]


def _layer_module(chain: Chain, i: int) -> nn.Module:
    layer = chain.layers[i]
    if layer.kind == "linear":
        return nn.Linear(layer.in_width, layer.out_width,
                         bias=layer.param_bytes > 4 * layer.in_width * layer.out_width)
    if layer.kind == "elementwise" and len(chain.inputs(i)) == 1:
        return nn.ReLU()
    return _Other(layer.out_width, layer.param_bytes // 4)


def chain_module(chain: Chain, **kw: Any) -> nn.Module:
    """An ``nn.Sequential`` (children ``"0"``, ``"1"``, ...) for a plain chain, else a
    :class:`ChainModule`; the module path of layer ``i`` is ``str(i)`` either way."""
    plain = chain.rows_independent and all(chain.inputs(i) == (i - 1,)
                                           for i in range(len(chain)))
    if plain:
        return nn.Sequential(*(_layer_module(chain, i) for i in range(len(chain))))
    return ChainModule(chain, **kw)


def row_ranges(chain: Chain, graph: tuple[torch.Tensor, torch.Tensor] | None,
               d: int) -> list[tuple[int, int]]:
    """Each replica's rows: the graph's edge-balanced ranges, else equal slices."""
    if graph is None or chain.rows_independent:
        bounds = torch.linspace(0, chain.rows, d + 1).round().to(torch.int64).tolist()
    else:
        bounds = edge_balanced_ranges(graph[0].to(torch.int64), d).tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def _timed_steps(chain: Chain, plan: ParallelPlan, graph: Any, steps: int, warmup: int,
                 seed: int, memory: bool) -> tuple[list[float], float]:
    """``(step seconds, peak bytes)``: the slowest rank's step times, and (``memory``) the
    largest rank's peak of live tensors in one more step, counted as the profiler sees
    them (:func:`ngra.memstat.tensor_peak_bytes`) on top of the parameters and optimizer
    states alive before it (else 0)."""
    import torch.distributed as dist

    from ngra.planner.execute import Runner, plan_mesh

    mesh = plan_mesh(plan)
    replica = mesh["dp"].get_local_rank()
    ranges = row_ranges(chain, graph, plan.data)
    torch.manual_seed(seed)
    model = chain_module(chain, graph=graph, ranges=ranges, replica=replica,
                         group=mesh["dp"].get_group())
    runner = Runner(model, plan, optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-4),
                    modules=[str(i) for i in range(len(chain))], row_ranges=ranges, mesh=mesh)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(chain.rows, chain.input_width, generator=g)
    y = torch.randn(chain.rows, chain.layers[-1].out_width, generator=g)
    times = []
    for k in range(warmup + steps):
        dist.barrier()
        t0 = time.perf_counter()
        runner.step(x, y)
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if k >= warmup:
            times.append(float(t))
    peak = 0.0
    if memory:
        kept = sum(_local(p).nbytes for p in runner.params.values())
        if runner.optimizer is not None:
            kept += sum(_local(v).nbytes for state in runner.optimizer.state.values()
                        for v in state.values() if isinstance(v, torch.Tensor) and v.dim())
        dist.barrier()
        try:
            peak = float(kept + tensor_peak_bytes(lambda: runner.step(x, y)))
        except (AssertionError, RuntimeError) as exc:  # the profiler's own checks
            log.warning("no memory timeline for %s: %s", plan.label, exc)
            peak = float("nan")
    top = torch.tensor([peak], dtype=torch.float64)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)  # NaN on any rank makes it NaN
    return times, float(top)


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _measure_rank(cases: list[tuple[dict, list[dict], Any]], steps: int, warmup: int,
                  rounds: int) -> list[list[tuple[list[float], float]]]:
    out = []
    for chain_json, plans_json, graph in cases:
        chain = Chain.from_json(chain_json)
        plans = [ParallelPlan.from_json(p) for p in plans_json]
        times: list[list[float]] = [[] for _ in plans]
        peaks = [0.0] * len(plans)
        for r in range(rounds):
            for k, plan in enumerate(plans):
                t, peak = _timed_steps(chain, plan, graph, steps, warmup, seed=r,
                                       memory=r == 0)
                times[k] += t
                peaks[k] = max(peaks[k], peak)
        out.append(list(zip(times, peaks)))
    return out


def measure_cases(cases: Sequence[tuple[Chain, Sequence[ParallelPlan], Any]], *, steps: int = 5,
                  warmup: int = 2, rounds: int = 3, threads: int = 1
                  ) -> list[list[dict[str, Any]]]:
    """Run every case's plans (all for one device count) in one launch of that many gloo
    ranks; per case and plan its predicted and measured (median) step seconds, the raw
    step times, and predicted and measured peak bytes per device.

    Args:
        cases: ``(chain, plans, graph)``; ``graph``: ``(indptr, indices)`` of the CSC
            graph for chains with graph layers, else ``None``.
        threads: torch threads per rank.
    """

    counts = {p.devices for _, plans, _ in cases for p in plans}
    if len(counts) != 1:
        raise ValueError(f"measure one device count at a time; got plans for {sorted(counts)}.")
    payload = [(c.to_json(), [p.to_json() for p in plans], g) for c, plans, g in cases]
    times = launch(_measure_rank, counts.pop(), payload, steps, warmup, rounds,
                   threads=threads)[0]
    return [[{"label": p.label, "predicted_s": p.predicted_time_s,
              "measured_s": statistics.median(t), "times_s": t,
              "predicted_peak_bytes": p.peak_memory_bytes, "measured_peak_bytes": peak}
             for p, (t, peak) in zip(plans, ts)]
            for (_, plans, _), ts in zip(cases, times)]


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-a of two equally long sequences (pairs tied in either count as 0)."""
    n = len(a)
    if n < 2:
        return float("nan")
    s = 0
    for i in range(n):
        for j in range(i + 1, n):
            x, y = a[i] - a[j], b[i] - b[j]
            s += (x * y > 0) - (x * y < 0)
    return s / (n * (n - 1) / 2)
