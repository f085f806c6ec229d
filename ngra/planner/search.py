"""Search: the best plan of every mesh shape, by dynamic programming (and exhaustively).

For ``K`` devices the shapes are every ``(P, d, t)`` with ``P * d * t = K`` and
``P`` at most the number of layers, times each micro-batch count ``m >= P`` (1F1B
fills every stage; a chain with graph layers runs ``P = m = 1``: a graph layer needs
every row at once). For one
shape, in the spirit of Piper:

1. **Per stage** (every contiguous ``[i, j)``): a DP over the stage's layers in order,
   the state being the layout of the tensor between two layers (whole, or split over
   the ``t`` ranks), keeps every per-layer configuration that no other beats on all of
   forward and backward compute, forward and backward other time (collectives, which
   a lone rank does not speed up), local parameter bytes and saved activation bytes
   (the Pareto set: time and memory trade off, so the least-time choice alone could
   miss the one that fits). Each survivor, with and without recomputation, is a stage option.
2. **Over stages**: the step time ``(m - 1) max_s u_s + sum_s (u_s + a_s)`` couples the
   stages through the max. For a threshold ``X`` a DP over (stages left, first layer)
   minimizes ``sum_s (u_s + a_s)`` using only options with ``u_s <= X`` whose memory
   fits at their position (stage ``s`` of ``P`` keeps ``min(m, P - s)`` micro-batches);
   ``(m - 1) X`` plus that minimum bounds every plan whose slowest stage is at most
   ``X`` and equals the optimum when ``X`` is the optimum's slowest stage, so the
   minimum over the options' times ``X`` (ascending, stopping once ``(m - 1) X`` plus
   the unconstrained minimum cannot win) is exact.

:func:`exhaustive` enumerates every stage partition, per-layer configuration and
recomputation choice of each shape with :func:`~ngra.planner.cost.stage_cost`: the
test oracle for small chains. Both return the best plan of each shape, ranked.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Iterable

from ngra.planner.chain import Chain
from ngra.planner.cost import (
    CONFIGS, PARTS, Devices, Shape, StageCost, finish_stage, layer_configs, layer_cost,
    stage_cost, stage_edges,
)
from ngra.planner.plan import ParallelPlan, build_plan

__all__ = ["NoFeasiblePlan", "search", "exhaustive", "evaluate", "shapes", "choose_plan",
           "DEFAULT_MICRO_BATCHES"]

log = logging.getLogger(__name__)

DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)

# one stage option: its cost, per-layer configurations and whether it recomputes
_Option = tuple[StageCost, tuple[str, ...], bool]


class NoFeasiblePlan(ValueError):
    """No plan fits the memory per device; ``min_memory_bytes`` is the least that would."""

    def __init__(self, message: str, min_memory_bytes: float) -> None:
        super().__init__(message)
        self.min_memory_bytes = min_memory_bytes


def shapes(chain: Chain, devices: Devices,
           micro_batches: Iterable[int] = DEFAULT_MICRO_BATCHES) -> list[Shape]:
    """Every mesh shape and micro-batch count the search considers (module docstring)."""
    k = devices.count
    ms = sorted({int(m) for m in micro_batches})
    if not ms or ms[0] < 1:
        raise ValueError(f"micro-batch counts must be >= 1; got {list(micro_batches)}.")
    out = []
    for p in range(1, min(k, len(chain)) + 1):
        if k % p or (p > 1 and not chain.rows_independent):
            continue
        for d in range(1, k // p + 1):
            if (k // p) % d or d > chain.rows:
                continue
            t = k // p // d
            for m in ms:
                if m * d > chain.rows or (m > 1 and not chain.rows_independent) or m < p:
                    continue  # torch's 1F1B needs a micro-batch per stage at least
                out.append(Shape(p, d, t, m))
    return out


# ---------------------------------------------------------------- stage options
def _dominated(a: tuple, b: tuple) -> bool:
    """``b`` is at least as good as ``a`` on every key (their first fields)."""
    return all(y <= x for x, y in zip(a[0], b[0]))


def _pareto(entries: list[tuple]) -> list[tuple]:
    keep: list[tuple] = []
    for e in sorted(entries, key=lambda e: e[0]):
        if not any(_dominated(e, k) for k in keep):
            keep.append(e)
    return keep


def _keys(fwd: tuple, bwd: tuple, params: float, saved: float) -> tuple:
    """What a stage's cost grows with: forward and backward compute and the rest apart
    (a lone rank computes faster; the rest does not change), parameters, activations."""
    cf, cb = fwd[0] + fwd[1], bwd[0] + bwd[1]
    return (sum(fwd) - cf, cf, sum(bwd) - cb, cb, params, saved)


def stage_options(chain: Chain, devices: Devices, shape: Shape, i: int,
                  stops: Iterable[int], recompute: Iterable[bool] = (False, True)
                  ) -> dict[tuple[int, int], list[_Option]]:
    """For each ``j`` in ``stops``: the Pareto set of per-layer configurations of layers
    ``[i, j)`` as one stage, each with every recomputation choice (module docstring).
    The per-layer DP runs once from ``i`` to the last stop."""
    recompute = tuple(recompute)
    stops = set(stops)
    out: dict[tuple[int, int], list[_Option]] = {}
    # entry: (keys, fwd parts, bwd parts, params, saved, configs)
    zero = (0.0,) * len(PARTS)
    states: dict[str, list[tuple]] = {"R": [(_keys(zero, zero, 0, 0), zero, zero, 0.0, 0.0,
                                              ())]}
    for k in range(i, max(stops)):
        new: dict[str, list[tuple]] = {"R": [], "S": []}
        for config in layer_configs(chain, k, shape.tensor):
            lin, lout = CONFIGS[config]
            f, b, p, s = layer_cost(chain, k, devices.link, shape, config)
            for e in states.get(lin, []):
                fwd = tuple(x + y for x, y in zip(e[1], f))
                bwd = tuple(x + y for x, y in zip(e[2], b))
                new[lout].append((_keys(fwd, bwd, e[3] + p, e[4] + s), fwd, bwd, e[3] + p,
                                  e[4] + s, e[5] + (config,)))
        states = {lay: _pareto(v) for lay, v in new.items() if v}
        if k + 1 in stops:
            edges = stage_edges(chain, devices, shape, i, k + 1)
            out[(i, k + 1)] = [
                (finish_stage(devices, shape, list(e[1]), list(e[2]), e[3], e[4], edges, rc),
                 e[5], rc) for e in states.get("R", []) for rc in recompute]
    return out


# ---------------------------------------------------------------- the DP over stages
def _front(entries: list[tuple]) -> list[tuple]:
    """The entries no other beats on both ``x`` and ``y`` (their first two fields)."""
    out: list[tuple] = []
    for e in sorted(entries, key=lambda e: (e[0], e[1])):
        if not out or e[1] < out[-1][1]:
            out.append(e)
    return out


class _Table:
    """For each ``(i, j, stages left)``: the options that fit there, sorted by their
    critical-path time ``u'``, with the front over ``(u' + a, m/P u + a)`` of every
    prefix (the options under a threshold, by bisection)."""

    def __init__(self, options: dict[tuple[int, int], list[_Option]], shape: Shape,
                 devices: Devices, limit: float) -> None:
        self.rows: dict[tuple[int, int, int], tuple[list[float], list[list[tuple]]]] = {}
        m, d, share = shape.micro_batches, shape.data, shape.micro_batches / shape.pipeline
        for (i, j), opts in options.items():
            for left in range(1, shape.pipeline + 1):
                k = min(m, left)
                fits = sorted((o for o in opts
                               if o[0].memory(k, d, devices.optimizer_states) <= limit),
                              key=lambda o: o[0].solo_time)
                if not fits:
                    continue
                times, fronts, front = [], [], []
                for o in fits:
                    c = o[0]
                    entry = (c.solo_time + c.step_time, share * c.time + c.step_time, o)
                    front = _front([*front, entry])
                    times.append(c.solo_time)
                    fronts.append(front)
                self.rows[(i, j, left)] = (times, fronts)

    def front(self, i: int, j: int, left: int, cap: float) -> list[tuple]:
        row = self.rows.get((i, j, left))
        if row is None:
            return []
        n = bisect.bisect_right(row[0], cap)
        return row[1][n - 1] if n else []


def _dp(n: int, stages: int, table: _Table, cap: float) -> list[tuple]:
    """The front over ``(sum_s (u'_s + a_s), sum_s (m/P u_s + a_s))`` of ``stages``
    contiguous stages of ``n`` layers, each option's ``u' <= cap``; each entry
    ``(x, y, [(i, j, option), ...])``."""
    # best[left][i]: front of (x, y, stages) for layers [i, n) in `left` stages
    best: list[dict[int, list[tuple]]] = [{n: [(0.0, 0.0, ())]}]
    for left in range(1, stages + 1):
        row: dict[int, list[tuple]] = {}
        for i in range(n - left, -1, -1):
            cand = []
            for j in range(i + 1, n - left + 2):
                rest = best[left - 1].get(j)
                if not rest:
                    continue
                for x, y, o in table.front(i, j, left, cap):
                    cand += [(x + rx, y + ry, ((i, j, o), *chosen)) for rx, ry, chosen in rest]
            if cand:
                row[i] = _front(cand)
        best.append(row)
    return best[stages].get(0, [])


def _true_cost(entry: tuple, m: int) -> float:
    x, y, chosen = entry
    return max((m - 1) * max(o[0].solo_time for _, _, o in chosen) + x, y)


def _best_of_shape(chain: Chain, devices: Devices, shape: Shape,
                   options: dict[tuple[int, int], list[_Option]]) -> ParallelPlan | None:
    table = _Table(options, shape, devices, devices.memory_bytes)
    n, m = len(chain), shape.micro_batches
    free = _dp(n, shape.pipeline, table, float("inf"))
    if not free:
        return None
    best = min(free, key=lambda e: _true_cost(e, m))
    best_value = _true_cost(best, m)
    if m > 1:
        floor = min(e[0] for e in free)
        caps = sorted({o[0].solo_time for opts in options.values() for o in opts})
        for cap in caps:
            if (m - 1) * cap + floor >= best_value:
                break
            for entry in _dp(n, shape.pipeline, table, cap):
                value = _true_cost(entry, m)
                if value < best_value:
                    best_value, best = value, entry
    chosen = best[2]
    return build_plan(chain, devices, shape, [(i, j, o[1], o[2]) for i, j, o in chosen],
                      [o[0] for _, _, o in chosen])


def _min_memory(chain: Chain, devices: Devices, shape: Shape,
                options: dict[tuple[int, int], list[_Option]]) -> float:
    """The least peak memory per device over this shape's plans (no limit)."""
    n, m, d = len(chain), shape.micro_batches, shape.data
    best = [{n: 0.0}]
    for left in range(1, shape.pipeline + 1):
        row = {}
        for i in range(n - left, -1, -1):
            for j in range(i + 1, n - left + 2):
                if j not in best[left - 1]:
                    continue
                for o in options.get((i, j), []):
                    mem = max(o[0].memory(min(m, left), d, devices.optimizer_states),
                              best[left - 1][j])
                    row[i] = min(row.get(i, mem), mem)
        best.append(row)
    return best[shape.pipeline].get(0, float("inf"))


def search(chain: Chain, devices: Devices,
           micro_batches: Iterable[int] = DEFAULT_MICRO_BATCHES,
           recompute: Iterable[bool] = (False, True)) -> list[ParallelPlan]:
    """The best plan of every feasible shape, fastest first (module docstring).

    Raises:
        NoFeasiblePlan: no plan fits ``devices.memory_bytes``; the message names the
            least memory per device that would fit, and the plan that needs it.
    """
    return _rank(chain, devices, micro_batches, recompute, _best_of_shape)


def _rank(chain: Chain, devices: Devices, micro_batches: Iterable[int],
          recompute: Iterable[bool], best_of_shape) -> list[ParallelPlan]:
    recompute = tuple(recompute)
    plans, least = [], (float("inf"), None)
    for shape in shapes(chain, devices, micro_batches):
        n, options = len(chain), {}
        for i in range(n if shape.pipeline > 1 else 1):
            stops = range(i + 1, n + 1) if shape.pipeline > 1 else (n,)
            options.update(stage_options(chain, devices, shape, i, stops, recompute))
        plan = best_of_shape(chain, devices, shape, options)
        if plan is not None:
            plans.append(plan)
        elif not plans:
            mem = _min_memory(chain, devices, shape, options)
            if mem < least[0]:
                least = (mem, shape)
    if not plans:
        mem, shape = least
        raise NoFeasiblePlan(
            f"no plan of {chain.name!r} on {devices.count} device(s) fits in "
            f"{_mb(devices.memory_bytes)} per device; the smallest peak of any plan is "
            f"{_mb(mem)} per device (pipeline {shape.pipeline}, data {shape.data}, tensor "
            f"{shape.tensor}, {shape.micro_batches} micro-batch(es)): give each device at "
            f"least that much memory, or use more devices.", mem)
    plans.sort(key=lambda p: (p.predicted_time_s, p.devices, p.label))
    return plans


def _mb(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


# ---------------------------------------------------------------- the oracle
def evaluate(chain: Chain, devices: Devices, shape: Shape,
             stages: list[tuple[int, int, tuple[str, ...], bool]]) -> ParallelPlan:
    """The plan of explicit per-stage choices ``(start, stop, configs, recompute)``.

    Raises:
        ValueError: the stages do not cover the chain in order, or a configuration
            is not allowed (:func:`~ngra.planner.cost.stage_cost`).
    """
    bounds = [(i, j) for i, j, _, _ in stages]
    if (len(stages) != shape.pipeline or bounds[0][0] != 0 or bounds[-1][1] != len(chain)
            or any(a[1] != b[0] or a[0] >= a[1] for a, b in zip(bounds, bounds[1:]))
            or bounds[-1][0] >= bounds[-1][1]):
        raise ValueError(f"stages {bounds} do not split the {len(chain)} layers into "
                         f"{shape.pipeline} contiguous, non-empty stages.")
    costs = [stage_cost(chain, devices, shape, i, j, tuple(c), rc) for i, j, c, rc in stages]
    return build_plan(chain, devices, shape, stages, costs)


def exhaustive(chain: Chain, devices: Devices,
               micro_batches: Iterable[int] = DEFAULT_MICRO_BATCHES,
               recompute: Iterable[bool] = (False, True)) -> list[ParallelPlan]:
    """Like :func:`search`, by enumerating every plan of each shape (small chains only)."""
    recompute = tuple(recompute)

    def best_of_shape(chain, devices, shape, _options) -> ParallelPlan | None:
        n, best = len(chain), None
        for cuts in itertools.combinations(range(1, n), shape.pipeline - 1):
            bounds = list(zip((0, *cuts), (*cuts, n)))
            per_stage = []
            for i, j in bounds:
                configs = itertools.product(*(layer_configs(chain, k, shape.tensor)
                                              for k in range(i, j)))
                per_stage.append([(i, j, c, rc) for c in configs for rc in recompute])
            for stages in itertools.product(*per_stage):
                try:
                    plan = evaluate(chain, devices, shape, list(stages))
                except ValueError:  # layouts that do not chain
                    continue
                if plan.peak_memory_bytes > devices.memory_bytes:
                    continue
                if best is None or plan.predicted_time_s < best.predicted_time_s:
                    best = plan
        return best

    return _rank(chain, devices, micro_batches, recompute, best_of_shape)


def choose_plan(spec: str, chain: Chain, devices: Devices,
                micro_batches: Iterable[int] = DEFAULT_MICRO_BATCHES) -> ParallelPlan:
    """The plan a run uses: ``"auto"`` the top of :func:`search`, else a path to a plans
    file (``ngra plan --out``) whose first plan for ``devices.count`` devices and this
    chain is taken (``ngra train --plan auto|FILE``).

    Raises:
        ValueError: the file holds no plan for this chain and device count (the message
            says what it holds), or is not a plans file.
        NoFeasiblePlan: ``"auto"`` and nothing fits.
    """
    import json
    from pathlib import Path

    from ngra.planner.plan import load_plans

    if spec == "auto":
        return search(chain, devices, micro_batches)[0]
    try:
        plans = load_plans(json.loads(Path(spec).read_text()))
    except (OSError, ValueError) as exc:
        raise ValueError(f"--plan {spec}: cannot read a plans file ({exc}).") from None
    names = tuple(layer.name for layer in chain.layers)
    for plan in plans:
        layers = tuple(n for s in plan.stages for n in s.layers)
        if plan.devices == devices.count and layers == names:
            return plan
    held = sorted({(p.chain, p.devices) for p in plans})
    raise ValueError(f"--plan {spec}: no plan for {chain.name!r} ({len(chain)} layers) on "
                     f"{devices.count} devices; the file holds plans for {held}. Make one with "
                     f"`ngra plan --devices {devices.count} --out FILE` for this model.")
