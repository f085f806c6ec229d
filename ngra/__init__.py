"""ngra: GNN layers as SAGA-NN vertex programs, compiled to fused, chunked sparse dataflows."""

from ngra.graph import CSR, Graph
from ngra.runtime.budget import memory_budget
from ngra.runtime.explain import explain
from ngra.saga import Edge, SagaLayer

__all__ = ["Graph", "CSR", "SagaLayer", "Edge", "explain", "memory_budget"]
__version__ = "0.1.0"
