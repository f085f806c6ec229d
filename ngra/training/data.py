"""What a run trains on: any data a user hands over, as one ``NodeDataset``, prepared.

:func:`as_dataset` takes a dataset spec string (``"cora"``, ``"edgelist:f.csv,features=x.npy"``,
loaded by :func:`ngra.datasets.load`), a :class:`~ngra.datasets.NodeDataset`, a PyG ``Data``
(:func:`ngra.datasets.from_pyg`, its own masks kept), a DGL graph
(:func:`ngra.datasets.from_dgl`), or a ``dict`` of tensors (``edge_index`` and ``x`` and ``y``
and the masks ``train_mask``/``val_mask``/``test_mask``, ``num_nodes`` optional).

:func:`prepare_dataset` is what a run does to it before training (relabeling for locality,
row-normalized features); :func:`fingerprint` names the data a checkpoint was trained on.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ngra.datasets import NodeDataset, check_trainable, from_dgl, from_pyg, load
from ngra.errors import DatasetError
from ngra.graph import Graph
from ngra.mapped import is_mapped, release_mapped
from ngra.partition import reorder_dataset

__all__ = ["as_dataset", "dataset_label", "fingerprint", "normalize_features",
           "prepare_dataset"]

log = logging.getLogger(__name__)

_MASKS = ("train_mask", "val_mask", "test_mask")


def as_dataset(data: Any, *, root: str | None = None, storage: str = "memory",
               budget: int | None = None, check: bool = True,
               allow_overlap: bool = False) -> NodeDataset:
    """``data`` as a :class:`NodeDataset` (module docstring); with ``check``, refused
    (:class:`~ngra.errors.DatasetError`) when training on it cannot mean anything
    (:func:`ngra.datasets.check_trainable`; ``allow_overlap``: splits may share vertices).

    Raises:
        TypeError: ``data`` is none of the accepted kinds.
    """
    if isinstance(data, str):
        ds = load(data, root=root, storage=storage, budget=budget)
        label = data
    elif isinstance(data, NodeDataset):
        ds, label = data, data.info.get("spec", data.name)
    elif isinstance(data, dict):
        ds, label = _from_tensors(data, labels=check), "tensors"
    elif hasattr(data, "ndata") and hasattr(data, "edata"):
        ds, label = from_dgl(data), "dgl"
    elif hasattr(data, "edge_index") and hasattr(data, "x"):
        ds, label = from_pyg(data), "pyg"
    else:
        raise TypeError(f"data must be a dataset spec string, a NodeDataset, a PyG Data, a "
                        f"DGL graph or a dict of tensors (edge_index, x, y, masks); got "
                        f"{type(data).__name__}.")
    if check:
        check_trainable(ds, label, allow_overlap=allow_overlap)
    return ds


def dataset_label(data: Any, ds: NodeDataset) -> str:
    """How a run names its data (the spec string, else the dataset's name)."""
    return data if isinstance(data, str) else ds.info.get("spec", ds.name)


def _from_tensors(d: dict[str, Any], labels: bool = True) -> NodeDataset:
    """A dataset from ``{"edge_index", "x", "y", "train_mask", ...}`` tensors. Without
    ``labels`` (data to predict on, or to embed) ``y`` and the masks may be left out: every
    vertex is then unlabeled (``-1``)."""
    missing = [k for k in ("edge_index", "x", "y") if k not in d and (labels or k != "y")]
    if missing:
        raise DatasetError(f"a dict of tensors needs edge_index, x and y (masks optional); "
                           f"it lacks {missing}; its keys are {sorted(d)}.")
    x = torch.as_tensor(d["x"])
    n = int(d.get("num_nodes", x.shape[0]))
    graph = Graph.from_edge_index(torch.as_tensor(d["edge_index"]), num_nodes=n)
    y = (torch.as_tensor(d["y"]).long() if "y" in d
         else torch.full((n,), -1, dtype=torch.int64))
    masks = {}
    for m in _MASKS:
        masks[m] = (torch.as_tensor(d[m]).bool() if d.get(m) is not None
                    else torch.zeros(n, dtype=torch.bool))
    if labels and not masks["train_mask"].any():
        raise DatasetError("the dict of tensors has no train_mask (or selects no vertex); give "
                           "train_mask, val_mask and test_mask ([N] bool).")
    labelled = y[y >= 0]
    classes = int(d.get("num_classes", int(labelled.max()) + 1 if labelled.numel() else 1))
    return NodeDataset(name=str(d.get("name", "tensors")), graph=graph, x=x.float(), y=y,
                       num_classes=classes, **masks)


def normalize_features(ds: NodeDataset, block: int = 1 << 22) -> NodeDataset:
    """The dataset with each feature row divided by its sum (rows summing to 0 kept), as
    the GCN and GAT papers preprocess bag-of-words features; unchanged (with a log line)
    when some feature is negative, where a row sum is no scale. Features mapped from
    disk (``storage="disk"``) are kept as they are (with a warning): normalized, they
    would be a copy in memory. Read ``block`` elements of rows at a time (no full-size
    temporary; a mapped block's pages dropped once read)."""
    x = ds.x
    rows = max(1, block // max(1, x[:1].numel()))
    for lo in range(0, x.shape[0], rows):
        negative = x[lo:lo + rows].numel() and bool(x[lo:lo + rows].amin() < 0)
        release_mapped(x, lo, lo + rows)
        if negative:
            log.info("features have negative entries: not row-normalized")
            return ds
    if is_mapped(x):
        log.warning("features mapped from disk (storage='disk') are not row-normalized: "
                    "that would copy them into memory; pass --no-normalize-features "
                    "to say so, or normalize them in the dataset")
        return ds
    out = torch.empty_like(x)
    for lo in range(0, x.shape[0], rows):
        s = x[lo:lo + rows].sum(1, keepdim=True)
        torch.div(x[lo:lo + rows], torch.where(s > 0, s, torch.ones_like(s)),
                  out=out[lo:lo + rows])
    return replace(ds, x=out)


def prepare_dataset(ds: NodeDataset, *, reorder: str = "none", seed: int = 0,
                    normalize: bool = False) -> NodeDataset:
    """The dataset as a run trains on it: relabeled (``reorder``) and its features
    row-normalized (``normalize``)."""
    if reorder != "none":
        ds = reorder_dataset(ds, reorder, seed=seed)
    if normalize:
        ds = normalize_features(ds)
    return ds


def fingerprint(ds: NodeDataset) -> str:
    """A short hash naming ``ds``'s graph, feature shape and labels (a checkpoint
    records it; a dataset with another structure or labels gets another). A spec-loaded
    dataset is named by its spec and sizes, without reading its arrays."""
    h = hashlib.blake2b(digest_size=12)
    spec = ds.info.get("spec")
    h.update(repr((spec, ds.num_nodes, ds.num_edges, tuple(ds.x.shape), ds.num_classes)).encode())
    if spec is None:  # data from memory: its arrays
        g = ds.graph
        for t in (g.indptr, g.indices, ds.y):
            h.update(np.ascontiguousarray(t.detach().cpu().numpy()).tobytes())
    return h.hexdigest()
