"""Graph classification trains on a dataset's own split (an OGB graph folder's), through
``ngra.fit``; needs run.py to ask graph_task.graph_parts for the parts."""

from __future__ import annotations

import ngra
import ngra.training.run as run
from ogbg_folder import ogbg_folder


def test_fit_trains_on_the_folders_split(tmp_path, monkeypatch):
    seen = {}

    class Recording(run.GraphSession):
        def __init__(self, model, ds, parts, **kw):
            seen.update({k: v.tolist() for k, v in parts.items()})
            super().__init__(model, ds, parts, **kw)

    monkeypatch.setattr(run, "GraphSession", Recording)
    r = ngra.fit("gin", f"ogbg:{ogbg_folder(tmp_path)}", task="graph", epochs=2, batch_size=2,
                 progress=False)
    assert seen == {"train": [0, 2], "val": [1], "test": [3]}
    assert r.summary["dataset_summary"]["split"] == {"train": 2, "val": 1, "test": 1}
