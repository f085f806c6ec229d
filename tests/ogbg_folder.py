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


def ogbg_tasks_folder(root: Path, name: str = "tasks", num_graphs: int = 40, tasks: int = 3,
                      seed: int = 0, master: str | None = None) -> Path:
    """A multi-task binary OGB graph folder: ``num_graphs`` random graphs of 2-6 nodes,
    ``tasks`` 0/1 label columns with about a quarter of the entries empty (missing),
    node features that carry task 0's label, and a split whose parts each hold both
    labels of task 0. ``master``: the ``task type`` and ``eval metric`` rows of a
    master.csv written in the folder (e.g. ``"binary classification,ap"``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    f = root / name
    raw = f / "raw"
    nodes = rng.integers(2, 7, num_graphs)
    edges = [[int(rng.integers(0, n)), int(rng.integers(0, n))] for n in nodes for _ in range(n)]
    write_csv(raw / "num-node-list.csv", nodes.tolist())
    write_csv(raw / "num-edge-list.csv", nodes.tolist())  # as many edges as nodes
    write_csv(raw / "edge.csv", edges)
    labels = rng.integers(0, 2, (num_graphs, tasks))
    labels[:, 0] = np.arange(num_graphs) % 2
    rows = [["" if rng.random() < 0.25 and t else int(v) for t, v in enumerate(row)]
            for row in labels]
    write_csv(raw / "graph-label.csv", rows)
    feat = rng.standard_normal((int(nodes.sum()), 2)).round(3)
    feat[:, 0] += np.repeat(labels[:, 0], nodes)
    write_csv(raw / "node-feat.csv", feat.tolist())
    ids = np.arange(num_graphs)
    s = f / "split" / "scaffold"
    write_csv(s / "train.csv", ids[: num_graphs // 2].tolist())
    write_csv(s / "valid.csv", ids[num_graphs // 2: 3 * num_graphs // 4].tolist())
    write_csv(s / "test.csv", ids[3 * num_graphs // 4:].tolist())
    if master is not None:
        kind, metric = master.split(",")
        (f / "master.csv").write_text(f",{name}\ntask type,{kind}\neval metric,{metric}\n"
                                      f"add_inverse_edge,True\n")
    return f
