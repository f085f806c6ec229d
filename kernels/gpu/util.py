"""Helpers shared by the Triton kernels: device checks, launch sizes, autotuning.

Autotuning: every tuned kernel takes its configurations (block sizes, warps) from
:func:`autotune`, which wraps ``triton.autotune`` keyed on a few launch shapes and
caches the winners on disk (triton's ``cache_results``). In Triton's interpreter
(``TRITON_INTERPRET=1``, CPU tensors) timing configurations means nothing, so only
the one marked for the interpreter runs (the widest: the interpreter pays per
operation, not per element).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import triton

__all__ = ["EDGE_CONFIGS", "INTERPRET", "autotune", "pow2", "require_cuda"]

#: The kernels were built for Triton's interpreter (``TRITON_INTERPRET=1`` when this
#: module was imported; ``triton.jit`` reads it when it decorates a kernel).
INTERPRET = bool(triton.knobs.runtime.interpret)


def require_cuda(*tensors: torch.Tensor | None) -> None:
    """Raise a clear error when a gpu kernel is handed non-CUDA tensors (CPU tensors are
    fine under Triton's interpreter)."""
    if INTERPRET:
        return
    for t in tensors:
        if t is not None and t.device.type != "cuda":
            raise RuntimeError(
                f"the 'gpu' kernel backend needs CUDA tensors; got a tensor on {t.device}. "
                "Move the graph and features with .cuda(), or use the 'auto' backend "
                "(TRITON_INTERPRET=1, set before ngra.kernels.gpu is imported, runs the "
                "Triton kernels on CPU tensors for testing)."
            )


def pow2(n: int, lo: int = 1) -> int:
    """The smallest power of two >= ``max(n, lo)`` (a block covering ``n`` lanes)."""
    return triton.next_power_of_2(max(int(n), lo))


def autotune(configs: Sequence[triton.Config], key: list[str],
             interpret: triton.Config | None = None) -> Callable:
    """``triton.autotune`` over ``configs`` keyed on ``key``, winners cached on disk;
    under the interpreter only ``interpret`` (default: the last config) runs."""
    chosen = interpret or configs[-1]

    def prune(configs, named_args, **kwargs):
        return [chosen] if INTERPRET else configs

    return triton.autotune(configs=list(configs), key=key, cache_results=True,
                           prune_configs_by={"early_config_prune": prune})


#: Configurations of the generated fused edge kernels (a program holds all F columns).
EDGE_CONFIGS = [triton.Config({"BLOCK_E": 8}, num_warps=2),
                triton.Config({"BLOCK_E": 16}, num_warps=4),
                triton.Config({"BLOCK_E": 32}, num_warps=4),
                triton.Config({"BLOCK_E": 32}, num_warps=8)]
