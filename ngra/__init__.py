"""ngra: GNN layers as SAGA-NN vertex programs, compiled to fused, chunked sparse dataflows."""

from ngra.errors import (
    CheckpointError,
    DamagedFileError,
    DatasetError,
    DatasetNotFoundError,
    DiskFullError,
    DistributedError,
    DownloadError,
    SpecError,
    TrainingDivergedError,
)
from ngra.graph import CSR, Graph
from ngra.runtime.budget import memory_budget
from ngra.runtime.explain import explain
from ngra.saga import Edge, SagaLayer

__all__ = [
    "Graph", "CSR", "SagaLayer", "Edge", "explain", "memory_budget",
    "fit", "load_model", "TrainResult",
    # errors a user can catch (README: "Errors you may see")
    "CheckpointError", "DamagedFileError", "DatasetError", "DatasetNotFoundError",
    "DiskFullError", "DistributedError", "DownloadError", "SpecError", "TrainingDivergedError",
]
__version__ = "0.1.0"

#: Loaded on first use, so ``import ngra`` stays light: ``ngra.fit``, ``ngra.datasets``, ...
_LAZY = {"fit": ("ngra.training", "fit"), "load_model": ("ngra.training", "load_model"),
         "TrainResult": ("ngra.training", "TrainResult"),
         "datasets": ("ngra.datasets", None), "models": ("ngra.models", None),
         "training": ("ngra.training", None), "planner": ("ngra.planner", None),
         "distributed": ("ngra.distributed", None)}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'ngra' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    value = importlib.import_module(module)
    return value if attr is None else getattr(value, attr)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
