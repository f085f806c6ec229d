"""Reference backend: plain torch, obviously correct; the specification and test oracle.

Importing this package registers every op under the ``"ref"`` backend.
"""

from ngra.kernels.ref import (  # noqa: F401
    dropout,
    edge_score,
    edge_softmax,
    fused_edge,
    gsddmm,
    gspmm,
    pair_bce,
    segment_reduce,
    softmax_aggregate,
    sparse_input,
    transpose,
)
