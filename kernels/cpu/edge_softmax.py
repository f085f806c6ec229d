"""numba edge softmax: per destination, max / exp-sum / normalize in one parallel pass.

Specializations: {float32, float64} (``indptr`` is always int64).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ngra.kernels.cpu.util import as_numpy, run_rows
from ngra.kernels.registry import register


@njit(cache=True, nogil=True)
def _edge_softmax(indptr, scores, out, v0, v1):
    nh = scores.shape[1]
    for v in range(v0, v1):
        lo, hi = indptr[v], indptr[v + 1]
        for h in range(nh):
            m = -np.inf
            for j in range(lo, hi):
                m = max(m, scores[j, h])
            total = 0.0
            for j in range(lo, hi):
                t = np.exp(scores[j, h] - m)
                out[j, h] = t
                total += t
            for j in range(lo, hi):
                out[j, h] /= total


@njit(cache=True, nogil=True)
def _edge_softmax_backward(indptr, p, grad, out, v0, v1):
    nh = p.shape[1]
    for v in range(v0, v1):
        lo, hi = indptr[v], indptr[v + 1]
        for h in range(nh):
            s = 0.0
            for j in range(lo, hi):
                s += p[j, h] * grad[j, h]
            for j in range(lo, hi):
                out[j, h] = p[j, h] * (grad[j, h] - s)


@register("edge_softmax", "cpu")
def edge_softmax(indptr: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """See :func:`ngra.kernels.ref.edge_softmax.edge_softmax`."""
    out = torch.empty_like(scores)
    ip = as_numpy(indptr)
    run_rows(_edge_softmax, ip, ip, as_numpy(scores), as_numpy(out))
    return out


@register("edge_softmax_backward", "cpu")
def edge_softmax_backward(
    indptr: torch.Tensor, p: torch.Tensor, grad: torch.Tensor
) -> torch.Tensor:
    """See :func:`ngra.kernels.ref.edge_softmax.edge_softmax_backward`."""
    out = torch.empty_like(p)
    ip = as_numpy(indptr)
    run_rows(_edge_softmax_backward, ip, ip, as_numpy(p), as_numpy(grad), as_numpy(out))
    return out
