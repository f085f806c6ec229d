"""Optional third-party imports used only by baselines, oracles and interop."""

from __future__ import annotations

import os
import sys
import types


def import_dgl():
    """Import DGL 2.1 on a newer torch.

    DGL 2.1's ``dgl.graphbolt`` needs a compiled library for the running torch and
    ``torchdata.datapipes``; neither exists for torch 2.13. The core (graphs,
    ``update_all``, ``dgl.ops``, ``dgl.nn``) works when an empty module stands in
    for ``dgl.graphbolt``. Raises ImportError if DGL is not installed.
    """
    os.environ.setdefault("DGLBACKEND", "pytorch")
    if "dgl" not in sys.modules:
        sys.modules.setdefault("dgl.graphbolt", types.ModuleType("dgl.graphbolt"))
    import dgl  # noqa: PLC0415

    return dgl


def import_pyg():
    """Import torch_geometric (ImportError if absent)."""
    import torch_geometric  # noqa: PLC0415

    return torch_geometric
