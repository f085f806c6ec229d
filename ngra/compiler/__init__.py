"""ngra.compiler: lowers SAGA programs to kernel plans.

Until the tracing compiler lands, every program runs on the generic plan.
"""

from __future__ import annotations

from typing import Any

from ngra.runtime.generic import GenericPlan

__all__ = ["compile_layer"]


def compile_layer(layer: Any, graph: Any, x: Any, edata: Any) -> GenericPlan:
    return GenericPlan(layer, reason="compiler not yet available")
