"""``Edge``: what a SAGA program's ``apply_edge`` sees (the Scatter of SAGA-NN).

The compiler traces ``apply_edge`` with an ``Edge`` of proxies; the generic plan
calls it with an ``Edge`` over a tile's staged vertex rows. Rows are gathered
on first access, so a program that never reads ``edge.dst`` never pays for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["Edge", "index_rows"]


class Edge:
    """What ``apply_edge`` sees: per-edge views of vertex and edge data.

    Attributes:
        src: source-vertex rows per edge, ``[E, ...]`` (a dict when vertex data is a dict).
        dst: destination-vertex rows per edge, ``[E, ...]``.
        data: per-edge data ``[E, ...]``, a dict, or ``None``.

    ``src`` and ``dst`` are gathered on first access, so a program that never
    reads ``edge.dst`` never pays for it.
    """

    __slots__ = ("_vsrc", "_vdst", "_src_idx", "_dst_idx", "_src", "_dst", "data")

    def __init__(self, src_data: Any, dst_data: Any, src_idx: torch.Tensor | None,
                 dst_idx: torch.Tensor | None, data: Any) -> None:
        self._vsrc, self._vdst = src_data, dst_data
        self._src_idx, self._dst_idx = src_idx, dst_idx
        self._src = self._dst = None
        self.data = data

    @property
    def src(self) -> Any:
        if self._src is None:
            self._src = index_rows(self._vsrc, self._src_idx)
        return self._src

    @property
    def dst(self) -> Any:
        if self._dst is None:
            self._dst = index_rows(self._vdst, self._dst_idx)
        return self._dst


def index_rows(data: Any, idx: torch.Tensor | None) -> Any:
    """``data[idx]`` for a tensor or each tensor of a dict; ``idx=None`` means all rows."""
    if idx is None or data is None:
        return data
    if isinstance(data, Mapping):
        return {k: v.index_select(0, idx) for k, v in data.items()}
    return data.index_select(0, idx)
