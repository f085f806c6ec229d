"""ngra.planner: how the dense layers of a model run on several devices.

A cost-model planner in the Piper / PipeDream-2BW family: a chain of dense layers
(:mod:`~ngra.planner.chain`, from a traced ``torch.nn.Module`` or a GNN's compiled
vertex-side stages) and a device description (:class:`Devices`: count, memory, the
calibrated link of :mod:`ngra.distributed.link`) go in; a ranked list of
:class:`ParallelPlan` s (data / tensor / pipeline parallel, micro-batches, recomputation) with
predicted time and memory comes out (:func:`search`); :func:`apply_plan` and
:class:`Runner` execute a plan with torch's own parallel APIs.
"""

from ngra.planner.chain import Chain, Layer
from ngra.planner.cost import Devices, Shape
from ngra.planner.execute import Runner, apply_plan
from ngra.planner.gnn import gnn_chain
from ngra.planner.plan import Breakdown, ParallelPlan, StagePlan, format_table, load_plans
from ngra.planner.search import NoFeasiblePlan, choose_plan, evaluate, exhaustive, search
from ngra.planner.trace import TraceError, trace_module

__all__ = ["Breakdown", "Chain", "Devices", "Layer", "NoFeasiblePlan", "ParallelPlan", "Runner",
           "Shape", "StagePlan", "TraceError", "apply_plan", "choose_plan", "evaluate", "exhaustive",
           "format_table", "gnn_chain", "load_plans", "search", "trace_module"]
