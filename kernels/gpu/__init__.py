"""GPU backend: torch implementations for CUDA tensors.

Importing this package never needs CUDA (it registers its ops under ``"gpu"``);
a gpu kernel handed CPU tensors raises a clear RuntimeError. ``auto`` dispatch
only picks this backend for CUDA tensors.
"""

from ngra.kernels.gpu import (  # noqa: F401
    dropout,
    edge_softmax,
    fused_edge,
    gsddmm,
    gspmm,
    segment_reduce,
    softmax_aggregate,
    transpose,
)
