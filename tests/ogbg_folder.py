"""A tiny OGB graph-property folder (``ogbg:PATH``), written for a test: four graphs."""

from __future__ import annotations

import gzip
from pathlib import Path

# four graphs: 3 nodes (a path), 2 nodes, 4 nodes (three edges), 1 node (no edge)
NODES = [3, 2, 4, 1]
EDGES = [[0, 1], [1, 2], [0, 1], [0, 1], [2, 3], [3, 0]]
EDGE_COUNTS = [2, 1, 3, 0]


def write_csv(path: Path, rows: list, gz: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(",".join(str(v) for v in (r if isinstance(r, list) else [r])) + "\n"
                   for r in rows)
    if gz:
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)


def ogbg_folder(root: Path, name: str = "mine", split: bool = True) -> Path:
    f = root / name
    raw = f / "raw"
    write_csv(raw / "num-node-list.csv", NODES)
    write_csv(raw / "num-edge-list.csv", EDGE_COUNTS)
    write_csv(raw / "edge.csv", EDGES)
    write_csv(raw / "graph-label.csv", [0, 1, 0, 1])
    write_csv(raw / "node-feat.csv", [[i, 10 * i] for i in range(sum(NODES))])
    write_csv(raw / "edge-feat.csv", [[i] for i in range(len(EDGES))], gz=False)
    if split:
        s = f / "split" / "scaffold"
        write_csv(s / "train.csv", [2, 0])
        write_csv(s / "valid.csv", [1])
        write_csv(s / "test.csv", [3])
    return f
