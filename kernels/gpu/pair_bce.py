"""``pair_bce`` on CUDA: the reference's plain torch (rows gathered per pair; no Triton
kernel yet), so link prediction trains on a GPU with the memory of the gathered rows."""

from __future__ import annotations

from ngra.kernels.ref.pair_bce import pair_bce
from ngra.kernels.registry import register

register("pair_bce", "gpu")(pair_bce)
