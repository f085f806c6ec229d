"""Dataset spec strings (``"rmat:scale=18,seed=0"``), the loader registry, and :func:`load`.

Grammar: ``name`` or ``name:arg,arg,...`` where each ``arg`` is ``key=value``; a
bare word is a path for loaders that read a file (``edgelist:graph.txt.gz``) or
turns a flag on (``pubmed:structure``). Names and keys are case-insensitive;
paths cannot contain commas. Every key has a default, and the canonical form of
a spec lists them all, so ``sbm`` and ``sbm:nodes=2000`` name (and cache) the
same dataset. Path keys (``edgelist:PATH``, its ``features=``, ``labels=`` and
``split=``) appear in the canonical form as absolute paths, and the cache key adds
each such file's size and mtime (:func:`~ngra.datasets.cache.source_stamp`): a
changed file is a new cache entry, never a stale one.

Bringing one's own vertex data: ``edgelist:g.csv,features=x.npy,labels=y.csv,
split=split.npz,header=true`` (formats: :mod:`~ngra.datasets.vertexdata`).
``classes`` is then the labels' range (``auto``: max label + 1).
"""

from __future__ import annotations

import logging
import os
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .base import DatasetNotFoundError, NodeDataset, SpecError, data_root, writable
from .cache import (
    CacheError,
    EntryWriter,
    cache_key,
    cache_root,
    load_cached,
    remove_entry,
    save_cached,
    source_stamp,
)
from .direction import loading_spec, symmetric_spec, warn_if_one_direction
from .edgelist import TWITTER_FILE, load_edgelist, load_twitter
from .graphs import GraphDataset
from .ogb import load_ogb, ogb_source_files
from .download import DownloadError, fetch_folder
from .ogbgraph import OGB_GRAPH_URLS, load_ogb_graph, ogb_graph_source_files
from .planetoid import load_planetoid
from .store import STORAGES, choose_storage, entry_bytes
from .synthetic import rmat, sbm
from .tu import TU_URL, load_tu, tu_source_files

__all__ = ["DatasetSpec", "available", "describe", "load", "parse_spec"]

log = logging.getLogger(__name__)

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}
_AUTO = {"auto", "none", ""}


@dataclass(frozen=True)
class Param:
    """One spec key: its type (``int``, ``float``, ``bool``, ``str``, ``path`` or
    ``auto-bool``, a bool that may be ``auto``), default and a one-line help."""

    name: str
    kind: str
    default: Any
    help: str

    def parse(self, raw: str, dataset: str) -> Any:
        text = raw.strip()
        low = text.lower()
        if self.default is None and self.kind in ("int", "float") and low == "auto":
            return None  # optional numbers print their default as 'auto'
        try:
            if self.kind == "int":
                value = float(text) if any(c in low for c in ".e") else int(text)
                if isinstance(value, float):
                    if not value.is_integer():
                        raise ValueError
                    value = int(value)
                return value
            if self.kind == "float":
                return float(text)
            if self.kind in ("bool", "auto-bool"):
                if low in _TRUE:
                    return True
                if low in _FALSE:
                    return False
                if self.kind == "auto-bool" and low in _AUTO:
                    return None
                raise ValueError
        except ValueError:
            want = {
                "int": "an integer",
                "float": "a number",
                "bool": "true/false (or 1/0)",
                "auto-bool": "true/false/auto",
            }[self.kind]
            raise SpecError(f"{dataset}: {self.name} must be {want}; got {raw!r}.") from None
        if not text:
            raise SpecError(f"{dataset}: {self.name} must not be empty.")
        if self.default is None and low == "auto":
            return None  # optional str/path keys print their default as 'auto'
        return text

    def format(self, value: Any) -> str:
        if value is None:
            return "auto"
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)


@dataclass(frozen=True)
class Entry:
    """A registered dataset: its keys and how to build it."""

    name: str
    help: str
    params: tuple[Param, ...]
    build: Callable[..., NodeDataset | GraphDataset]  # build(root, download, progress, **params)
    positional: str | None = None  # key a bare word fills (a path)
    flags: tuple[str, ...] = ()  # bool keys a bare word turns on
    cacheable: bool = True
    sources: Callable[..., list[Path]] | None = None  # sources(root, **params): files to stamp
    streams: bool = False  # build(..., out=EntryWriter) writes large arrays into the entry

    def param(self, key: str) -> Param | None:
        return next((p for p in self.params if p.name == key), None)

    def usage(self) -> str:
        """``name[:key=default,...]``, or ``name:PATH[,key=default,...]`` for file loaders."""
        keys = ",".join(
            f"{p.name}={p.format(p.default)}" for p in self.params if p.name != self.positional
        )
        if self.positional:
            return f"{self.name}:{self.positional.upper()}" + (f"[,{keys}]" if keys else "")
        return f"{self.name}[:{keys}]" if keys else self.name


@dataclass(frozen=True)
class DatasetSpec:
    """A parsed spec: registry name plus every key's value (defaults filled in)."""

    name: str
    params: dict[str, Any] = field(hash=False)

    @property
    def entry(self) -> Entry:
        return _REGISTRY[self.name]

    def canonical(self) -> str:
        """The normalized spec string: every key in registry order (the cache key)."""
        e = self.entry
        if not e.params:
            return self.name
        return f"{self.name}:" + ",".join(
            f"{p.name}={p.format(self.params[p.name])}" for p in e.params
        )

    def __str__(self) -> str:
        return self.canonical()


# --------------------------------------------------------------------------- registry
def _split_params() -> tuple[Param, ...]:
    return (
        Param("train", "float", 0.1, "fraction of nodes in the training set"),
        Param("val", "float", 0.1, "fraction of nodes in the validation set (test: the rest)"),
    )


def _planetoid(name: str) -> Entry:
    def build(
        root: Path, download: bool, progress: bool | None, structure: bool, seed: int
    ) -> NodeDataset:
        return load_planetoid(
            name,
            root,
            download=download,
            allow_missing_features=structure,
            seed=seed,
            progress=progress,
        )

    return Entry(
        name=name,
        help=f"Planetoid {name} with the public split; '{name}:structure' = real graph, random features",
        params=(
            Param(
                "structure",
                "bool",
                False,
                "random features of the real width; feature files not needed",
            ),
            Param("seed", "int", 0, "seed of the random features in structure mode"),
        ),
        build=build,
        flags=("structure",),
        cacheable=False,  # parsing the raw files is as fast as reading a cache
    )


def _build_rmat(root: Path, download: bool, progress: bool | None, **kw: Any) -> NodeDataset:
    return rmat(progress=progress, **kw)


def _build_sbm(root: Path, download: bool, progress: bool | None, **kw: Any) -> NodeDataset:
    return sbm(progress=progress, **kw)


def _build_edgelist(
    root: Path, download: bool, progress: bool | None, path: str, **kw: Any
) -> NodeDataset:
    for key in _VERTEX_FILES:
        if kw[key] is not None:
            kw[key] = _resolve(kw[key], root)
    return load_edgelist(_resolve(path, root), progress=progress, **kw)


def _build_twitter(root: Path, download: bool, progress: bool | None, **kw: Any) -> NodeDataset:
    return load_twitter(root, download=download, progress=progress, **kw)


def _build_ogb(
    root: Path, download: bool, progress: bool | None, path: str, **kw: Any
) -> NodeDataset:
    return load_ogb(_resolve(path, root), progress=progress, **kw)


def _build_tu(
    root: Path, download: bool, progress: bool | None, path: str
) -> GraphDataset:
    return load_tu(_collection_folder("tu", path, root, download, progress))


def _build_ogb_graph(
    root: Path, download: bool, progress: bool | None, path: str, **kw: Any
) -> GraphDataset:
    return load_ogb_graph(_collection_folder("ogbg", path, root, download, progress), **kw)


#: Spec kinds whose ``path`` may be a dataset's name, downloaded into ``<root>/<kind>/``.
_COLLECTIONS = ("tu", "ogbg")


def _collection_path(kind: str, path: str, root: Path) -> Path:
    """Where ``tu:PATH`` / ``ogbg:PATH`` is read: ``PATH`` itself when it exists or names
    a folder (holds a ``/``); a bare dataset name (``MUTAG``, ``ogbg-molhiv``) is
    ``<root>/tu/MUTAG`` / ``<root>/ogbg/ogbg_molhiv``."""
    given = _resolve(path, root)
    if given.exists() or "/" in str(path) or os.sep in str(path):
        return given
    return root / kind / (str(path) if kind == "tu" else str(path).replace("-", "_"))


def _collection_folder(kind: str, path: str, root: Path, download: bool,
                       progress: bool | None) -> Path:
    """The folder of ``tu:PATH`` / ``ogbg:PATH`` (:func:`_collection_path`, already
    applied to ``path``), downloaded from its public home (:data:`~ngra.datasets.tu.TU_URL`,
    :data:`~ngra.datasets.ogbgraph.OGB_GRAPH_URLS`) when it is a named dataset's folder
    under ``<root>/<kind>/`` and missing."""
    folder = Path(path)
    if folder.exists() or folder.parent != root / kind:
        return folder  # the loader says what is missing
    name = folder.name if kind == "tu" else folder.name.replace("_", "-")
    url = TU_URL.format(name=name) if kind == "tu" else OGB_GRAPH_URLS.get(name)
    if url is None:
        raise DatasetNotFoundError(
            f"ogbg:{name}: no folder {folder}, and {name} is not one of the OGB datasets ngra "
            f"downloads ({', '.join(OGB_GRAPH_URLS)}). Give the path of an unpacked OGB "
            "graph-property folder.")
    if not download:
        raise DatasetNotFoundError(f"{kind}:{name}: no folder {folder} (downloading is off). "
                                   f"Put the unpacked dataset there, or download {url}.")
    if not writable(folder.parent):
        raise DatasetNotFoundError(f"{kind}:{name}: no folder {folder}; {folder.parent} is "
                                   f"read-only, so {url} was not downloaded there. Point "
                                   "--data-root / NGRA_DATA at a writable folder, or give the "
                                   "dataset's path.")
    try:
        return fetch_folder(url, folder, progress=progress)
    except (DownloadError, OSError) as err:
        raise DatasetNotFoundError(f"{kind}:{name}: no folder {folder}; downloading {url} "
                                   f"failed ({err}). Put the unpacked dataset there, or give "
                                   "its path.") from err


_SYNTH_LABELED = (
    Param("feat", "int", 64, "feature width"),
    Param("classes", "int", 8, "number of synthetic classes"),
    Param("seed", "int", 0, "random seed (labels, features, split)"),
    Param("noise", "float", 2.0, "feature noise std (class centroids are N(0,1))"),
)
_SYMMETRIC_FILE = Param(
    "symmetric",
    "auto-bool",
    None,
    "add each edge's missing reverse: true for an undirected graph listed one direction "
    "per edge (auto: yes for an LG 'u' file, else edges as listed, and a file with "
    "almost no reciprocal edges is reported)",
)
_EDGELIST_PARAMS = (
    *_SYNTH_LABELED,
    _SYMMETRIC_FILE,
    Param("simple", "bool", True, "drop self-loops and duplicate edges"),
    *_split_params(),
    Param("edge_types", "int", 1, "K > 1 adds edge types (0 = same-label edge)"),
)
#: Keys of the files a user brings beside an edge list (rows = vertex ids).
_VERTEX_FILES = ("features", "labels", "split")
_OWN_DATA_PARAMS = (
    Param("path", "path", None, "the edge-list file"),
    Param("feat", "int", 64, "synthetic feature width (ignored with features=)"),
    Param("classes", "int", None, "number of classes: of the synthetic labels (auto: 8), or "
          "with labels= their range [0, classes) (auto: max label + 1)"),
    Param("seed", "int", 0, "random seed (synthetic labels, features, random split)"),
    Param("noise", "float", 2.0, "synthetic feature noise std (class centroids are N(0,1))"),
    _SYMMETRIC_FILE,
    Param("simple", "bool", True, "drop self-loops and duplicate edges"),
    Param("train", "float", 0.1, "random split: fraction of labeled vertices in training "
          "(without split=)"),
    Param("val", "float", 0.1, "random split: fraction in validation (test: the rest)"),
    Param("edge_types", "int", 1, "K > 1 adds edge types (0 = same-label edge)"),
    Param("features", "path", None, "[N, F] features, row i = vertex id i (ids then kept, not "
          "renumbered): .csv(.gz), .npy, or .npz with key x/features (auto: synthetic)"),
    Param("labels", "path", None, "[N] integer labels, -1 = unlabeled, rows as features: "
          ".csv(.gz), .npy, or .npz with key y/labels (auto: synthetic, structural)"),
    Param("split", "path", None, ".npz with train, val (or valid), test vertex-id arrays; "
          ".csv of 'id,name' lines (train/val/valid/test); or .npy/.csv of one code per "
          "vertex: 0 train, 1 val, 2 test, -1 none (auto: random, train=/val=)"),
    Param("header", "bool", False, "the text files' first non-comment line holds column "
          "names: skip it"),
)

_REGISTRY: dict[str, Entry] = {
    e.name: e
    for e in (
        _planetoid("cora"),
        _planetoid("citeseer"),
        _planetoid("pubmed"),
        Entry(
            name="rmat",
            help="R-MAT power-law graph (Graph500 a,b,c); labels from generator-id high bits",
            params=(
                Param("scale", "int", 16, "log2 of the node count"),
                Param("edge_factor", "int", 16, "generated edges per node"),
                Param("a", "float", 0.57, "quadrant probability a"),
                Param("b", "float", 0.19, "quadrant probability b"),
                Param("c", "float", 0.19, "quadrant probability c (d = 1 - a - b - c)"),
                *_SYNTH_LABELED,
                Param("symmetric", "bool", False, "store both directions of every edge"),
                Param("simple", "bool", True, "drop self-loops and duplicate edges"),
                *_split_params(),
                Param("edge_types", "int", 1, "K > 1 adds edge types (0 = same-label edge)"),
                Param(
                    "labels", "str", "id", "'id' (degree-correlated) or 'diffusion' (homophilous)"
                ),
            ),
            build=_build_rmat,
            streams=True,
        ),
        Entry(
            name="sbm",
            help="stochastic block model, label = block (default: small, GCN learns it in seconds)",
            params=(
                Param("nodes", "int", 2000, "number of nodes"),
                Param("blocks", "int", 7, "number of blocks = classes"),
                Param("p_in", "float", 0.03, "edge probability inside a block"),
                Param("p_out", "float", 0.002, "edge probability across blocks"),
                Param("feat", "int", 32, "feature width"),
                Param("seed", "int", 0, "random seed"),
                Param("noise", "float", 3.0, "feature noise std (class centroids are N(0,1))"),
                *_split_params(),
                Param("edge_types", "int", 1, "K > 1 adds edge types (0 = same-block edge)"),
            ),
            build=_build_sbm,
        ),
        Entry(
            name="edgelist",
            help="edge-list file (SNAP text or Graphs.jl LG, plain or .gz) with your own "
                 "features/labels/split files, or synthetic ones",
            params=_OWN_DATA_PARAMS,
            build=_build_edgelist,
            positional="path",
            sources=lambda root, **params: [
                _resolve(params[k], root) for k in ("path", *_VERTEX_FILES)
                if params[k] is not None],
        ),
        Entry(
            name="twitter",
            help="SNAP ego-Twitter from <data root>/ego_twitter/ (81,306 nodes) with synthetic labels/features",
            params=_EDGELIST_PARAMS,
            build=_build_twitter,
            sources=lambda root, **_: [root / TWITTER_FILE, root / TWITTER_FILE.name],
        ),
        Entry(
            name="ogb",
            help="OGB node-property-prediction folder (raw/*.csv.gz + split/<type>/)",
            params=(
                Param("path", "path", None, "the dataset folder, or an OGB name (ogbg-molhiv, "
                      "-molbace, -molbbbp, ogbg-ppa): <root>/ogbg/ogbg_NAME, downloaded when "
                      "missing"),
                Param("split", "str", None, "split type under split/ (default: the only one)"),
                Param(
                    "symmetric",
                    "auto-bool",
                    None,
                    "add each edge's missing reverse (auto: add_inverse_edge of a master.csv in "
                    "or beside the folder, or OGB's value for its name; else edges as listed, "
                    "and a graph with almost no reciprocal edges is reported)",
                ),
                Param("simple", "bool", False, "drop self-loops and duplicate edges"),
            ),
            build=_build_ogb,
            positional="path",
            sources=lambda root, path, **_: ogb_source_files(_resolve(path, root)),
        ),
        Entry(
            name="tu",
            help="TU graph-classification folder (DS_A.txt, DS_graph_indicator.txt, "
                 "DS_graph_labels.txt, ...): a GraphDataset of many graphs, one label each",
            params=(Param("path", "path", None, "the dataset folder (or its parent of raw/), "
                                               "or a TU name (MUTAG, PROTEINS, ...): "
                                               "<root>/tu/NAME, downloaded when missing"),),
            build=_build_tu,
            positional="path",
            cacheable=False,  # small text files: parsing them is as fast as reading a cache
            sources=lambda root, path, **_: tu_source_files(_resolve(path, root)),
        ),
        Entry(
            name="ogbg",
            help="OGB graph-property folder (raw/*.csv.gz, edges per graph + "
                 "split/<type>/): a GraphDataset of many graphs carrying the folder's split",
            params=(
                Param("path", "path", None, "the dataset folder, or an OGB name (ogbg-molhiv, "
                      "-molbace, -molbbbp, ogbg-ppa): <root>/ogbg/ogbg_NAME, downloaded when "
                      "missing"),
                Param("split", "str", None, "split type under split/ (default: the only one)"),
                Param("symmetric", "auto-bool", None,
                      "list each edge's reverse after it (auto: add_inverse_edge of a "
                      "master.csv in or beside the folder, or OGB's value for its name: yes "
                      "for ogbg-mol*; else edges as listed)"),
            ),
            build=_build_ogb_graph,
            positional="path",
            cacheable=False,  # per-graph text files parse in seconds; no graph cache format
            sources=lambda root, path, **_: ogb_graph_source_files(_resolve(path, root)),
        ),
    )
}
_ALIASES = {
    "planetoid-cora": "cora",
    "planetoid-citeseer": "citeseer",
    "planetoid-pubmed": "pubmed",
    "ego-twitter": "twitter",
    "ego_twitter": "twitter",
    "edges": "edgelist",
    "csv": "edgelist",
}


def available() -> list[str]:
    """Registered dataset names."""
    return list(_REGISTRY)


def describe() -> str:
    """Per dataset: usage with defaults and a short description, and for the loaders that
    read a file every key's meaning (for ``--help``)."""
    lines = []
    for e in _REGISTRY.values():
        lines += [f"  {e.usage()}", f"      {e.help}"]
        if e.positional:
            lines += [textwrap.fill(f"{p.name}: {p.help}", 96, initial_indent=" " * 6,
                                    subsequent_indent=" " * 8)
                      for p in e.params if p.name != e.positional]
    aliases = ", ".join(f"{a} = {n}" for a, n in _ALIASES.items())
    return "\n".join(lines + [textwrap.fill(f"aliases: {aliases}", 96, initial_indent="  ",
                                            subsequent_indent="    ", break_on_hyphens=False)])


def parse_spec(spec: str) -> DatasetSpec:
    """Parse a spec string; fill defaults; check names, keys and value types.

    Raises:
        SpecError: unknown dataset or key, bad value, missing path; the message
            lists the valid names or keys.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(
            f"a dataset spec must be a non-empty string like 'cora' or 'rmat:scale=18'; got {spec!r}.\n"
            f"Valid datasets:\n{describe()}"
        )
    head, _, rest = spec.strip().partition(":")
    name = head.strip().lower()
    name = _ALIASES.get(name, name)
    if name not in _REGISTRY:
        raise SpecError(
            f"unknown dataset {head.strip()!r} in spec {spec!r}. Valid datasets:\n{describe()}"
        )
    entry = _REGISTRY[name]
    given: dict[str, Any] = {}
    for token in (t for t in rest.split(",") if t.strip()) if rest else ():
        key, eq, value = token.partition("=")
        key = key.strip().lower()
        if not eq:
            word = token.strip()
            if word.lower() in entry.flags:
                key, value = word.lower(), "true"
            elif entry.positional and entry.positional not in given:
                key, value = entry.positional, word
            else:
                raise SpecError(
                    f"{name}: cannot read {word!r} in spec {spec!r}: expected key=value. "
                    f"Valid keys: {_keys(entry)}. Usage: {entry.usage()}"
                )
        param = entry.param(key)
        if param is None:
            raise SpecError(
                f"{name}: unknown key {key!r} in spec {spec!r}. Valid keys: {_keys(entry)}."
            )
        if key in given:
            raise SpecError(f"{name}: key {key!r} given twice in spec {spec!r}.")
        given[key] = param.parse(value, name)
    params = {p.name: given.get(p.name, p.default) for p in entry.params}
    if entry.positional and params.get(entry.positional) is None:
        raise SpecError(f"{name} needs a path: {entry.usage()} (e.g. '{name}:/data/graph.txt.gz').")
    return DatasetSpec(name, params)


def load(
    spec: str,
    root: str | os.PathLike[str] | None = None,
    cache: bool = True,
    *,
    download: bool = True,
    progress: bool | None = None,
    storage: str = "memory",
    budget: int | None = None,
) -> NodeDataset | GraphDataset:
    """Load a dataset from a spec string.

    Examples: ``cora``, ``citeseer``, ``pubmed:structure``,
    ``rmat:scale=18,edge_factor=16,feat=64,classes=8,seed=0``, ``sbm``,
    ``sbm:nodes=2000,blocks=7,p_in=0.03,p_out=0.002``, ``edgelist:graph.txt.gz,feat=32``,
    ``ogb:/data/ogbn_arxiv``, ``twitter``, ``tu:data/MUTAG`` and
    ``ogbg:/data/ogbg_molhiv`` (a :class:`~ngra.datasets.graphs.GraphDataset` of many
    graphs). Call :func:`describe` for
    every key.

    Args:
        spec: the dataset spec string.
        root: data root (default: ``$NGRA_DATA``, else ``~/.ngra/data``). Relative
            paths in a spec are looked up in the current directory, then the root.
        cache: read/write the on-disk cache (``$NGRA_CACHE`` or ``<root>/cache``) for
            generated and parsed datasets; Planetoid is always parsed directly.
        download: fetch missing raw files (Planetoid, ego-Twitter) from their public home.
        progress: tqdm bars (default: when stderr is a terminal).
        storage: ``"memory"`` reads the arrays; ``"disk"`` memory-maps the cache
            entry's arrays (:mod:`ngra.datasets.store`); ``"auto"`` maps them when they
            would take more than half the available memory, or more than ``budget``.
        budget: the memory budget in bytes ``storage="auto"`` weighs the data against.

    A damaged cache entry (a truncated or overwritten file, see
    :mod:`ngra.datasets.cache`) is reported as a warning naming the file, deleted and
    rebuilt.

    Returns:
        The :class:`NodeDataset` (``tu:``, ``ogbg:``: a :class:`GraphDataset`);
        ``info["spec"]`` holds the canonical spec,
        ``info["cache"]`` is ``"hit"``, ``"miss"`` or ``"off"``, and ``info["storage"]``
        says whether the arrays are in memory or mapped from disk.

    Raises:
        SpecError: malformed spec (the message lists valid names/keys).
        DatasetNotFoundError: missing files (the message names them and the root searched).
    """
    parsed = parse_spec(spec)
    entry = parsed.entry
    root_path = data_root(root)
    params = dict(parsed.params)
    for p in entry.params:  # absolute paths: the canonical form names the files read
        if p.kind == "path" and params[p.name] is not None:
            params[p.name] = str(_collection_path(entry.name, params[p.name], root_path)
                                 if entry.name in _COLLECTIONS
                                 else _resolve(params[p.name], root_path))
    canonical = DatasetSpec(parsed.name, params).canonical()
    if storage not in STORAGES:
        raise SpecError(f"storage must be one of {STORAGES}; got {storage!r}.")
    use_cache = cache and entry.cacheable
    if storage == "disk" and not use_cache:
        raise SpecError(f"{canonical}: storage='disk' maps a cache entry, but "
                        f"{'caching is off' if entry.cacheable else 'this dataset is not cached'};"
                        " use storage='memory'.")
    directory = None
    if use_cache:
        stamp = source_stamp(entry.sources(root_path, **params)) if entry.sources else None
        directory = cache_root(root_path) / cache_key(canonical, stamp)
        ds = _open_entry(directory, canonical, storage, budget)
        if ds is not None:
            log.info("loaded %s from cache %s (%s)", canonical, directory, ds.info["storage"])
            if "symmetric_option" in ds.info:
                ds.info["symmetric_option"] = symmetric_spec(spec)
            warn_if_one_direction(ds)  # as the first load did, once per process
            return ds
    writer = None
    if use_cache and entry.streams:
        try:
            writer = EntryWriter(directory)
        except OSError:
            writer = None  # save_cached reports the unwritable folder
    try:
        extra = {"out": writer} if writer is not None else {}
        with loading_spec(spec):
            ds = entry.build(root_path, download, progress, **params, **extra)
    except BaseException:
        if writer is not None:
            writer.discard()
        raise
    ds.info["spec"] = canonical
    ds.info["cache"] = "miss" if use_cache else "off"
    ds.info["storage"] = "memory"
    ds.reciprocity  # measured once, before caching, so that a cache hit has it
    if use_cache:
        # Stamp again: building may have downloaded the sources.
        stamp = source_stamp(entry.sources(root_path, **params)) if entry.sources else None
        target = cache_root(root_path) / cache_key(canonical, stamp)
        if writer is not None and target != directory:
            writer.discard()
            writer = None
        if save_cached(ds, target, canonical, writer):
            ds.info["cache_dir"] = str(target)
            if writer is not None or storage != "memory":
                # arrays built into the entry are mapped from it, not kept as built
                del ds
                ds = _open_entry(target, canonical, storage, budget)
                ds.info["cache"] = "miss"
    return ds


def _open_entry(directory: Path, canonical: str, storage: str,
                budget: int | None) -> NodeDataset | None:
    """The cache entry read or mapped per ``storage``; ``None`` when absent or damaged
    (a damaged one is reported, deleted and so rebuilt by the caller)."""
    try:
        mode = storage
        if storage == "auto" and (directory / "meta.json").is_file():
            mode = choose_storage("auto", entry_bytes(directory), budget)
        return load_cached(directory, canonical, mmap=mode == "disk")
    except (CacheError, ValueError, OSError) as err:
        log.warning("ignoring unreadable dataset cache %s: %s; rebuilding it", directory, err)
        remove_entry(directory)
        return None


def _keys(entry: Entry) -> str:
    return ", ".join(
        f"{p.name} ({p.kind}, default {p.format(p.default)}: {p.help})" for p in entry.params
    )


def _resolve(path: str | os.PathLike[str], root: Path) -> Path:
    """An absolute path: as given if absolute; else the current directory's, else the root's."""
    p = Path(path).expanduser()
    if p.is_absolute():
        return p
    if p.exists() or not (root / p).exists():
        return p.resolve()
    return (root / p).resolve()
