"""GPU backend: Triton kernels for CUDA tensors (no CUDA C++, no build step).

Importing this package imports triton (the only place in ngra that does) and
registers every op under ``"gpu"``. Without triton the import fails with an
ImportError that says how to install it; the registry then falls back to ``"ref"``
(plain torch, which runs on CUDA too) and names that error when the ``gpu`` backend
is asked for explicitly.

The kernels also run on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``
set before this package is imported): that is how the test suite checks them on a
machine without a GPU. Otherwise a gpu kernel handed CPU tensors raises a clear
error.
"""

try:
    import triton  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        f"the 'gpu' kernel backend runs Triton kernels, and triton is not importable ({exc}). "
        "Install it with: pip install 'ngra[gpu]'"
    ) from exc

from ngra.kernels.gpu import (  # noqa: E402, F401
    dropout,
    edge_score,
    edge_softmax,
    fused_edge,
    gsddmm,
    gspmm,
    pair_bce,
    segment_reduce,
    softmax_aggregate,
    transpose,
)
