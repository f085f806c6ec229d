"""One characterization run: a framework x model x dataset x mode, timed per stage.

A run does ``warmup`` untimed iterations (at least one: the first call
compiles plans and kernels), ``repeats`` plain (uninstrumented) iterations for
the framework's honest total, then ``repeats`` instrumented iterations for the
stage breakdown; with a time budget the counts shrink to fit it, judged from
the first iteration:

* **ngra**: :class:`ngra.probes.Recorder`; forward stage times are the
  probes' exclusive times, read per SAGA layer (each layer call is a
  ``layer<i>`` stage, so its ``pre`` and ``edge`` map with its own plan, see
  :func:`plan_info` and :mod:`ngra.characterize.stages`); in training the
  backward is split by the probes' autograd markers (:mod:`ngra.probes`).
* **PyG / DGL**: ``torch.profiler`` with the operator-to-stage mapping of
  :mod:`ngra.characterize.stages` (forward by layer range and op; backward by
  autograd sequence number).

For ngra the run also records whether its first layer multiplied the input features
as a sparse matrix (``input_nnz``), so that executed FLOPs can be told from the
algorithm's (:mod:`ngra.characterize.metrics`).

The reported breakdown is the instrumented iteration whose total is the
median: its stage times and its ``remainder`` (total minus stages) sum to that
total exactly. An iteration is one forward (inference: eval mode under
``no_grad``) or forward + cross-entropy loss on the training mask + backward
(training; no optimizer step, gradients dropped between iterations).

Peak memory is the peak resident set size over the whole run above the
process's resident size when the run started: before each run the process
frees what it can (``gc``, ``malloc_trim``) and resets the kernel's high-water
mark (``/proc/self/clear_refs``), so runs executed one after another in the
same worker do not inherit each other's peaks. Where that reset is unavailable
the peak is the process's lifetime peak (``peak_note`` says so).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from ngra.characterize.metrics import input_linears
from ngra.characterize.stages import (
    LAYER_RANGE,
    STAGES,
    classify_layer_ops,
    model_rule,
    probe_stage,
    sum_by_stage,
)
from ngra.characterize.workloads import Workload, build_ngra
from ngra.compiler.plan import Plan
from ngra.kernels import sparse_input
from ngra.memstat import peak_rss_bytes, reset_peak_rss, rss_bytes
from ngra import probes
from ngra.saga import SagaLayer
from ngra.compiler import disabled

__all__ = ["RunResult", "run_workload", "attribute_events", "plan_info", "FRAMEWORKS",
           "peak_rss_reset", "peak_rss_mb"]

FRAMEWORKS = ("ngra", "ngra-generic", "pyg", "dgl")


@dataclass
class RunResult:
    """What one run measured (seconds; MiB).

    Attributes:
        fwd, bwd: seconds per SAGA stage of the median instrumented iteration.
        total_s: that iteration's wall time; ``remainder_s = total_s - sum``.
        plain_s: median wall time of uninstrumented iterations (NaN if none ran).
        fused: per layer, whether its Scatter-ApplyEdge-Gather ran as one kernel.
        totals: every instrumented iteration's total (the reported one is the median).
        layers: the layer widths (:class:`~ngra.characterize.metrics.LayerDims` as dicts).
        input_nnz: non-zeros of the input features when the run multiplied them as a
            sparse matrix (ngra's :mod:`ngra.kernels.sparse_input`), else 0: the executed
            FLOPs of :func:`~ngra.characterize.metrics.model_counts` follow from it.
    """

    framework: str
    model: str
    dataset: str
    mode: str
    status: str = "ok"
    reason: str = ""
    fwd: dict[str, float] = field(default_factory=dict)
    bwd: dict[str, float] = field(default_factory=dict)
    total_s: float = float("nan")
    fwd_total_s: float = float("nan")
    plain_s: float = float("nan")
    fused: list[bool] = field(default_factory=list)
    peak_mb: float = float("nan")
    peak_note: str = ""
    repeats: int = 0
    warmup: int = 0
    num_nodes: int = 0
    num_edges: int = 0
    notes: list[str] = field(default_factory=list)
    totals: list[float] = field(default_factory=list)
    layers: list[dict] = field(default_factory=list)
    input_nnz: int = 0

    @property
    def stage_s(self) -> dict[str, float]:
        return {s: self.fwd.get(s, 0.0) + self.bwd.get(s, 0.0) for s in STAGES}

    @property
    def remainder_s(self) -> float:
        return self.total_s - sum(self.stage_s.values())


# ---------------------------------------------------------------- memory
def peak_rss_reset() -> tuple[float, str]:
    """Free what can be freed, reset the high-water mark; returns (baseline MiB, note)."""
    if reset_peak_rss():
        note = "peak RSS above the run's starting RSS (high-water mark reset per run)"
    else:
        note = "process lifetime peak RSS (high-water mark reset unavailable)"
    return rss_bytes() / 2**20, note


def peak_rss_mb() -> float:
    return peak_rss_bytes() / 2**20


# ---------------------------------------------------------------- steps
def _make_net(framework: str, w: Workload) -> tuple[torch.nn.Module, Callable[[], torch.Tensor]]:
    if framework in ("ngra", "ngra-generic"):
        net = build_ngra(w)
        return net, lambda: net(w.graph, w.x, w.edge_data)
    if framework == "pyg":
        from ngra.characterize.pyg_models import build_pyg

        net = build_pyg(w)
    elif framework == "dgl":
        from ngra.characterize.dgl_models import build_dgl

        net = build_dgl(w)
    else:
        raise ValueError(f"framework must be one of {FRAMEWORKS}; got {framework!r}.")
    return net, lambda: net(w.x)


class _Step:
    """One iteration; returns (t_start, t_forward_done, t_end)."""

    def __init__(self, net: torch.nn.Module, forward: Callable[[], torch.Tensor], w: Workload,
                 training: bool) -> None:
        self.net, self.forward, self.w, self.training = net, forward, w, training
        net.train(training)

    def __call__(self) -> tuple[float, float, float]:
        if not self.training:
            with torch.no_grad():
                t0 = time.perf_counter()
                self.forward()
                t1 = time.perf_counter()
            return t0, t1, t1
        for p in self.net.parameters():
            p.grad = None
        t0 = time.perf_counter()
        out = self.forward()
        m = self.w.train_mask
        loss = F.cross_entropy(out[m], self.w.y[m]) if bool(m.any()) else out.sum()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        return t0, t1, t2


# ---------------------------------------------------------------- instrumented
def _ngra_iteration(step: _Step) -> tuple[float, float, dict, dict, list[bool]]:
    """One iteration under the probes; each SAGA layer call is a ``layer<i>`` stage so
    that its ``pre`` and ``edge`` are read with its own plan (see :func:`plan_info`)."""

    layers = [m for m in step.net.modules() if isinstance(m, SagaLayer)]
    plans: dict[str, Any] = {}
    open_stages: list[Any] = []

    def enter(i: int) -> Callable[..., None]:
        def hook(module: Any, args: Any) -> None:
            open_stages.append(probes.stage(f"layer{i}").__enter__())
        return hook

    def leave(i: int) -> Callable[..., None]:
        def hook(module: Any, args: Any, out: Any) -> None:
            rec = probes.active()
            if rec is not None and rec.notes.get("plan"):
                plans[f"layer{i}"] = rec.notes["plan"][-1]
            open_stages.pop().__exit__(None, None, None)
        return hook

    handles = [h for i, m in enumerate(layers)
               for h in (m.register_forward_pre_hook(enter(i)),
                         m.register_forward_hook(leave(i)))]
    try:
        with probes.Recorder(backward=step.training) as rec:
            t0, t1, t2 = step()
    finally:
        for h in handles:
            h.remove()
    infos = {k: plan_info(v) for k, v in plans.items()}

    default = {"kind": "generic", "pre": "ApplyEdge"}

    def stage_of(path: tuple[str, ...] | None) -> str | None:
        if path is None:
            return None
        info = infos.get(path[0], default)
        if path[0] in infos or path[0].startswith("layer"):
            path = path[1:]
        if not path:
            return None  # the layer call outside its plan's stages: remainder
        if path[-1] == "pre":
            return info["pre"]
        return probe_stage(path[-1], info["kind"] != "generic")

    fwd = sum_by_stage((stage_of(p), t) for p, t in rec.exclusive().items())
    bwd = {s: 0.0 for s in STAGES}
    if step.training:
        bwd = sum_by_stage((stage_of(p), t) for p, t in rec.backward(t1, t2).items())
    fused = [infos[f"layer{i}"]["fused"] for i in range(len(layers)) if f"layer{i}" in infos]
    return t2 - t0, t1 - t0, fwd, bwd, fused


def plan_info(plan: Plan) -> dict[str, Any]:
    """What an ngra plan's stages hold.

    ``kind``: ``generic`` or the compiled plan's kind. ``fused``: the edge stage
    is one kernel (g-SpMM, softmax aggregation, fused edge kernel), not an
    interpreted per-edge program. ``pre``: the stage its vertex-side ``pre``
    belongs to: ApplyVertex when the compiler only moved a transform before
    propagation (reorder: GCN's, SAGE's ``lin``), else ApplyEdge (hoisted
    per-vertex edge terms: GAT's ``W h``, GG-NN's ``A_t h``).
    """
    kind, edge_kinds = plan.kind, plan.edge_kinds
    fused = kind != "generic" and not any(k in ("interp", "generic") for k in edge_kinds)
    fired = {n.name for n in plan.notes if n.fired}
    pre = "ApplyVertex" if "reorder" in fired and "hoist" not in fired else "ApplyEdge"
    return {"kind": kind, "fused": fused, "pre": pre, "edge_kinds": edge_kinds}


def _profile_iteration(step: _Step, framework: str) -> tuple[float, float, dict, dict, list[str]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0, t1, t2 = step()
    fwd, bwd, fused_ops = attribute_events(prof.events(), framework, step.w.model,
                                           step.w.num_edges)
    return t2 - t0, t1 - t0, fwd, bwd, fused_ops


def attribute_events(events: Any, framework: str, model: str,
                     num_edges: int | None) -> tuple[dict, dict, list[str]]:
    """Forward and backward seconds per stage from profiler ``events``.

    See :mod:`ngra.characterize.stages` for the rules. Returns
    ``(fwd, bwd, names of fused sparse kernels seen in Gather)``.
    """
    rule = model_rule(framework, model)
    fwd: list[tuple[str | None, float]] = []
    seq_stage: dict[int, str | None] = {}
    fused_ops: list[str] = []
    roots = [e for e in events if e.cpu_parent is None]
    roots.sort(key=lambda e: e.time_range.start)
    for layer in (e for e in roots if e.name == LAYER_RANGE):
        ops = sorted(layer.cpu_children, key=lambda e: e.time_range.start)
        stages = classify_layer_ops([(o.name, o.input_shapes) for o in ops], rule, num_edges)
        for op, st in zip(ops, stages):
            fwd.append((st, op.cpu_time_total * 1e-6))
            if st == "Gather" and op.name.startswith("GSpMM"):
                fused_ops.append(op.name)
            stack = [op]
            while stack:
                ev = stack.pop()
                if ev.sequence_nr is not None and ev.sequence_nr >= 0:
                    seq_stage[ev.sequence_nr] = st
                stack.extend(ev.cpu_children)
    prefix = "autograd::engine::evaluate_function: "
    bwd = [(seq_stage.get(e.sequence_nr), e.cpu_time_total * 1e-6)
           for e in roots if e.name.startswith(prefix)]
    return sum_by_stage(fwd), sum_by_stage(bwd), fused_ops


# ---------------------------------------------------------------- the run
def run_workload(framework: str, w: Workload, mode: str, *, repeats: int = 5, warmup: int = 2,
                 budget_s: float | None = None, plain: bool = True) -> RunResult:
    """Measure one run (see the module docstring).

    Args:
        plain: time ``repeats`` uninstrumented iterations too (else ``plain_s`` is NaN).
        budget_s: time this run may take; after the first warm-up iteration the
            repeat counts shrink to fit (at least one instrumented iteration),
            noted in ``notes``.
    """
    if mode not in ("inference", "training"):
        raise ValueError(f"mode must be 'inference' or 'training'; got {mode!r}.")
    res = RunResult(framework, w.model, w.dataset, mode, num_nodes=w.num_nodes,
                    num_edges=w.num_edges, notes=list(w.notes),
                    layers=[dataclasses.asdict(d) for d in w.layers])
    base_mb, res.peak_note = peak_rss_reset()
    training = mode == "training"
    torch.manual_seed(0)
    ctx = _generic_context() if framework == "ngra-generic" else contextlib.nullcontext()
    with ctx:
        net, forward = _make_net(framework, w)
        step = _Step(net, forward, w, training)
        t_start = time.perf_counter()
        t0, _, t2 = step()
        first = t2 - t0
        warm_left = max(warmup - 1, 0)
        instr_n = max(repeats, 1)
        plain_n = instr_n if plain else 0
        if budget_s is not None:
            spent = time.perf_counter() - t_start
            fit = int((budget_s - spent) / max(first, 1e-9))
            if fit < warm_left + plain_n + instr_n:
                warm_left = 0 if fit < 3 else min(warm_left, 1)
                avail = max(fit - warm_left, 1)
                instr_n = max(min(repeats, (avail + 1) // 2 if plain else avail), 1)
                plain_n = min(plain_n, max(avail - instr_n, 0))
                res.notes.append(f"repeats cut to {plain_n} plain + {instr_n} instrumented "
                                 f"to fit the {budget_s:.0f}s budget (first iteration "
                                 f"{first:.2f}s)")
        for _ in range(warm_left):
            step()
        plain_times = []
        for _ in range(plain_n):
            a, _, b = step()
            plain_times.append(b - a)
        rows = []
        for _ in range(instr_n):
            if framework in ("ngra", "ngra-generic"):
                total, ftot, fwd, bwd, fused = _ngra_iteration(step)
            else:
                total, ftot, fwd, bwd, fused_ops = _profile_iteration(step, framework)
                # one g-SpMM doing copy/u_mul_e + reduce with no Scatter op left is a fused Gather
                fused = [bool(fused_ops) and fwd["Scatter"] == 0.0] * len(w.layers)
            rows.append((total, ftot, fwd, bwd, fused))
    rows.sort(key=lambda r: r[0])
    total, ftot, fwd, bwd, fused = rows[(len(rows) - 1) // 2]
    res.total_s, res.fwd_total_s, res.fwd, res.bwd = total, ftot, fwd, bwd
    res.fused = fused or [False] * len(w.layers)
    res.totals = [r[0] for r in rows]
    res.plain_s = statistics.median(plain_times) if plain_times else float("nan")
    res.repeats, res.warmup = instr_n, warm_left + 1
    res.peak_mb = max(peak_rss_mb() - base_mb, 0.0)
    res.input_nnz = _sparse_input_nnz(framework, w)
    return res


def _sparse_input_nnz(framework: str, w: Workload) -> int:
    """Non-zeros of ``w.x`` if the timed iterations multiplied it as a CSR matrix, else 0.

    Only ngra's compiled plans call :func:`ngra.kernels.sparse_input.linear` in their
    layers (:func:`~ngra.characterize.metrics.input_linears`), which makes (and keeps,
    while ``x`` lives unmodified) the CSR copy at a tensor's second use: every iteration
    after the untimed first one used it when it exists now. Nothing else is asked: in
    one process the frameworks share ``x``, and its copy, with ngra; and asking about an
    ``x`` the kernel never saw would mark it seen.
    """
    x = w.x
    if (framework != "ngra" or not w.layers or not input_linears(w.layers[0])
            or x.device.type != "cpu" or x.numel() * x.element_size() < sparse_input.MIN_BYTES):
        return 0
    form = sparse_input.sparse_form(x)
    return int(form[0].values().numel()) if form is not None else 0


def _generic_context() -> Any:
    """``ngra.compiler.disabled()``: every SAGA layer on the generic executor."""

    return disabled()
