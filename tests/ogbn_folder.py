"""A tiny OGB node-property folder (``ogb:PATH``), written for a test: 3 vertices, 2 edges,
a split of one vertex each; ``feat`` is raw/node-feat's text (bad rows for damage tests)."""

from __future__ import annotations

import gzip
from pathlib import Path

FEAT = "0.1,0.2\n0.3,0.4\n0.5,0.6\n"


def ogbn_folder(folder: Path, feat: str = FEAT) -> Path:
    files = {"raw/edge.csv.gz": "0,1\n1,2\n", "raw/node-feat.csv.gz": feat,
             "raw/node-label.csv.gz": "0\n1\n0\n", "split/s/train.csv.gz": "0\n",
             "split/s/valid.csv.gz": "1\n", "split/s/test.csv.gz": "2\n"}
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(gzip.compress(text.encode()))
    return folder
