"""ngra: GNN layers as SAGA-NN vertex programs, compiled to fused, chunked sparse dataflows."""

from ngra.errors import (
    CheckpointError,
    DamagedFileError,
    DatasetError,
    DatasetNotFoundError,
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
    # errors a user can catch (README: "Errors you may see")
    "CheckpointError", "DamagedFileError", "DatasetError", "DatasetNotFoundError",
    "DistributedError", "DownloadError", "SpecError", "TrainingDivergedError",
]
__version__ = "0.1.0"
