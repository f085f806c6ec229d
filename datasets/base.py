"""The node-classification dataset every ngra loader returns, and shared helpers.

A :class:`NodeDataset` bundles an :class:`ngra.Graph` with dense node features,
integer labels and a train/validation/test split. Loaders build the graph with its
edges already in destination-sorted (CSC) order, so the graph's "original" edge
order, the order of ``edge_type`` and the CSC order coincide; a dataset built by
hand (or converted from PyG/DGL) may use any edge order, and ``edge_type`` then
follows ``graph.edge_index()`` (the original order).

Provenance: ``info["synthesized"]`` lists what a loader made up rather than read
(``"features"``, ``"labels"``; ``[]`` for real data), and :meth:`NodeDataset.summary`
always reports it, so a run's header can say when its accuracy is on invented data.
A dataset built by hand without that key counts as real (``[]``).
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ngra.errors import DamagedFileError, DatasetError, DatasetNotFoundError, SpecError
from ngra.graph import Graph
from ngra.mapped import release_mapped
from ngra.settings import SETTINGS, get

from .direction import add_missing_reverses, reciprocity

__all__ = [
    "DATA_ENV",
    "DEFAULT_DATA_ROOT",
    "DamagedFileError",
    "DatasetError",
    "DatasetNotFoundError",
    "MissingFileError",
    "NodeDataset",
    "SpecError",
    "data_root",
    "writable",
]

#: Environment variable naming the data root (the CLI's ``--data-root`` wins over it).
DATA_ENV = "NGRA_DATA"
#: Data root used when neither an explicit root nor ``NGRA_DATA`` is given.
DEFAULT_DATA_ROOT = Path(str(SETTINGS[DATA_ENV].default))


class MissingFileError(DatasetNotFoundError, DatasetError):
    """A file the user named (an edge list's ``features=``, ``labels=`` or ``split=``)
    does not exist. Both a missing file (:class:`DatasetNotFoundError`, a
    ``FileNotFoundError``) and bad input (:class:`DatasetError`, a ``ValueError``), so
    either ``except`` catches it."""


def data_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Resolve the data root: ``root`` if given, else ``$NGRA_DATA``, else ``~/.ngra/data``.

    The folder need not exist (loaders that download create it).
    """
    if root is None or str(root) == "":
        root = get(DATA_ENV)
    return Path(root).expanduser().resolve()


def writable(path: Path) -> bool:
    """``path`` (or its nearest existing ancestor) is a folder with write permission bits.

    Permission bits are checked, not just ``os.access``: a folder marked read-only
    (such as a shared raw-data folder) is left alone even by the root user.
    """
    p = Path(path)
    while not p.exists():
        if p.parent == p:
            return False
        p = p.parent
    try:
        mode = p.stat().st_mode
    except OSError:
        return False
    return p.is_dir() and bool(mode & 0o222) and os.access(p, os.W_OK)


@dataclass(eq=False)
class NodeDataset:
    """A graph with node features, class labels and a train/val/test split.

    Attributes:
        name: short name, e.g. ``"cora"`` or ``"rmat"``.
        graph: the graph as distributed (Planetoid: symmetric, no self-loops).
        x: ``[N, F]`` float32 node features.
        y: ``[N]`` int64 class labels in ``[0, num_classes)``; ``-1`` marks an
            unlabeled node (which no mask selects).
        train_mask: ``[N]`` bool.
        val_mask: ``[N]`` bool.
        test_mask: ``[N]`` bool.
        num_classes: number of classes ``C``.
        edge_type: ``[E]`` int64 in ``graph.edge_index()`` (original) order, for
            typed-edge models (GG-NN, R-GCN); ``None`` when untyped.
        num_edge_types: number of edge types (1 when untyped).
        info: provenance, not part of the data: ``synthesized`` (what was made up:
            ``["features", "labels"]``, ``[]`` for real data), ``spec`` (canonical spec string),
            ``cache`` (``"hit"``, ``"miss"`` or ``"off"``), ``reciprocity`` (see
            :attr:`reciprocity`), how file loaders decided the edge direction
            (``symmetric``, ``direction``, ``symmetric_option``), loader notes.

    Raises:
        TypeError: a tensor has the wrong dtype.
        ValueError: a tensor has the wrong shape or out-of-range values.
    """

    name: str
    graph: Graph
    x: torch.Tensor
    y: torch.Tensor
    train_mask: torch.Tensor
    val_mask: torch.Tensor
    test_mask: torch.Tensor
    num_classes: int
    edge_type: torch.Tensor | None = None
    num_edge_types: int = 1
    info: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.graph, Graph):
            raise TypeError(f"graph must be an ngra.Graph; got {type(self.graph).__name__}.")
        n = self.graph.num_nodes
        _check_tensor("x", self.x, (torch.float32,), 2, "x.float()")
        if self.x.shape[0] != n:
            raise ValueError(f"x must have one row per node: [{n}, F]; got {list(self.x.shape)}.")
        _check_tensor("y", self.y, (torch.int64,), 1, "y.long()")
        if self.y.shape[0] != n:
            raise ValueError(
                f"y must have shape [{n}] (one label per node); got {list(self.y.shape)}."
            )
        if isinstance(self.num_classes, bool) or not isinstance(
            self.num_classes, (int, np.integer)
        ):
            raise TypeError(f"num_classes must be an int; got {type(self.num_classes).__name__}.")
        self.num_classes = int(self.num_classes)
        if n and self.y.numel():
            lo, hi = int(self.y.min()), int(self.y.max())
            if lo < -1 or hi >= self.num_classes:
                raise ValueError(
                    f"labels must be in [0, num_classes={self.num_classes}) or -1 (unlabeled); "
                    f"got range [{lo}, {hi}]."
                )
        for mask_name in ("train_mask", "val_mask", "test_mask"):
            mask = getattr(self, mask_name)
            _check_tensor(mask_name, mask, (torch.bool,), 1, f"{mask_name}.bool()")
            if mask.shape[0] != n:
                raise ValueError(f"{mask_name} must have shape [{n}]; got {list(mask.shape)}.")
        self.num_edge_types = int(self.num_edge_types)
        if self.edge_type is None:
            if self.num_edge_types != 1:
                raise ValueError(
                    f"num_edge_types={self.num_edge_types} but edge_type is None; "
                    "give an [E] edge_type tensor or num_edge_types=1."
                )
        else:
            _check_tensor("edge_type", self.edge_type, (torch.int64,), 1, "edge_type.long()")
            e = self.graph.num_edges
            if self.edge_type.shape[0] != e:
                raise ValueError(
                    f"edge_type must have shape [{e}] (one per edge, original edge order); "
                    f"got {list(self.edge_type.shape)}."
                )
            if e and (
                int(self.edge_type.min()) < 0 or int(self.edge_type.max()) >= self.num_edge_types
            ):
                raise ValueError(
                    f"edge_type values must be in [0, num_edge_types={self.num_edge_types}); got "
                    f"range [{int(self.edge_type.min())}, {int(self.edge_type.max())}]."
                )

    # ------------------------------------------------------------ properties
    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def num_edges(self) -> int:
        return self.graph.num_edges

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def reciprocity(self) -> float | None:
        """Share of the edges (self-loops aside) whose reverse is an edge too: 1 for a
        symmetric graph, 0 for an undirected graph listed one direction per edge
        (``None`` without such edges). Measured once, kept in ``info``."""
        if "reciprocity" not in self.info:
            self.info["reciprocity"] = reciprocity(self.graph)
        return self.info["reciprocity"]

    @property
    def synthesized(self) -> list[str]:
        """What the loader made up instead of reading: a sublist of
        ``["features", "labels"]`` (``info["synthesized"]``; ``[]`` when absent)."""
        return list(self.info.get("synthesized", []))

    def summary(self) -> dict[str, Any]:
        """Sizes, edge reciprocity and what was synthesized, as a flat dict (for logs and
        result files)."""
        r = self.reciprocity
        return {
            "name": self.name,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "num_features": self.num_features,
            "num_classes": self.num_classes,
            "num_edge_types": self.num_edge_types,
            "train": int(self.train_mask.sum()),
            "val": int(self.val_mask.sum()),
            "test": int(self.test_mask.sum()),
            "reciprocity": None if r is None else round(r, 4),
            "synthesized": self.synthesized,
            **{k: self.info[k] for k in ("symmetric", "direction") if k in self.info},
        }

    def __repr__(self) -> str:
        s = self.summary()
        typed = f", num_edge_types={s['num_edge_types']}" if self.edge_type is not None else ""
        return (
            f"NodeDataset({s['name']!r}, num_nodes={s['num_nodes']}, num_edges={s['num_edges']}, "
            f"num_features={s['num_features']}, num_classes={s['num_classes']}{typed}, "
            f"split={s['train']}/{s['val']}/{s['test']})"
        )


def _check_tensor(name: str, t: Any, dtypes: tuple[torch.dtype, ...], dim: int, fix: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(t).__name__}.")
    if t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must have dtype {want}; got {t.dtype}. Convert with {fix}.")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D; got shape {list(t.shape)}.")


# --------------------------------------------------------------------------- helpers
def rng_for(seed: int, stream: str) -> np.random.Generator:
    """An independent, reproducible random stream per (seed, purpose).

    Separate streams keep, e.g., the graph of ``rmat:seed=0,feat=64`` identical to
    that of ``rmat:seed=0,feat=128``: changing one part never reshuffles another.
    """
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(stream.encode())])


def csc_graph(
    src: np.ndarray,
    dst: np.ndarray,
    num_nodes: int,
    *,
    symmetric: bool = False,
    remove_self_loops: bool = True,
    dedup: bool = True,
) -> Graph:
    """A :class:`Graph` whose edges are sorted by ``(dst, src)``, so original order == CSC order.

    Args:
        src, dst: ``[E]`` integer endpoint arrays.
        num_nodes: ``N`` (ids must lie in ``[0, N)``).
        symmetric: add the reverse of every edge whose reverse is absent (an edge listed in
            both directions is not doubled; see :func:`~.direction.add_missing_reverses`).
        remove_self_loops: drop ``v -> v`` edges.
        dedup: drop repeated ``(src, dst)`` pairs (otherwise multi-edges are kept).
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if src.shape != dst.shape or src.ndim != 1:
        raise ValueError(
            f"src and dst must be 1-D of equal length; got {src.shape} and {dst.shape}."
        )
    if remove_self_loops:
        keep = src != dst
        if not keep.all():
            src, dst = src[keep], dst[keep]
    if src.size and (
        min(int(src.min()), int(dst.min())) < 0 or max(int(src.max()), int(dst.max())) >= num_nodes
    ):
        raise DatasetError(
            f"edge endpoints must be in [0, {num_nodes}); got range "
            f"[{min(int(src.min()), int(dst.min()))}, {max(int(src.max()), int(dst.max()))}]."
        )
    n = max(int(num_nodes), 1)
    if n > 3_037_000_499:  # dst * n + src must fit in int64
        raise DatasetError(f"graphs are limited to 3,037,000,499 nodes here; got {n}.")
    if symmetric:
        src, dst, _ = add_missing_reverses(src, dst, num_nodes)
    key = dst * n + src
    key.sort()
    if dedup and key.size > 1:
        # sort + neighbor compare: numpy 2's hash-based np.unique is several times slower here
        fresh = np.empty(key.size, dtype=bool)
        fresh[0] = True
        np.not_equal(key[1:], key[:-1], out=fresh[1:])
        key = key[fresh]
    indices = key % n
    counts = np.bincount(key // n, minlength=num_nodes)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return Graph.from_csc(torch.from_numpy(indptr), torch.from_numpy(indices), num_nodes=num_nodes)


def class_features(
    y: np.ndarray, num_classes: int, num_features: int, noise: float, rng: np.random.Generator,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``[N, F]`` float32 features ``centroid[y] + noise * eps`` with ``centroid, eps ~ N(0, 1)``.

    Features carry the label through a per-class mean; ``noise`` sets how hard the
    classes are to separate from features alone, so neighbor aggregation (which
    averages the noise away over same-class neighbors) is what makes them easy.
    Unlabeled nodes (``y == -1``) get pure noise. Written a block of rows at a time
    (into ``out`` when given: a cache entry's memory-mapped array).
    """
    n = y.shape[0]
    centroids = rng.standard_normal((max(num_classes, 1) + 1, num_features), dtype=np.float32)
    centroids[-1] = 0.0  # row for y == -1
    x = np.empty((n, num_features), dtype=np.float32) if out is None else out
    # Row blocks draw the same numbers as one draw (the generator's stream is sequential).
    rows = max(1, (64 << 20) // max(4 * num_features, 1))
    for r0 in range(0, n, rows):
        block = x[r0:r0 + rows]
        rng.standard_normal(block.shape, dtype=np.float32, out=block)
        block *= np.float32(noise)
        block += centroids[y[r0:r0 + rows]]
        release_mapped(x, r0, r0 + block.shape[0])  # written through to the cache entry
    return x


def random_masks(
    num_nodes: int,
    train: float,
    val: float,
    rng: np.random.Generator,
    labeled: np.ndarray | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Disjoint random train/val/test masks; fractions of the labeled nodes, test = the rest."""
    if not (0 <= train <= 1 and 0 <= val <= 1 and train + val <= 1):
        raise DatasetError(
            f"split fractions must satisfy 0 <= train, val and train + val <= 1; got train={train}, val={val}."
        )
    nodes = np.arange(num_nodes) if labeled is None else np.flatnonzero(labeled)
    order = rng.permutation(nodes)
    n_train = round(train * len(order))
    n_val = round(val * len(order))
    masks = []
    for part in (order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :]):
        m = torch.zeros(num_nodes, dtype=torch.bool)
        m[torch.from_numpy(part)] = True
        masks.append(m)
    return masks[0], masks[1], masks[2]


def typed_edges(graph: Graph, y: np.ndarray, num_edge_types: int) -> torch.Tensor | None:
    """Edge types with signal: 0 for same-label edges, ``1 + (y_u + y_v) % (K - 1)`` otherwise.

    Symmetric in ``(u, v)``, so both directions of an undirected edge share a type.
    Returns ``None`` for ``num_edge_types == 1``.
    """
    if num_edge_types < 1:
        raise DatasetError(f"edge_types must be >= 1; got {num_edge_types}.")
    if num_edge_types == 1:
        return None
    ei = graph.edge_index().numpy()
    ys, yd = y[ei[0]], y[ei[1]]
    t = np.where(ys == yd, 0, 1 + (ys + yd) % (num_edge_types - 1))
    return torch.from_numpy(t.astype(np.int64))
