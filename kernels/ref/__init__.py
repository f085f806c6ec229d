"""Reference backend: plain torch, obviously correct; the specification and test oracle.

Importing this package registers every op under the ``"ref"`` backend.
"""

from ngra.kernels.ref import dropout, edge_softmax, gsddmm, gspmm, segment_reduce, transpose  # noqa: F401

# softmax_aggregate is written in parallel (kernels/ref/softmax_aggregate.py); it
# registers itself here once the file exists.
try:
    from ngra.kernels.ref import softmax_aggregate  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "ngra.kernels.ref.softmax_aggregate":
        raise

# fused_edge (element-wise Scatter-ApplyEdge-Gather) is written in parallel too.
try:
    from ngra.kernels.ref import fused_edge  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "ngra.kernels.ref.fused_edge":
        raise
