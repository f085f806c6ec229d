"""ngra.distributed: full-graph training over several processes (torch.distributed).

See :mod:`ngra.distributed.launch` (starting ranks, naming failures) and
:mod:`ngra.distributed.link` (the calibrated alpha-beta link model).
"""

from ngra.distributed.launch import DistributedError, in_worker, launch
from ngra.distributed.link import AlphaBeta, LinkModel, calibrate, link_model

__all__ = ["AlphaBeta", "DistributedError", "LinkModel", "calibrate", "in_worker", "launch",
           "link_model"]
