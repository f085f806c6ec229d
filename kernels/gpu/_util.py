"""Helpers shared by the CUDA backend."""

from __future__ import annotations

import torch


def require_cuda(*tensors: torch.Tensor | None) -> None:
    """Raise a clear error when a gpu kernel is handed non-CUDA tensors."""
    for t in tensors:
        if t is not None and t.device.type != "cuda":
            raise RuntimeError(
                f"the 'gpu' kernel backend needs CUDA tensors; got a tensor on {t.device}. "
                "Move the graph and features with .cuda(), or use the 'auto' backend."
            )
