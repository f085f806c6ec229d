"""ngra.kernels: sparse operators every compiled SAGA program lowers to.

Graphs are CSC over destinations: ``indptr`` [num_dst + 1] and ``indices`` [E]
(source of each edge). Every op validates its arguments, supports autograd and
dispatches through the registry to a backend (``ref``: plain torch, ``cpu``:
numba, ``gpu``: torch on CUDA). ``rowdot`` is dense: plain torch on any device.
"""

from ngra.kernels.attention_aggregate import Recompute, attention_aggregate, keep_value
from ngra.kernels.dropout import EdgeDropout, dropout, dropout_rows
from ngra.kernels.dropout_linear import DropoutMasks, dropout_linear, dropout_masks
from ngra.kernels.edge_score import edge_score
from ngra.kernels.edge_softmax import edge_softmax
from ngra.kernels.gsddmm import gsddmm
from ngra.kernels.gspmm import gspmm
from ngra.kernels.pair_bce import pair_bce
from ngra.kernels.registry import (
    available,
    backward_only,
    current_backend,
    forward_skipped,
    lookup,
    register,
    use_backend,
)
from ngra.kernels.rowdot import rowdot
from ngra.kernels.segment_reduce import segment_reduce
from ngra.kernels.softmax_aggregate import softmax_aggregate, softmax_aggregate_backward
from ngra.kernels.transpose import transpose_csc

__all__ = [
    "DropoutMasks",
    "EdgeDropout",
    "Recompute",
    "attention_aggregate",
    "available",
    "backward_only",
    "current_backend",
    "dropout",
    "dropout_rows",
    "dropout_linear",
    "dropout_masks",
    "edge_score",
    "edge_softmax",
    "forward_skipped",
    "gsddmm",
    "gspmm",
    "pair_bce",
    "keep_value",
    "lookup",
    "register",
    "rowdot",
    "segment_reduce",
    "softmax_aggregate",
    "softmax_aggregate_backward",
    "transpose_csc",
    "use_backend",
]
