"""Can a node-classification model train on this dataset, and its accuracies mean something?

:func:`check_trainable` runs before training (``ngra train`` calls it) and raises a
:class:`~ngra.errors.DatasetError` naming the dataset and the figure that makes
training meaningless: no vertices, no feature columns, non-finite features or edge
weights, no labelled vertices, fewer than two classes, an empty train, validation
or test split, a split that selects unlabelled vertices, splits that share vertices
(a vertex tested on after being trained on; ``allow_overlap=True`` lets them), or a
train split with a single class. A graph with no edges passes with a warning: models
that also read a vertex's own features train on it as MLPs.
"""

from __future__ import annotations

import logging

import torch

from ngra.mapped import release_mapped

from .base import DatasetError, NodeDataset
from .graphs import GraphDataset

__all__ = ["check_trainable"]

log = logging.getLogger(__name__)

_MAX_SPARSE_CLASSES = 1000  # more classes than labelled vertices beyond this: ids, not classes
_BLOCK = 1 << 22  # elements per finiteness scan block (16 MiB of float32)
_SPLITS = (("train", "train_mask"), ("validation", "val_mask"), ("test", "test_mask"))


def check_trainable(ds: NodeDataset, name: str | None = None,
                    allow_overlap: bool = False) -> None:
    """Raise :class:`DatasetError` if training on ``ds`` cannot give a meaningful accuracy.

    Args:
        ds: the dataset.
        name: how the user named it (the spec string), for messages (default: ``ds.name``).
        allow_overlap: let the train, validation and test splits share vertices
            (default: ``False``, refused with the counts).
    """
    name = name or ds.name
    if isinstance(ds, GraphDataset):
        raise DatasetError(
            f"{name} is a graph-classification dataset ({len(ds)} graphs, one label each); "
            "node-classification training needs a NodeDataset (one label per vertex). Train "
            "graph classification on it: ngra train --task graph (ngra.fit(..., "
            "task='graph')).")
    n = ds.num_nodes
    if n == 0:
        raise DatasetError(f"{name} has 0 vertices; there is nothing to train on.")
    if ds.num_features == 0:
        raise DatasetError(f"{name} has 0 feature columns; a model needs at least one.")
    _check_finite(f"features (x) of {name}", ds.x, "vertex, column")
    if ds.graph.edge_weight is not None:
        _check_finite(f"edge weights of {name}", ds.graph.edge_weight, "CSC edge")
    labelled = ds.y >= 0
    num_labelled = int(labelled.sum())
    if num_labelled == 0:
        raise DatasetError(f"{name} has 0 labelled vertices (every label is -1).")
    classes = torch.unique(ds.y[labelled])
    if ds.num_classes > max(_MAX_SPARSE_CLASSES, num_labelled):
        raise DatasetError(
            f"{name} declares {ds.num_classes:,} classes for {num_labelled:,} labelled vertices "
            f"({classes.numel()} labels occur); the model would need {ds.num_classes:,} outputs. "
            "Renumber the labels densely (0..C-1)."
        )
    if classes.numel() < 2:
        raise DatasetError(
            f"{name} has 1 class among its {num_labelled} labelled vertices (label "
            f"{int(classes[0])}); a classifier needs at least 2."
        )
    for split, attr in _SPLITS:
        mask = getattr(ds, attr)
        size = int(mask.sum())
        if size == 0:
            raise DatasetError(
                f"{split} split of {name} has 0 vertices (of {n}, {num_labelled} labelled). "
                "Give it vertices: a larger graph, or larger split fractions (the spec keys "
                "train= and val= of generated and edge-list datasets)."
            )
        unlabelled = int((mask & ~labelled).sum())
        if unlabelled:
            raise DatasetError(
                f"{split} split of {name} selects {unlabelled} unlabelled vertices (label -1) "
                f"of its {size}; a split may select labelled vertices only."
            )
    if not allow_overlap:
        _check_disjoint(ds, name)
    train_classes = torch.unique(ds.y[ds.train_mask])
    if train_classes.numel() < 2:
        raise DatasetError(
            f"train split of {name} holds 1 class (label {int(train_classes[0])}) in its "
            f"{int(ds.train_mask.sum())} vertices; the model could only learn to predict it. "
            "Give the train split more vertices."
        )
    if ds.graph.num_edges == 0:
        log.warning("%s has no edges: models see each vertex's own features only", name)


def _check_disjoint(ds: NodeDataset, name: str) -> None:
    """Refuse splits that share vertices, with each split's size and the shared count."""
    masks = [(split, getattr(ds, attr)) for split, attr in _SPLITS]
    shared = []
    for i, (a, ma) in enumerate(masks):
        for b, mb in masks[i + 1:]:
            k = int((ma & mb).sum())
            if k:
                shared.append(f"{a} and {b} share {k} (of {int(ma.sum())} and {int(mb.sum())})")
    if shared:
        raise DatasetError(
            f"the splits of {name} overlap: {'; '.join(shared)} vertices. A vertex evaluated "
            "after being trained on inflates the accuracy. Make the masks disjoint, or pass "
            "--allow-split-overlap (allow_split_overlap=True) to train anyway.")


def _check_finite(what: str, t: torch.Tensor, index_names: str) -> None:
    """Raise if ``t`` holds nan/inf; scans row blocks, so no full-size mask is made."""
    rows = max(1, _BLOCK // max(1, t[:1].numel()))
    count, first = 0, None
    for start in range(0, t.shape[0], rows):
        block = t[start : start + rows]
        # a nan/inf makes the sum non-finite: a clean block costs no temporary (a finite
        # block whose sum overflows takes the mask path and is found clean there)
        if not block.is_floating_point() or torch.isfinite(block.sum()):
            release_mapped(t, start, start + rows)  # storage=disk: keep one block resident
            continue
        bad = ~torch.isfinite(block)
        release_mapped(t, start, start + rows)
        k = int(bad.sum())
        if k and first is None:
            first = [int(i) for i in bad.nonzero()[0]]
            first[0] += start
        count += k
    if first is not None:
        where = ", ".join(f"{k} {i}" for k, i in zip(index_names.split(", "), first))
        raise DatasetError(
            f"{count} {what} are not finite (nan or inf), the first at {where} "
            f"({float(t[tuple(first)])}). Clean them before training (e.g. torch.nan_to_num, "
            "or drop the vertices)."
        )
