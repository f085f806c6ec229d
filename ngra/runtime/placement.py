"""Where full-graph training runs: ``--device`` and the device-memory placement decision.

On a CUDA device ngra trains **device-resident** when the whole working set fits: the
graph, the features, labels and masks, every layer's activations and the parameters
(with gradients and optimizer state) live on the GPU and the executor runs the plain
1 x 1 grid, with no host copies. When it does not fit, the graph and vertex data stay
in host memory, the model moves to the device, and every layer **streams** through the
device (:mod:`ngra.runtime.device_stream`: every stage on the device, chunks of host
rows copied in and results copied out on side streams) under a budget sized by the
device's memory (``--memory-budget`` when given, else the device's free memory less a
reserve), which :mod:`ngra.runtime.device_schedule` turns into a schedule.

The decision is a byte count, :func:`resident_bytes`, against the device's usable
memory, so it can be checked without a device: :func:`plan_placement` takes the device
memory as a number.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ngra.graph import Graph

__all__ = ["Placement", "device_memory", "plan_placement", "resident_bytes", "resolve_device",
           "move_to", "placed"]

#: Share of the device's free memory a placement may plan for (the CUDA context, the
#: caching allocator's fragmentation and cuBLAS workspaces take the rest).
USABLE_FRACTION = 0.85
#: Bytes per activation element kept per layer and vertex, in units of the widest
#: layer: the layer input, its transformed terms, the aggregation and the output,
#: and the gradients of two of them alive at once in backward.
ACTIVATION_COPIES = 6
#: Parameter copies: the parameter, its gradient, Adam's two moments.
PARAM_COPIES = 4


def resolve_device(name: str | torch.device) -> torch.device:
    """``"cpu"``, ``"cuda"`` or ``"cuda:N"`` as a device, checked against this machine.

    Raises:
        ValueError: an unknown device name, CUDA asked for where it is absent, or a
            CUDA index beyond the devices present.
    """
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"--device must be cpu, cuda or cuda:N; got {name!r}.") from exc
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu, cuda or cuda:N; got {name!r}.")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch is a CPU-only build" if torch.version.cuda is None
                   else "no CUDA device is visible")
            raise ValueError(f"--device {name}: CUDA is not available ({why}; torch "
                             f"{torch.__version__}). Use --device cpu.")
        count = torch.cuda.device_count()
        index = 0 if device.index is None else device.index
        if index >= count:
            raise ValueError(f"--device {name}: only {count} CUDA device(s) "
                             f"(cuda:0 .. cuda:{count - 1}).")
        device = torch.device("cuda", index)
    return device


def device_memory(device: torch.device) -> int:
    """Free bytes on a CUDA ``device`` now (``torch.cuda.mem_get_info``)."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def resident_bytes(graph: Graph, x: torch.Tensor, model: torch.nn.Module,
                   extra: int = 0) -> int:
    """Bytes a device-resident training step needs: the graph with its reverse CSR, the
    features, every layer's activations (:data:`ACTIVATION_COPIES` rows of the widest
    layer per vertex and layer), the parameters with gradients and Adam state, and
    ``extra`` (labels, masks, edge data)."""
    idx = graph.indices.element_size()
    factors = getattr(graph, "edge_factors", None)  # GCN's: two [N] factors, no [E] weight
    weights = (_nbytes(factors.src) + _nbytes(factors.dst) if factors is not None
               else _nbytes(graph.edge_weight))  # (reading edge_weight would make [E] here)
    structure = (2 * (graph.num_nodes + 1) * 8 + 2 * graph.num_edges * idx
                 + 2 * graph.num_edges * 8 + 2 * weights)
    params = list(model.parameters())
    widths = [x.shape[1] if x.dim() > 1 else 1] + [p.shape[0] for p in params if p.dim() == 2]
    layers = max(1, sum(1 for m in model.modules() if hasattr(m, "gather")))
    acts = ACTIVATION_COPIES * layers * graph.num_nodes * max(widths) * x.element_size()
    return structure + _nbytes(x) + acts + PARAM_COPIES * sum(_nbytes(p) for p in params) + extra


@dataclass(frozen=True)
class Placement:
    """How training runs on a device.

    Attributes:
        device: the compute device.
        resident: everything on the device (else: host data, tiles streamed to it).
        budget: the tile working-set budget in bytes for streaming (``None``: the 1 x 1
            grid; a resident run under ``--memory-budget`` keeps it as its budget).
        needed: :func:`resident_bytes` of this run.
        usable: the device bytes the decision allowed (``None`` on the CPU).
    """

    device: torch.device
    resident: bool
    budget: int | None
    needed: int
    usable: int | None

    def describe(self) -> str:
        if self.device.type == "cpu":
            return "cpu: host memory" + (f", tiles within {self.budget / 2**20:.0f} MiB"
                                         if self.budget else "")
        mib = 2**20
        if self.resident:
            return (f"{self.device}: device-resident (graph, features, activations and "
                    f"parameters on the device: ~{self.needed / mib:,.0f} MiB of "
                    f"{self.usable / mib:,.0f} MiB usable)")
        return (f"{self.device}: streaming (~{self.needed / mib:,.0f} MiB resident would "
                f"exceed {self.usable / mib:,.0f} MiB usable): graph and vertex data in host "
                f"memory, tiles staged to the device within {self.budget / mib:,.0f} MiB")


def plan_placement(device: torch.device, needed: int, device_bytes: int | None = None,
                   budget: int | None = None) -> Placement:
    """The placement of a run needing ``needed`` bytes resident.

    Args:
        device: the compute device (from :func:`resolve_device`).
        needed: :func:`resident_bytes` of the run.
        device_bytes: the device's free memory (default: measured on ``device``).
        budget: ``--memory-budget`` in bytes: on a device it caps what a resident run
            may use and sizes the streamed tiles; on the CPU it is the tile budget.

    Returns:
        resident when ``needed`` fits :data:`USABLE_FRACTION` of the device's free
        memory (and the budget); else streaming with the budget, or the usable device
        memory when no budget was given.
    """
    if device.type == "cpu":
        return Placement(device, True, budget, needed, None)
    free = device_memory(device) if device_bytes is None else int(device_bytes)
    usable = int(free * USABLE_FRACTION)
    if budget is not None:
        usable = min(usable, int(budget))
    if needed <= usable:
        return Placement(device, True, budget, needed, usable)
    return Placement(device, False, usable, needed, usable)


def move_to(device: torch.device, *items: Any) -> list[Any]:
    """Each of ``items`` on ``device``: tensors, :class:`~ngra.graph.Graph` s, dicts of
    tensors, modules (moved in place) and ``None``."""
    out = []
    for it in items:
        if isinstance(it, (torch.Tensor, torch.nn.Module, Graph)):
            it = it.to(device)
        elif isinstance(it, dict):
            it = {k: v.to(device) for k, v in it.items()}
        out.append(it)
    return out


@contextlib.contextmanager
def placed(placement: Placement) -> Iterator[None]:
    """The runtime settings of ``placement`` for a training step: a streaming placement
    streams every layer through its device within its budget
    (:func:`~ngra.runtime.device_schedule.device_streaming`); a resident one needs nothing
    (its tensors already live on the device) beyond its budget, if any."""
    from ngra.runtime.budget import memory_budget
    from ngra.runtime.device_schedule import device_streaming

    if not placement.resident:
        with device_streaming(placement.device, budget=placement.budget):
            yield
        return
    with contextlib.ExitStack() as stack:
        if placement.budget is not None:
            stack.enter_context(memory_budget(placement.budget))
        yield
