"""ngra.compiler: lowers SAGA programs to fused kernel plans.

``compile_layer(layer, graph, x, edata)`` traces ``apply_edge``/``apply_vertex``
with torch.fx into a small stage IR (:mod:`~ngra.compiler.ir`), runs the passes of
:mod:`~ngra.compiler.pipeline` (split, hoist, sink, reorder, contract, fuse) and
lowers the result to a plan (:mod:`~ngra.compiler.lower`); programs it cannot fuse
run on the generic executor, with the reason (``ngra.explain`` shows what happened);
``disabled()`` turns compilation off. The compiler imports neither the runtime that runs
its plans nor the model zoo.
"""

from ngra.compiler.driver import clear_cache, compile_layer, disabled, is_enabled, set_enabled
from ngra.compiler.ir import IRError, Op, Program, verify

__all__ = [
    "compile_layer", "disabled", "is_enabled", "set_enabled", "clear_cache",
    "Op", "Program", "IRError", "verify",
]
