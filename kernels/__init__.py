"""ngra.kernels: sparse operators every compiled SAGA program lowers to."""

from ngra.kernels.registry import available, lookup, register, use_backend

__all__ = ["register", "lookup", "use_backend", "available"]
