"""ngra.runtime: executes compiled layer plans over a grid of tiles."""

from ngra.runtime.budget import current_budget, memory_budget
from ngra.runtime.executor import execute, run_plan

__all__ = ["execute", "run_plan", "memory_budget", "current_budget"]
