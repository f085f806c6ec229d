"""Where this host's measured machine figures are cached: ``$NGRA_CALIBRATION``, else
``~/.ngra/calibration``.

The distributed link model (:mod:`ngra.distributed.link`) and the pinned copy bandwidth
of a device (:mod:`ngra.runtime.transfer`) are measured once per host and kept there, one
JSON file each, named for the host and what was measured, and written whole or not at
all (:func:`save_calibration`): a full disk leaves the previous file and no partial one.
"""

from __future__ import annotations

import glob
import json
import socket
from pathlib import Path
from typing import Any

from ngra.diskspace import collect_leftovers, write_file
from ngra.settings import get

__all__ = ["CALIBRATION_ENV", "calibration_file", "save_calibration"]

CALIBRATION_ENV = "NGRA_CALIBRATION"


def calibration_file(kind: str, *parts: str) -> Path:
    """``<root>/<kind>-<host>-<parts...>.json``, each part reduced to file-name characters."""
    root = Path(get(CALIBRATION_ENV)).expanduser()
    name = "-".join([socket.gethostname(), *parts])
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return root / f"{kind}-{safe}.json"


def save_calibration(path: Path, figures: dict[str, Any], what: str) -> None:
    """``figures`` as JSON to ``path`` (:func:`ngra.diskspace.write_file`: whole or not at
    all; a full disk is a :class:`~ngra.errors.DiskFullError` naming ``what``). The
    temporaries of an older ngra (``<name>.tmp<pid>``, beside the file) are collected
    too, once a day old."""
    collect_leftovers(path.parent, [f"{glob.escape(path.stem)}.tmp*"],
                      f"partial copies of {path.name}")
    write_file(path, json.dumps(figures, indent=1) + "\n", what)
