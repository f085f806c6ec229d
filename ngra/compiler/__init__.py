"""ngra.compiler: lowers SAGA programs to fused kernel plans.

``compile_layer(layer, graph, x, edata)`` traces ``apply_edge``/``apply_vertex``
with torch.fx into a small stage IR (:mod:`~ngra.compiler.ir`), runs the passes of
:mod:`~ngra.compiler.pipeline` (split, hoist, sink, reorder, contract, fuse) and
lowers the result to a plan (:mod:`~ngra.compiler.lower`; the plan's stages in
:mod:`~ngra.compiler.compiled` and :mod:`~ngra.compiler.edge_stage`, its explain text in
:mod:`~ngra.compiler.describe`). Every plan implements :class:`~ngra.compiler.plan.Plan`,
the interface the runtime calls. Programs it cannot fuse run on the generic executor,
with the reason (``ngra.explain`` shows what happened); ``disabled()`` turns compilation
off; inside ``strict()`` a failing pass raises instead of falling back. The compiler
imports neither the runtime that runs its plans nor the model zoo.
"""

from ngra.compiler.driver import clear_cache, compile_layer, disabled, is_enabled, set_enabled
from ngra.compiler.ir import IRError, Op, Program, verify
from ngra.compiler.pipeline import is_strict, strict
from ngra.compiler.plan import Plan, Pre

__all__ = [
    "compile_layer", "disabled", "is_enabled", "set_enabled", "clear_cache", "strict",
    "is_strict",
    "Op", "Program", "IRError", "verify", "Plan", "Pre",
]
