"""The cost model: time and memory of one training step of a chain under a plan.

A plan runs a :class:`~ngra.planner.chain.Chain` on ``K = P * d * t`` devices
(:class:`Shape`): ``P`` pipeline stages of contiguous layers, each on a ``d x t``
grid, ``d`` data-parallel replicas (rows split, weights replicated) times ``t``
tensor-parallel ranks; the global batch of ``B`` rows runs as ``m`` micro-batches of
``r = ceil(B / (d m))`` rows per replica, scheduled 1F1B.

Per layer and micro-batch (:func:`layer_cost`), under tensor parallelism a Linear
``[r, a] x [a, b]`` runs as one of (Megatron's column/row pairs, torch's
``ColwiseParallel`` / ``RowwiseParallel``):

* ``rep``: whole on every rank;
* ``col``: output columns split (whole input in, shard out); backward all-reduces the
  input gradient over ``t``;
* ``col_gather``: ``col`` whose output is all-gathered (whole out);
* ``row``: input columns split (shard in), forward all-reduces the output;
* ``row_slice``: ``row`` on a whole input, sliced locally; backward all-gathers the
  input gradient.

A GEMM costs :meth:`LinkModel.matmul_time` by shape (forward ``[r,a]x[a,b]``;
backward the input gradient ``[r,b]x[b,a]``, skipped where no gradient flows, and the
weight gradient ``[b,r]x[r,a]``); element-wise and other row-wise ops cost their
bytes at the calibrated element-wise rate; a graph layer gathers its local edges'
rows (``edges / d * read_width * 4`` bytes at the random-gather rate) and exchanges
the halo, an ``all_to_all`` of ``halo(d) * exchange_width * 4`` bytes among the ``d``
replicas, or, for a layer that splits by columns over ``d`` ranks (``feature_width >=
d``), the feature layout's two transposes where they cost less
(:func:`graph_exchange`: ``2 all_to_all(rows / d * (d - 1) / d * exchange_width * 4)``,
the same gather work: every edge for ``1 / d`` of the columns); backward does both again
where a gradient flows. A graph layer needs all
rows at once (one micro-batch, one stage) and runs whole on each tensor-parallel rank.

A stage's micro-batch time ``u = forward + backward`` (plus the forward again under
activation recomputation, plus the point-to-point sends of the activation and its
gradient at the stage's cuts, plus DTensor's measured cost per split Linear). The
step is the 1F1B makespan plus what follows the pipeline flush::

    T = max((m - 1) max_s u'_s + sum_s u'_s,  m / P * sum_s u_s)
        + sum_s (allreduce_s + optimizer_s + accumulate_s)

The first term is the makespan (``(m + P - 1)(t_f + t_b)`` for ``P`` equal stages)
with ``u'`` computing at the rate of a rank alone (the link model's calibrated rates);
the second the work of all ranks spread over all of them at the rate of all computing
at once (those rates times ``LinkModel.shared``): where ranks share a host's cores
(``shared > 1``) the cores an idle stage leaves serve the busy ones, so a pipeline
takes the longer of the two; with a device per rank the makespan is always the longer.
``allreduce_s`` is DDP's ring all-reduce of the stage's local gradient among ``d``
replicas, in buckets (:func:`ddp_all_reduce`), counted one stage after the other (on
one host the groups share the loopback link; on separate links this overestimates
them). ``optimizer_s`` is Adam's passes over the local parameters and ``accumulate_s``
adding ``m - 1`` further micro-batches' gradients, each times ``shared / P``: every
rank steps at once, so the ``K = P d t`` ranks' work shares the host's ``K / shared``
cores (a data-parallel replica's full optimizer runs ``shared`` times slower than
alone; ``P`` pipeline stages, each with ``1 / P`` of the parameters, step side by
side).

Memory per device of stage ``s`` (:class:`StageCost.memory`): the local parameters
with their gradient, optimizer states and (``d > 1``) DDP's gradient buckets, plus
the activations of the micro-batches in flight (1F1B keeps ``k = min(m, P - s)``):
``k * A`` stored, or under recomputation ``k * In + A`` (only each micro-batch's stage
input kept, one micro-batch's activations made again in backward), plus the widest
layer's output and its gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from ngra.distributed.link import LinkModel
from ngra.planner.chain import Chain

__all__ = ["Devices", "Shape", "StageCost", "CONFIGS", "PARTS", "STEP_PARTS", "graph_exchange",
           "layer_configs",
           "layer_cost", "stage_cost", "ddp_all_reduce", "makespan_1f1b", "pipeline_time",
           "memory_bytes", "BYTES"]

BYTES = 4  # float32
#: per-microbatch time parts of a stage; STEP_PARTS follow the pipeline flush
PARTS = ("compute", "recompute", "tp_all_reduce", "tp_all_gather", "graph_exchange",
         "pipeline_p2p", "tp_overhead")
STEP_PARTS = ("dp_all_reduce", "optimizer", "grad_accumulation")
_C, _RC, _AR, _AG, _EX, _P2P, _TPO = range(7)
_N = len(PARTS)
#: tensor-parallel configurations: name -> (input layout, output layout); R whole, S split
CONFIGS = {"rep": ("R", "R"), "col": ("R", "S"), "col_gather": ("R", "R"),
           "row": ("S", "R"), "row_slice": ("R", "R"), "shard": ("S", "S")}
#: bytes Adam (torch's foreach implementation) reads and writes per parameter byte
ADAM_PASSES = 16
#: DDP's gradient buckets: the first (torch's _DEFAULT_FIRST_BUCKET_BYTES) and the rest
DDP_FIRST_BUCKET = 1 << 20
DDP_BUCKET = 25 << 20


@dataclass(frozen=True)
class Devices:
    """What the plan runs on.

    Attributes:
        count: devices (ranks).
        memory_bytes: memory per device for the plan's tensors.
        link: the calibrated link and compute rates (:mod:`ngra.distributed.link`).
        optimizer_states: float32 states per parameter (Adam: 2).
    """

    count: int
    memory_bytes: float
    link: LinkModel
    optimizer_states: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"devices must be an int >= 1; got {self.count!r}.")
        if not self.memory_bytes > 0:
            raise ValueError(f"memory per device must be > 0; got {self.memory_bytes!r}.")


class Shape(NamedTuple):
    """``pipeline`` stages x ``data`` replicas x ``tensor`` ranks, ``micro_batches``."""

    pipeline: int
    data: int
    tensor: int
    micro_batches: int

    def rows(self, chain: Chain) -> int:
        """Rows of one micro-batch on one replica (the busiest)."""
        return math.ceil(chain.rows / (self.data * self.micro_batches))


def makespan_1f1b(u: list[float], m: int) -> float:
    """1F1B time of ``m`` micro-batches through stages of per-microbatch time ``u``."""
    return (m - 1) * max(u) + sum(u)


def pipeline_time(costs: list[StageCost], m: int) -> tuple[float, float]:
    """``(critical path, shared work)`` of ``m`` micro-batches through ``costs``' stages.

    The critical path is the 1F1B makespan with each stage computing at the rate of a
    rank alone; the shared work is every rank's work spread over all ranks at the rate
    of all ranks computing (where ranks share cores, an idle stage's cores serve the
    busy ones). The pipeline takes the longer: with a device each (``shared == 1``)
    always the makespan; a single stage always the shared work, ``m`` micro-batches of
    its time."""
    path = makespan_1f1b([c.solo_time for c in costs], m)
    work = m / len(costs) * sum(c.time for c in costs)
    return path, work


def ddp_all_reduce(link: LinkModel, nbytes: float, d: int) -> float:
    """DDP's all-reduce of ``nbytes`` of gradient among ``d`` replicas, in buckets: each
    bucket pays the ring's ``2(d-1)`` latency steps."""
    if d < 2 or nbytes <= 0:
        return 0.0
    buckets = 1 + math.ceil(max(nbytes - DDP_FIRST_BUCKET, 0) / DDP_BUCKET)
    step = link.all_reduce(0.0, d)  # the latency of one call
    return link.all_reduce(nbytes, d) + (buckets - 1) * step


def memory_bytes(param_bytes: float, saved: float, stage_input: float, transient: float,
                 in_flight: int, recompute: bool, d: int, optimizer_states: int) -> float:
    """Peak bytes on one device of a stage (see the module docstring)."""
    weights = param_bytes * (2 + optimizer_states + (1 if d > 1 else 0))
    acts = in_flight * stage_input + saved if recompute else in_flight * saved
    return weights + acts + transient


def layer_configs(chain: Chain, i: int, t: int) -> list[str]:
    """Tensor-parallel configurations layer ``i`` may take on ``t`` ranks (see
    :data:`CONFIGS`): those its splits and widths allow, with the DAG's rule that a
    split passes only between a layer and the next when nothing else reads it."""
    layer = chain.layers[i]
    if t == 1:
        return ["rep"]
    out = ["rep"]
    if layer.kind == "linear":
        if "col" in layer.splits and layer.out_width % t == 0:
            out += ["col", "col_gather"]
        if "row" in layer.splits and layer.in_width % t == 0:
            out += ["row", "row_slice"]
    elif layer.kind == "elementwise" and layer.out_width % t == 0:
        out.append("shard")
    last = i == len(chain.layers) - 1
    whole_out = last or chain.readers[i] != (i + 1,)
    whole_in = not chain.chained(i)
    return [c for c in out if not (whole_in and CONFIGS[c][0] == "S")
            and not (whole_out and CONFIGS[c][1] == "S")]


def layer_cost(chain: Chain, i: int, link: LinkModel, shape: Shape,
               config: str) -> tuple[tuple[float, ...], tuple[float, ...], float, float]:
    """``(forward parts, backward parts, local parameter bytes, saved bytes)`` of layer ``i``
    for one micro-batch on one device; parts are indexed as :data:`PARTS`."""
    layer = chain.layers[i]
    d, t = shape.data, shape.tensor
    r = shape.rows(chain)
    grad = chain.grad_flows[i]
    f = [0.0] * _N
    b = [0.0] * _N
    params = float(layer.param_bytes)
    saved = float(r * layer.saved_width * BYTES)
    if layer.kind == "linear":
        a, o = layer.in_width, layer.out_width
        if config in ("col", "col_gather"):
            o //= t
            params /= t
            if grad:
                b[_AR] = link.all_reduce(r * a * BYTES, t)
            if config == "col_gather":
                f[_AG] = link.all_gather(r * layer.out_width * BYTES, t)
        elif config in ("row", "row_slice"):
            a //= t
            params /= t
            saved /= t
            f[_AR] = link.all_reduce(r * o * BYTES, t)
            if config == "row_slice" and grad:
                b[_AG] = link.all_gather(r * layer.in_width * BYTES, t)
        f[_C] = link.matmul_time(r, a, o)
        b[_C] = link.matmul_time(o, r, a) + (link.matmul_time(r, o, a) if grad else 0.0)
        if config != "rep" and link.tp_layer is not None:  # measured forward + backward
            f[_TPO] = b[_TPO] = link.tp_layer(r * layer.out_width * BYTES) / 2
    elif layer.kind == "graph":
        f[_C] = link.gather_time(layer.edges / d * layer.read_width * BYTES)
        f[_EX] = graph_exchange(chain, layer, link, d)[1]
        if grad:  # the gradients of the gathered rows go back the same way
            b[_C], b[_EX] = f[_C], f[_EX]
    else:
        w_in, w_out = layer.in_width, layer.out_width
        if config == "shard":
            w_in, w_out, saved = w_in / t, w_out / t, saved / t
        f[_C] = link.stream_time(r * (w_in + w_out) * BYTES)
        b[_C] = link.stream_time(r * (w_in + 2 * w_out) * BYTES) if grad else 0.0
    return tuple(f), tuple(b), params, saved


def graph_exchange(chain: Chain, layer: Any, link: LinkModel, d: int) -> tuple[str, float]:
    """``(layout, seconds)`` of graph ``layer``'s forward exchange among ``d`` data-parallel
    ranks: the halo's ``all_to_all``, or the feature layout's two transposes where the
    layer splits by columns over ``d`` ranks and they cost less (module docs)."""
    halo = link.all_to_all(chain.halo_rows(d) * layer.exchange_width * BYTES, d)
    if d < 2 or layer.feature_width < d:
        return "halo", halo
    feature = 2 * link.all_to_all(chain.rows / d * (d - 1) / d * layer.exchange_width * BYTES,
                                  d)
    return ("feature", feature) if feature < halo else ("halo", halo)


@dataclass(frozen=True)
class StageCost:
    """One stage's costs (see the module docstring).

    Attributes:
        parts: per-microbatch time by :data:`PARTS`; ``time`` is their sum.
        forward, backward: per-microbatch forward and backward (with recomputation and
            the stage's sends) seconds.
        step_parts: after the flush, by :data:`STEP_PARTS`.
        param_bytes: local parameter bytes per device.
        saved: activation bytes one micro-batch keeps; stage_input: its input bytes.
        transient: the widest output and its gradient.
    """

    parts: tuple[float, ...]
    forward: float
    backward: float
    step_parts: tuple[float, float]
    param_bytes: float
    saved: float
    stage_input: float
    transient: float
    recompute: bool
    shared: float = 1.0

    @property
    def time(self) -> float:
        return sum(self.parts)

    @property
    def solo_parts(self) -> tuple[float, ...]:
        """:attr:`parts` with the compute at the rate of a rank computing alone."""
        return tuple(v / self.shared if k in (_C, _RC) else v for k, v in enumerate(self.parts))

    @property
    def solo_time(self) -> float:
        return sum(self.solo_parts)

    @property
    def step_time(self) -> float:
        return sum(self.step_parts)

    def memory(self, in_flight: int, d: int, optimizer_states: int) -> float:
        return memory_bytes(self.param_bytes, self.saved, self.stage_input, self.transient,
                            in_flight, self.recompute, d, optimizer_states)


def stage_edges(chain: Chain, devices: Devices, shape: Shape, i: int, j: int
                ) -> tuple[float, float, float, float]:
    """``(p2p forward, p2p backward, stage input bytes, transient bytes)`` of a stage of
    layers ``[i, j)``: the sends at its cuts, what it keeps per micro-batch under
    recomputation, and its widest output with its gradient."""
    r = shape.rows(chain)
    link = devices.link
    send = link.p2p(r * chain.cut_width(j) * BYTES, shape.pipeline) if j < len(chain) else 0.0
    back = link.p2p(r * chain.cut_width(i) * BYTES, shape.pipeline) if i > 0 else 0.0
    stage_input = r * (chain.cut_width(i) if i > 0 else chain.input_width) * BYTES
    transient = 2.0 * r * max(chain.layers[k].out_width for k in range(i, j)) * BYTES
    return send, back, stage_input, transient


def finish_stage(devices: Devices, shape: Shape, fwd: list[float], bwd: list[float],
                 params: float, saved: float, edges: tuple[float, float, float, float],
                 recompute: bool) -> StageCost:
    """A :class:`StageCost` from the summed layer parts of a stage."""
    send, back, stage_input, transient = edges
    link = devices.link
    parts = [x + y for x, y in zip(fwd, bwd)]
    parts[_C] *= link.shared  # the rates are a rank's alone; all ranks compute at once
    forward = sum(fwd) + send
    backward = sum(bwd) + back
    if recompute:
        parts[_RC] += sum(fwd) + fwd[_C] * (link.shared - 1)
        backward += sum(fwd)
    parts[_P2P] += send + back
    # every rank steps its optimizer at once after the flush: the work of all K ranks
    # over the host's cores, K / shared of them, is stage s's work times shared / P
    spread = link.shared / shape.pipeline
    step = (ddp_all_reduce(link, params, shape.data),
            link.stream_time(params * ADAM_PASSES) * spread,
            (shape.micro_batches - 1) * link.stream_time(3 * params) * spread)
    return StageCost(tuple(parts), forward, backward, step, params, saved, stage_input,
                     transient, recompute, link.shared)


def stage_cost(chain: Chain, devices: Devices, shape: Shape, i: int, j: int,
               configs: tuple[str, ...], recompute: bool) -> StageCost:
    """The cost of layers ``[i, j)`` as one stage with per-layer ``configs``.

    Raises:
        ValueError: a configuration the layer does not allow, or layouts that do not
            chain (a split output must meet a layer that takes a split input).
    """
    if len(configs) != j - i:
        raise ValueError(f"stage [{i}, {j}) needs {j - i} configurations; got {len(configs)}.")
    fwd, bwd = [0.0] * _N, [0.0] * _N
    params = saved = 0.0
    layout = "R"
    for k, config in zip(range(i, j), configs):
        allowed = layer_configs(chain, k, shape.tensor)
        if config not in allowed:
            raise ValueError(f"layer {k} ({chain.layers[k].name}) cannot run {config!r} on "
                             f"{shape.tensor} ranks; allowed: {allowed}.")
        lin, lout = CONFIGS[config]
        if lin != layout:
            raise ValueError(f"layer {k} ({chain.layers[k].name}) takes a "
                             f"{'split' if lin == 'S' else 'whole'} input after a "
                             f"{'split' if layout == 'S' else 'whole'} output.")
        layout = lout
        f, b, p, s = layer_cost(chain, k, devices.link, shape, config)
        fwd = [x + y for x, y in zip(fwd, f)]
        bwd = [x + y for x, y in zip(bwd, b)]
        params += p
        saved += s
    if layout != "R":
        raise ValueError(f"stage [{i}, {j}) ends on a split output; a stage's output is whole.")
    return finish_stage(devices, shape, fwd, bwd, params, saved,
                        stage_edges(chain, devices, shape, i, j), recompute)
