"""ngra's default optimizer: torch's Adam without importing ``torch._dynamo``.

``torch.optim.Optimizer`` wraps ``add_param_group``, ``zero_grad``, ``state_dict`` and
``load_state_dict`` in ``torch._disable_dynamo`` and every optimizer's ``step`` in
``_use_grad_for_differentiable``; each wrapper imports ``torch._dynamo`` on its first call
(torch 2.13: from the constructor's ``add_param_group``), and with it sympy and parts of
inductor: about 146 MB of RSS in every process that builds an optimizer, a third of a
rank's fixed cost (``experiments/rank_fixed_cost.py``). Outside ``torch.compile`` those
wrappers only disable a compiler that is not running (and ``step``'s sets grad mode to
``differentiable``), so :class:`Adam` calls the functions they wrap (``__wrapped__``, set by
their ``functools.wraps``) and does the grad-mode switch itself: the same arithmetic, the
same ``state_dict``, still a ``torch.optim.Adam`` (hooks, schedulers, ``isinstance``
checks). Nothing of torch is patched; other optimizers in the process are untouched. Should
a torch release drop ``__wrapped__``, the wrapped methods are called as they are (correct,
only the import comes back; ``tests/distributed/test_rank_fixed_cost.py`` notices).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.optim import Optimizer

__all__ = ["Adam"]


def _plain(fn: Any) -> Any:
    """``fn`` past its ``functools.wraps`` wrappers (itself when it has none)."""
    return inspect.unwrap(fn)


_ADD_PARAM_GROUP = _plain(Optimizer.add_param_group)
_ZERO_GRAD = _plain(Optimizer.zero_grad)
_STATE_DICT = _plain(Optimizer.state_dict)
_LOAD_STATE_DICT = _plain(Optimizer.load_state_dict)
# Adam.step may already carry Optimizer's profiling hook (set on the class by the first
# instance); unwrap reaches the plain step below both, and our own step gets the hook
_ADAM_STEP = _plain(torch.optim.Adam.step)


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` (same arguments, results and state) whose methods never import
    ``torch._dynamo`` (the module docstring says why that is safe)."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _ADD_PARAM_GROUP(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _ZERO_GRAD(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _LOAD_STATE_DICT(self, state_dict)

    def step(self, closure: Any = None) -> Any:
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _ADAM_STEP(self, closure)
