"""Where this host's measured machine figures are cached: ``$NGRA_CALIBRATION``, else
``~/.ngra/calibration``.

The distributed link model (:mod:`ngra.distributed.link`) and the pinned copy bandwidth
of a device (:mod:`ngra.runtime.transfer`) are measured once per host and kept there, one
JSON file each, named for the host and what was measured.
"""

from __future__ import annotations

import socket
from pathlib import Path

from ngra.settings import get

__all__ = ["CALIBRATION_ENV", "calibration_file"]

CALIBRATION_ENV = "NGRA_CALIBRATION"


def calibration_file(kind: str, *parts: str) -> Path:
    """``<root>/<kind>-<host>-<parts...>.json``, each part reduced to file-name characters."""
    root = Path(get(CALIBRATION_ENV)).expanduser()
    name = "-".join([socket.gethostname(), *parts])
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return root / f"{kind}-{safe}.json"
