"""ngra.runtime: executes compiled layer plans over a grid of tiles."""

from ngra.runtime.executor import execute

__all__ = ["execute"]
