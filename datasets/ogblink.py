"""OGB link-property folders (ogbl-collab, -ppa, -ddi, -citation2 layout) as a :class:`LinkSplit`.

OGB ships a link split as torch pickles (``split/<type>/train.pt``, ...). Unpickling a
file from the web can run code, so ngra reads a **CSV equivalent** instead, one file per
tensor of the ``.pt`` dicts, written once by whoever trusts the download::

    raw/edge.csv.gz            "src,dst" per line: the message-passing graph (OGB: the
                               training edges)
    raw/num-node-list.csv.gz   optional: the node count
    raw/node-feat.csv.gz       optional: F comma-separated floats per node
    split/<type>/train.csv.gz        "source,target" per line   (train["edge"], or
                                     train["source_node"], train["target_node"])
    split/<type>/valid.csv.gz        "source,target" per line   (valid["edge"])
    split/<type>/valid_neg.csv.gz    "source,target" per line   (valid["edge_neg"])
    split/<type>/valid_target_neg.csv.gz
                                     K target ids per line, line i the negatives of
                                     positive i  (valid["target_node_neg"], citation2)
    split/<type>/test*.csv.gz        as valid*

Each of ``valid`` and ``test`` needs ``_neg`` (Hits@K datasets) or ``_target_neg`` (MRR
datasets); ``.csv`` without ``.gz`` is read too, and a first line of words (``source,target``)
is skipped as a header. Extra OGB fields (collab's ``weight``, ``year``) are not read. One
way to write them from a trusted ``.pt``::

    d = torch.load("valid.pt", weights_only=True)
    np.savetxt("valid.csv", d["edge"].numpy(), fmt="%d", delimiter=",")
    np.savetxt("valid_neg.csv", d["edge_neg"].numpy(), fmt="%d", delimiter=",")

Direction: ``symmetric=None`` follows ``add_inverse_edge`` as :func:`~ngra.datasets.load_ogb`
does (a ``master.csv``, else OGB's value for the folder's name); a symmetric dataset
gets the reverse of every ``raw/edge`` line in its message-passing graph and is
``undirected``. A val/test positive found in the message-passing graph is logged.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from ._text import first_data_line, looks_like_header, parse_numbers, read_text, skip_header
from .base import DatasetError, DatasetNotFoundError, csc_graph
from .linksplit import LinkSplit
from .negatives import is_edge
from .ogb import _add_inverse_edge, _find, _split_dir
from .ogb import _need as _need_file

__all__ = ["OGB_LINK_ADD_INVERSE_EDGE", "load_ogb_link"]

log = logging.getLogger(__name__)

#: ``add_inverse_edge`` of OGB's link-property datasets (``ogb/linkproppred/master.csv``).
OGB_LINK_ADD_INVERSE_EDGE = {"ogbl-collab": True, "ogbl-ppa": True, "ogbl-ddi": True,
                             "ogbl-citation2": False}
_FIX = "Write the file again from the trusted OGB .pt (see ngra.datasets.ogblink)."


def load_ogb_link(path: str | Path, *, split: str | None = None,
                  symmetric: bool | None = None) -> LinkSplit:
    """Read an OGB link-property folder in its CSV form (see the module docstring).

    Args:
        path: the dataset folder (holding ``raw/`` and ``split/``).
        split: split type under ``split/`` (default: the only one present).
        symmetric: undirected (reverse edges added, pairs unordered), directed, or
            (``None``, default) per ``add_inverse_edge``.

    Raises:
        DatasetNotFoundError: a required file is missing (named).
        DatasetError: ids out of range, a wrong column count, mismatched negatives.
    """
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise DatasetNotFoundError(f"OGB link folder {folder} does not exist.")
    raw, parts = folder / "raw", _split_dir(folder, split)
    edges = _table(_need(raw, "edge", folder), 2)
    pos = {p: _table(_need(parts, p, folder), 2) for p in ("train", "valid", "test")}
    negs: dict[str, np.ndarray | None] = {}
    for p in ("valid", "test"):
        pair_file, dst_file = _find(parts, f"{p}_neg"), _find(parts, f"{p}_target_neg")
        if (pair_file is None) == (dst_file is None):
            raise DatasetNotFoundError(
                f"OGB link folder {folder}: {parts} needs exactly one of {p}_neg.csv(.gz) "
                f"(source,target pairs) and {p}_target_neg.csv(.gz) (K targets per positive); "
                f"found {'both' if pair_file else 'neither'}.")
        negs[f"{p}_neg"] = None if pair_file is None else _table(pair_file, 2)
        negs[f"{p}_dst"] = None if dst_file is None else _table(dst_file, None)
        if dst_file is not None and negs[f"{p}_dst"].shape[0] != pos[p].shape[0]:
            raise DatasetError(f"{dst_file}: {negs[f'{p}_dst'].shape[0]} lines; expected "
                               f"{pos[p].shape[0]}, one per positive of {p}.")
    x = None
    feat_file = _find(raw, "node-feat")
    if feat_file is not None:
        x = torch.from_numpy(_table(feat_file, None, as_float=True).astype(np.float32))
    num_nodes = _num_nodes(raw, x, [edges, *pos.values(), *(v for v in negs.values()
                                                            if v is not None)])
    stated = "given"
    if symmetric is None:
        symmetric, stated = _add_inverse_edge(folder)
        name = folder.name.replace("_", "-")
        if stated is None and name in OGB_LINK_ADD_INVERSE_EDGE:
            symmetric, stated = OGB_LINK_ADD_INVERSE_EDGE[name], "OGB's linkproppred master.csv"
    graph = csc_graph(edges[:, 0], edges[:, 1], num_nodes, symmetric=symmetric,
                      remove_self_loops=False, dedup=False)

    def pairs(a: np.ndarray | None) -> torch.Tensor | None:
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a.T))

    def dsts(a: np.ndarray | None) -> torch.Tensor | None:
        return None if a is None else torch.from_numpy(np.ascontiguousarray(a))

    out = LinkSplit(graph=graph, train_pos=pairs(pos["train"]), val_pos=pairs(pos["valid"]),
                    val_neg=pairs(negs["valid_neg"]), test_pos=pairs(pos["test"]),
                    test_neg=pairs(negs["test_neg"]), undirected=bool(symmetric), x=x,
                    val_neg_dst=dsts(negs["valid_dst"]), test_neg_dst=dsts(negs["test_dst"]),
                    info={"source": str(folder), "split": parts.name,
                          "direction": stated or "unstated (edges as listed)"})
    for p, t in (("valid", out.val_pos), ("test", out.test_pos)):
        leaked = int(is_edge(graph, t[0].numpy(), t[1].numpy()).sum()) if t.numel() else 0
        if leaked:
            log.warning("%s: %d of %d %s positives are edges of raw/edge (the message-passing "
                        "graph): they leak into aggregation.", folder, leaked, t.shape[1], p)
    log.info("loaded OGB link split %s: %s", folder, out.summary())
    return out


def _need(folder: Path, stem: str, dataset: Path) -> Path:
    return _need_file(folder, stem, dataset, "OGB link folder",
                      "raw/edge.csv.gz and split/<type>/{train,valid,test}.csv.gz; see "
                      "ngra.datasets.ogblink for the CSV layout")


def _table(path: Path, columns: int | None, as_float: bool = False) -> np.ndarray:
    """``[rows, columns]`` numbers of a CSV (``columns=None``: as many as the first line)."""
    text = read_text(path, _FIX)
    first, _ = first_data_line(text)
    if looks_like_header(first):
        text, _ = skip_header(text)
        first, _ = first_data_line(text)
    width = columns if columns is not None else len(first.replace(b",", b" ").split())
    if not first:
        return np.empty((0, width), dtype=np.float64 if as_float else np.int64)
    values = parse_numbers(text, path, None, as_float=as_float, columns=width, fix=_FIX)
    return values.reshape(-1, width)


def _num_nodes(raw: Path, x: torch.Tensor | None, tables: list[np.ndarray]) -> int:
    seen = max((int(t.max()) + 1 for t in tables if t.size), default=0)
    count_file = _find(raw, "num-node-list")
    if count_file is not None:
        n = _table(count_file, 1).reshape(-1)
        if n.size != 1:
            raise DatasetError(f"{count_file}: expected one node count; got {n.tolist()}.")
        n = int(n[0])
    else:
        n = x.shape[0] if x is not None else seen
    if x is not None and x.shape[0] != n:
        raise DatasetError(f"{raw}: node-feat has {x.shape[0]} rows; expected {n} (the node "
                           "count), one per node.")
    if seen > n or min((int(t.min()) for t in tables if t.size), default=0) < 0:
        raise DatasetError(f"{raw.parent}: vertex ids must be in [0, {n}); the files hold ids "
                           f"up to {seen - 1}.")
    return n
