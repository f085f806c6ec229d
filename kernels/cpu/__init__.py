"""CPU backend: numba kernels, parallel over destination ranges, no atomics.

Importing this package registers every op under the ``"cpu"`` backend; it is
the only place in ngra that imports numba. If numba is missing the import fails
with ImportError and the registry falls back to ``"ref"``.
"""

from ngra.kernels.cpu import dropout, edge_softmax, gsddmm, gspmm, segment_reduce, transpose  # noqa: F401

# softmax_aggregate is written in parallel (kernels/cpu/softmax_aggregate.py); it
# registers itself here once the file exists.
try:
    from ngra.kernels.cpu import softmax_aggregate  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "ngra.kernels.cpu.softmax_aggregate":
        raise

# fused_edge (element-wise Scatter-ApplyEdge-Gather) is written in parallel too.
try:
    from ngra.kernels.cpu import fused_edge  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "ngra.kernels.cpu.fused_edge":
        raise
