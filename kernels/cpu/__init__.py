"""CPU backend: numba kernels, parallel over destination ranges, no atomics.

Importing this package registers every op under the ``"cpu"`` backend; it is
the only place in ngra that imports numba. If numba is missing the import fails
with ImportError and the registry falls back to ``"ref"``.

:mod:`._target` sets the vector width of the generated code before anything compiles;
its :func:`load_implementations` loads numba's implementations ahead of the first kernel
call without ``scipy.linalg`` (a rank's fixed cost).
"""

from ngra.kernels.cpu import _target

_target.configure()
load_implementations = _target.load_implementations

from ngra.kernels.cpu import (  # noqa: E402, F401
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
