"""GPU backend: torch implementations for CUDA tensors.

Importing this package never needs CUDA (it registers its ops under ``"gpu"``);
a gpu kernel handed CPU tensors raises a clear RuntimeError. ``auto`` dispatch
only picks this backend for CUDA tensors.
"""

from ngra.kernels.gpu import dropout, edge_softmax, gsddmm, gspmm, segment_reduce, transpose  # noqa: F401

# softmax_aggregate is written in parallel (kernels/gpu/softmax_aggregate.py); it
# registers itself here once the file exists.
try:
    from ngra.kernels.gpu import softmax_aggregate  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "ngra.kernels.gpu.softmax_aggregate":
        raise

# fused_edge (element-wise Scatter-ApplyEdge-Gather) is written in parallel too.
try:
    from ngra.kernels.gpu import fused_edge  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "ngra.kernels.gpu.fused_edge":
        raise
