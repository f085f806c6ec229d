"""Two torch helpers, minus the 33 MB their torch versions import (issue 41).

``torch.broadcast_shapes`` (through ``torch._refs``) and ``torch.autograd.grad`` with
``grad_outputs`` (its ``_make_grads`` checks each gradient's shape with
``expect_true(sym_eq(...))``) import ``torch.fx.experimental.symbolic_shapes`` and with it
sympy: 31-33 MB that a rank of a Cora run (``experiments/rank_fixed_cost.py``) paid on its
first step for nothing symbolic. ngra's paths that a rank runs call these instead.

* :func:`broadcast_shape`: the same shape, by the same rule, in plain Python.
* :func:`vjp`: ``torch.autograd.grad(outputs, inputs, grad_outputs, ...)``. When every
  gradient is a tensor of its output's shape (what ``_make_grads`` checks, and then passes
  the gradients on unchanged), it hands them to the autograd engine the way
  ``torch.autograd.grad`` does after that check (``torch.autograd.graph``'s
  ``_engine_run_backward``); any other case (a ``None`` gradient, a nested tensor, a
  ``__torch_function__`` override, a torch without that function) goes to
  ``torch.autograd.grad`` itself. The gradients are the engine's either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

try:  # private: torch.autograd.grad's own call into the engine (torch >= 2.3)
    from torch.autograd.graph import _engine_run_backward
except ImportError:  # pragma: no cover - another torch: torch.autograd.grad throughout
    _engine_run_backward = None

__all__ = ["broadcast_shape", "vjp"]


def broadcast_shape(*shapes: Sequence[int]) -> torch.Size:
    """The shape ``shapes`` broadcast to, as ``torch.broadcast_shapes`` gives it. Raises
    ``RuntimeError`` as torch's does when two sizes of a dimension differ and neither is 1."""
    out: list[int] = []
    for shape in shapes:
        shape = tuple(shape)
        if len(shape) > len(out):
            out = [1] * (len(shape) - len(out)) + out
        for i, n in enumerate(shape, len(out) - len(shape)):
            if n != out[i] and n != 1:
                if out[i] != 1:
                    raise RuntimeError(f"shapes {[list(s) for s in shapes]} do not broadcast: "
                                       f"sizes {out[i]} and {n} at dimension {i}.")
                out[i] = n
    return torch.Size(out)


def vjp(outputs: torch.Tensor | Sequence[torch.Tensor],
        inputs: torch.Tensor | Sequence[torch.Tensor],
        grad_outputs: torch.Tensor | Sequence[torch.Tensor], *,
        allow_unused: bool = False, retain_graph: bool | None = None,
        create_graph: bool = False) -> tuple[torch.Tensor | None, ...]:
    """``torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=...,
    create_graph=..., allow_unused=...)``: the gradients of ``inputs`` (a tuple, ``None``
    for an unused input when ``allow_unused``), without importing sympy."""
    outs = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
    ins = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    grads = (grad_outputs,) if isinstance(grad_outputs, torch.Tensor) else tuple(grad_outputs)
    if (_engine_run_backward is None or not ins or len(grads) != len(outs)
            or torch.overrides.has_torch_function(outs + ins)
            or not all(isinstance(g, torch.Tensor) and not o.is_nested and not g.is_nested
                       and g.shape == o.shape and g.dtype.is_complex == o.dtype.is_complex
                       for o, g in zip(outs, grads))):
        return torch.autograd.grad(outs, ins, grads, retain_graph=retain_graph,
                                   create_graph=create_graph, allow_unused=allow_unused)
    return _engine_run_backward(outs, grads, create_graph if retain_graph is None
                                else retain_graph, create_graph, ins, allow_unused,
                                accumulate_grad=False)
