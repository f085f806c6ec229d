"""What link-prediction and graph-classification sessions share.

A task supplies what :func:`ngra.training.loop.fit` asks of a session: the batches of an
epoch, a forward and a loss for each, and an evaluation that returns the task's metric
on the training, validation and test parts (the loop selects the epoch with the best
validation value, as it does for node accuracy). Node classification is
:class:`ngra.training.loop.Session` itself.

The tasks themselves: :mod:`ngra.training.link_task`, :mod:`ngra.training.graph_task`
(on several processes: :mod:`ngra.training.link_ranks`, :mod:`ngra.training.graph_ranks`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ngra.memstat import io_read_bytes
from ngra.training.loop import host_context

__all__ = ["TaskSession"]


class TaskSession:
    """What link and graph sessions share with the node session's interface."""

    is_main = True
    placement = None

    def __init__(self, model: nn.Module, budget: str | None, info: dict[str, Any]) -> None:
        self.model = model
        self.budget = budget
        self.device = torch.device("cpu")
        self.info = dict(info)
        self.read_start = io_read_bytes()

    def context(self) -> Any:
        on_disk = self.info.get("storage") == "disk"
        return host_context(self.budget, self.x if on_disk else None)

    def capture_refusal(self) -> str | None:
        return f"a {self.task} task trains in eager steps (no CUDA graph)"

    def after_backward(self) -> None:
        """Nothing to sum over ranks: one process."""

    def step_begin(self) -> None:
        """Nothing to count."""

    def step_done(self) -> None:
        """Nothing to count."""

    def extra(self, times: list[float]) -> dict[str, Any]:
        return {"device": str(self.device), **self.info,
                "disk_read_mb": (io_read_bytes() - self.read_start) / 2**20,
                "placement": "cpu: host memory"}
