"""ngra: GNN layers as SAGA-NN vertex programs, compiled to fused, chunked sparse dataflows."""

from ngra.graph import CSR, Graph
from ngra.saga import Edge, SagaLayer

__all__ = ["Graph", "CSR", "SagaLayer", "Edge"]
__version__ = "0.1.0"
