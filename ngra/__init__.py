"""ngra: GNN layers as SAGA-NN vertex programs, compiled to fused, chunked sparse dataflows."""

from ngra.graph import CSR, Graph
from ngra.saga import Edge, SagaLayer
from ngra.runtime.budget import memory_budget
from ngra.compiler.explain import explain  # noqa: E402 - after the SAGA API it compiles

__all__ = ["Graph", "CSR", "SagaLayer", "Edge", "explain", "memory_budget"]
__version__ = "0.1.0"
