"""Plans: frozen, JSON-serializable records of how a chain runs on ``K`` devices.

A :class:`ParallelPlan` is a :class:`~ngra.planner.cost.Shape` (pipeline stages x data
replicas x tensor ranks, micro-batches) and one :class:`StagePlan` per stage: its
contiguous layers, each layer's tensor-parallel configuration
(:data:`ngra.planner.cost.CONFIGS`) and the module it names, and whether the stage
recomputes its activations. It carries its predicted step time, broken down
(:class:`Breakdown`, whose parts sum to the time), and the peak memory of each
stage's devices. Ranks are laid out on a ``(pipeline, data, tensor)`` mesh in
row-major order: rank ``s * d * t + i * t + j`` runs stage ``s``, replica ``i``,
tensor shard ``j``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from ngra.planner.chain import Chain
from ngra.planner.cost import PARTS, STEP_PARTS, Devices, Shape, StageCost, pipeline_time

__all__ = ["ParallelPlan", "StagePlan", "Breakdown", "build_plan", "format_table", "load_plans"]


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage: layers ``[start, stop)`` of the chain.

    Attributes:
        layers: the layers' names; modules: the ``nn.Linear`` each names (``""``: none).
        configs: each layer's tensor-parallel configuration.
        recompute: activations made again in backward instead of kept.
        forward_s, backward_s: one micro-batch's predicted seconds (sends included).
        memory_bytes: predicted peak bytes on each of the stage's devices.
    """

    start: int
    stop: int
    layers: tuple[str, ...]
    modules: tuple[str, ...]
    configs: tuple[str, ...]
    recompute: bool
    forward_s: float
    backward_s: float
    memory_bytes: float


@dataclass(frozen=True)
class Breakdown:
    """A step's predicted seconds by cause; the parts sum to :attr:`total`.

    ``compute`` .. ``tp_overhead`` (DTensor's cost beyond GEMMs and collectives) are the
    bottleneck stage's, over all micro-batches, and ``pipeline_bubble`` what the other
    stages add to the 1F1B makespan; or, where ranks sharing cores make the pipeline's
    work the longer term (:func:`ngra.planner.cost.pipeline_time`), every stage's parts
    spread over the stages, with no bubble. The last three follow the pipeline flush
    (summed over stages).
    """

    compute: float = 0.0
    recompute: float = 0.0
    tp_all_reduce: float = 0.0
    tp_all_gather: float = 0.0
    graph_exchange: float = 0.0
    pipeline_p2p: float = 0.0
    tp_overhead: float = 0.0
    pipeline_bubble: float = 0.0
    dp_all_reduce: float = 0.0
    optimizer: float = 0.0
    grad_accumulation: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class ParallelPlan:
    """A ranked candidate: how ``chain`` runs on ``devices`` devices (module docstring)."""

    chain: str
    devices: int
    pipeline: int
    data: int
    tensor: int
    micro_batches: int
    rows: int
    stages: tuple[StagePlan, ...]
    predicted_time_s: float
    breakdown: Breakdown
    peak_memory_bytes: float

    @property
    def shape(self) -> Shape:
        return Shape(self.pipeline, self.data, self.tensor, self.micro_batches)

    def stage_of_rank(self, rank: int) -> int:
        return rank // (self.data * self.tensor)

    @property
    def memory_per_device(self) -> tuple[float, ...]:
        """Predicted peak bytes of each rank, by rank."""
        return tuple(self.stages[self.stage_of_rank(r)].memory_bytes
                     for r in range(self.devices))

    @property
    def label(self) -> str:
        """``pp2 dp1 tp2 m4`` plus the split and recompute choices, in a few words."""
        text = f"pp{self.pipeline} dp{self.data} tp{self.tensor} m{self.micro_batches}"
        if self.tensor > 1:
            text += " " + "|".join(",".join(_short(c) for c in s.configs) for s in self.stages)
        rc = [str(i) for i, s in enumerate(self.stages) if s.recompute]
        if rc:
            text += " rc" + ("" if self.pipeline == 1 else ":" + ",".join(rc))
        return text

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["label"] = self.label
        d["memory_per_device"] = list(self.memory_per_device)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ParallelPlan:
        try:
            stages = tuple(StagePlan(**{**s, "layers": tuple(s["layers"]),
                                        "modules": tuple(s["modules"]),
                                        "configs": tuple(s["configs"])})
                           for s in d["stages"])
            names = {f.name for f in fields(cls)} - {"stages", "breakdown"}
            plan = cls(**{k: d[k] for k in names}, stages=stages,
                       breakdown=Breakdown(**d["breakdown"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a plan record ({type(exc).__name__}: {exc}).") from None
        if plan.pipeline * plan.data * plan.tensor != plan.devices:
            raise ValueError(f"plan {plan.label!r}: pipeline x data x tensor != devices "
                             f"({plan.devices}).")
        return plan

    def record(self) -> dict[str, Any]:
        """The short record a training summary keeps of the plan it ran."""
        return {"label": self.label, "devices": self.devices, "pipeline": self.pipeline,
                "data": self.data, "tensor": self.tensor,
                "micro_batches": self.micro_batches,
                "configs": {m: c for s in self.stages for m, c in zip(s.modules, s.configs)
                            if m and c != "rep"},
                "recompute": [s.recompute for s in self.stages],
                "predicted_time_s": self.predicted_time_s}


def _short(config: str) -> str:
    return {"rep": "r", "col": "c", "col_gather": "cg", "row": "w", "row_slice": "sw",
            "shard": "s"}[config]


def build_plan(chain: Chain, devices: Devices, shape: Shape,
               stages: list[tuple[int, int, tuple[str, ...], bool]],
               costs: list[StageCost]) -> ParallelPlan:
    """A :class:`ParallelPlan` from per-stage choices ``(start, stop, configs, recompute)`` and
    their :class:`~ngra.planner.cost.StageCost` s (breakdown and memory per stage)."""
    m, P = shape.micro_batches, shape.pipeline
    path, work = pipeline_time(costs, m)
    time = max(path, work) + sum(c.step_time for c in costs)
    if path >= work:
        u = [c.solo_time for c in costs]
        slow = max(range(P), key=lambda s: u[s])
        parts = {name: m * v for name, v in zip(PARTS, costs[slow].solo_parts)}
        parts["pipeline_bubble"] = sum(u) - u[slow]
    else:
        parts = {name: m / P * sum(c.parts[k] for c in costs) for k, name in enumerate(PARTS)}
    for k, name in enumerate(STEP_PARTS):
        parts[name] = sum(c.step_parts[k] for c in costs)
    out = []
    for s, ((i, j, configs, rc), c) in enumerate(zip(stages, costs)):
        mem = c.memory(min(m, P - s), shape.data, devices.optimizer_states)
        layers = chain.layers[i:j]
        out.append(StagePlan(i, j, tuple(x.name for x in layers),
                             tuple(x.module for x in layers), tuple(configs), bool(rc),
                             c.forward, c.backward, mem))
    return ParallelPlan(chain.name, devices.count, *shape, chain.rows, tuple(out), time,
                Breakdown(**parts), max(s.memory_bytes for s in out))


def format_table(plans: list[ParallelPlan], top: int | None = None) -> str:
    """The ranked plans as a text table (time in ms, memory in MB)."""
    head = (f"{'#':>3}  {'plan':<34} {'time ms':>9} {'compute':>8} {'tp comm':>8} "
            f"{'dp a-r':>8} {'exchange':>8} {'bubble':>8} {'p2p':>7} {'peak MB':>8}")
    lines = [head, "-" * len(head)]
    for k, p in enumerate(plans[:top] if top else plans):
        b = p.breakdown
        lines.append(
            f"{k + 1:>3}  {p.label[:34]:<34} {p.predicted_time_s * 1e3:>9.2f} "
            f"{(b.compute + b.recompute + b.optimizer + b.grad_accumulation) * 1e3:>8.2f} "
            f"{(b.tp_all_reduce + b.tp_all_gather + b.tp_overhead) * 1e3:>8.2f} "
            f"{b.dp_all_reduce * 1e3:>8.2f} "
            f"{b.graph_exchange * 1e3:>8.2f} {b.pipeline_bubble * 1e3:>8.2f} "
            f"{b.pipeline_p2p * 1e3:>7.2f} {p.peak_memory_bytes / 2**20:>8.1f}")
    return "\n".join(lines)


def load_plans(data: dict[str, Any] | list) -> list[ParallelPlan]:
    """The plans of an ``ngra plan --out`` file's JSON (``{"plans": [...]}``), one plan's
    record, or a list of them; in file order (ranked: best first)."""
    if isinstance(data, dict) and "plans" in data:
        data = data["plans"]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        raise ValueError("expected a plan, a list of plans or {\"plans\": [...]}; found none.")
    return [ParallelPlan.from_json(d) for d in data]
