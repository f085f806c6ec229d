"""Planetoid citation graphs (Cora, CiteSeer, PubMed) from the raw ``ind.<name>.*`` files.

Reproduces the standard public split of Yang et al. (ICML 2016) exactly as PyG's
``Planetoid`` builds it: train = the ``len(y)`` labeled ``x`` rows (20 per class),
val = the next 500 nodes, test = the nodes of ``test.index``; ``tx``/``ty`` rows are
moved to the (unsorted) test indices, and where the test index range has gaps
(CiteSeer's 15 isolated test nodes) the missing rows are zero features with
label 0. The graph is made symmetric, with self-loops and duplicate edges
removed (Cora: 10,556 directed edges; CiteSeer: 9,104).

``allow_missing_features`` (the spec's ``structure`` flag) keeps the real graph, labels
and split but draws random features: ``info["synthesized"]`` is then ``["features"]``
(``[]`` otherwise).

Files are looked up in ``<root>/planetoid/`` and then ``<root>/``; missing ones are
downloaded into ``<root>/planetoid/`` from the Planetoid repository when
``download=True`` and checked against the sha256 recorded here.

A damaged file raises :class:`~ngra.errors.DamagedFileError` naming it and the fix:
one that does not unpickle, whose objects have the wrong types or shapes, or --
since a flipped bit in a value still parses -- whose sha256 differs from the
published file's.
"""

from __future__ import annotations

import logging
import pickle
import warnings
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from .base import (
    DamagedFileError,
    DatasetError,
    DatasetNotFoundError,
    NodeDataset,
    csc_graph,
    data_root,
    rng_for,
    writable,
)
from .download import DownloadError, fetch, sha256_of

__all__ = ["PLANETOID_NAMES", "load_planetoid", "planetoid_url"]

log = logging.getLogger(__name__)

#: name -> (feature width, classes)
PLANETOID_NAMES: dict[str, tuple[int, int]] = {
    "cora": (1433, 7),
    "citeseer": (3703, 6),
    "pubmed": (500, 3),
}

_EXTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
_FEATURE_EXTS = ("x", "tx", "allx")
_URL = "https://github.com/kimiyoung/planetoid/raw/master/data/ind.{name}.{ext}"

# sha256 of the files in kimiyoung/planetoid (data/, HEAD af6abf4). None: not recorded
# (ind.pubmed.allx was not available when these were taken), downloaded unverified.
_SHA256: dict[str, str | None] = {
    "ind.cora.x": "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
    "ind.cora.tx": "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
    "ind.cora.allx": "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
    "ind.cora.y": "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
    "ind.cora.ty": "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
    "ind.cora.ally": "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
    "ind.cora.graph": "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
    "ind.cora.test.index": "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875",
    "ind.citeseer.x": "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6",
    "ind.citeseer.tx": "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21",
    "ind.citeseer.allx": "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668",
    "ind.citeseer.y": "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924",
    "ind.citeseer.ty": "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce",
    "ind.citeseer.ally": "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95",
    "ind.citeseer.graph": "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7",
    "ind.citeseer.test.index": "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4",
    "ind.pubmed.x": "fbe9cb5c47200d1b7769a26e579be3b7130b556831f9d850e77c4c74f2599b33",
    "ind.pubmed.tx": "4eb5f5d0f30f26497eb0ac6ac9719d09c67e284f1ed0385c93f3ef27a671da3d",
    "ind.pubmed.allx": None,
    "ind.pubmed.y": "e6c807633307a07ed659249006536a147c7999c797f11a2560752990181b41b3",
    "ind.pubmed.ty": "ee2e0d4819d9fbcc403689c3bf2e49face401b605932f093bc58ab6461130fdd",
    "ind.pubmed.ally": "0c37bbe3b5014ec365e9d393cf4791925e5ed94fb194305d74f064a8d7b50f0e",
    "ind.pubmed.graph": "5b89f0036ca22909471f1e6558eb42fa06e0c730a577bde5b058b40638f81dc9",
    "ind.pubmed.test.index": "b101d421688bbaecbd82e8a18f1e282378d6830f3a37666f28ebc47f844341b5",
}

_VAL_SIZE = 500


def planetoid_url(name: str, ext: str) -> str:
    """Public URL of one raw file."""
    return _URL.format(name=name, ext=ext)


def load_planetoid(
    name: str,
    root: str | Path | None = None,
    *,
    download: bool = True,
    allow_missing_features: bool = False,
    seed: int = 0,
    progress: bool | None = None,
) -> NodeDataset:
    """Load Cora, CiteSeer or PubMed with the standard public split.

    Args:
        name: ``"cora"``, ``"citeseer"`` or ``"pubmed"`` (any case).
        root: data root (default: ``$NGRA_DATA``, else ``~/.ngra/data``); files are
            read from ``<root>/planetoid/`` or ``<root>/``.
        download: fetch missing files from the Planetoid GitHub repository.
        allow_missing_features: structure mode ("PubMed-structure"): the feature
            files (``x``, ``tx``, ``allx``) are not read and need not exist;
            features are seeded ``N(0, 1)`` noise of the real width. Graph, labels
            and split are real. This is what the spec ``pubmed:structure`` loads.
        seed: seed of the random features in structure mode.
        progress: show download progress (default: when stderr is a terminal).

    Returns:
        A :class:`NodeDataset` (graph symmetric, no self-loops, no duplicates).

    Raises:
        DatasetNotFoundError: files are missing and could not be downloaded; the
            message names the files and the folders searched.
    """
    key = name.lower()
    if key not in PLANETOID_NAMES:
        raise DatasetError(
            f"unknown Planetoid dataset {name!r}; expected one of {sorted(PLANETOID_NAMES)}."
        )
    root_path = data_root(root)
    exts = [e for e in _EXTS if not (allow_missing_features and e in _FEATURE_EXTS)]
    paths = _locate(key, root_path, exts, download, allow_missing_features, progress)
    raw = {ext: _read(paths[ext], ext, key) for ext in exts}
    _check_raw(key, raw, paths)

    ally, ty = raw["ally"], raw["ty"]
    n_all = ally.shape[0]
    test_index = raw["test.index"]
    sorted_test = np.sort(test_index)
    t_min = int(sorted_test[0])
    n_test_rows = int(sorted_test[-1]) - t_min + 1
    num_nodes = n_all + n_test_rows
    # Test rows go to their (sorted) positions in the test id range; gaps stay zero.
    slot = sorted_test - t_min
    ty_ext = np.zeros((n_test_rows, ty.shape[1]), dtype=ty.dtype)
    ty_ext[slot] = ty
    # Row i of the stacked arrays moves to position test_index[i] ... as PyG's
    # `x[test_index] = x[sorted_test_index]`: new[test_index] = old[sorted_test].
    order = np.arange(num_nodes)
    order[test_index] = sorted_test
    y = np.concatenate([ally, ty_ext]).argmax(axis=1)[order].astype(np.int64)

    num_features, num_classes = PLANETOID_NAMES[key]
    if allow_missing_features:
        if "tx" in raw:
            num_features = raw["tx"].shape[1]
        x = rng_for(seed, f"planetoid-{key}-features").standard_normal(
            (num_nodes, num_features), dtype=np.float32
        )
    else:
        import scipy.sparse as sp

        tx = raw["tx"].tocoo()
        tx_ext = sp.csr_matrix((tx.data, (slot[tx.row], tx.col)), shape=(n_test_rows, tx.shape[1]))
        x = sp.vstack([raw["allx"], tx_ext]).tocsr()[order].toarray().astype(np.float32)
    if ally.shape[1] != num_classes:
        log.warning("%s: %d label columns, expected %d", key, ally.shape[1], num_classes)
    num_classes = ally.shape[1]

    graph_dict = raw["graph"]
    try:
        keys = np.fromiter(graph_dict.keys(), dtype=np.int64, count=len(graph_dict))
        lens = np.fromiter(
            (len(v) for v in graph_dict.values()), dtype=np.int64, count=len(graph_dict)
        )
        src = np.repeat(keys, lens)
        dst = np.fromiter(
            (u for v in graph_dict.values() for u in v), dtype=np.int64, count=int(lens.sum())
        )
        graph = csc_graph(src, dst, num_nodes, symmetric=True, remove_self_loops=True, dedup=True)
    except (ValueError, TypeError, OverflowError) as err:  # DatasetError: ids out of range
        raise _damaged(paths["graph"], key, f"bad adjacency lists ({err})") from None

    n_train = raw["y"].shape[0]
    masks = []
    for idx in (np.arange(n_train), np.arange(n_train, n_train + _VAL_SIZE), test_index):
        m = torch.zeros(num_nodes, dtype=torch.bool)
        m[torch.from_numpy(idx)] = True
        masks.append(m)
    info = {
        "source": str(paths["graph"].parent),
        "features": "random" if allow_missing_features else "raw",
        "synthesized": ["features"] if allow_missing_features else [],
    }
    return NodeDataset(
        name=key,
        graph=graph,
        x=torch.from_numpy(x),
        y=torch.from_numpy(y),
        train_mask=masks[0],
        val_mask=masks[1],
        test_mask=masks[2],
        num_classes=num_classes,
        info=info,
    )


def _locate(
    name: str, root: Path, exts: list[str], download: bool, structure: bool, progress: bool | None
) -> dict[str, Path]:
    """Find every needed file in ``root/planetoid`` or ``root``; download the missing ones."""
    dirs = [root / "planetoid", root]
    found: dict[str, Path] = {}
    missing: list[str] = []
    for ext in exts:
        fname = f"ind.{name}.{ext}"
        hit = next((d / fname for d in dirs if (d / fname).is_file()), None)
        if hit is None:
            missing.append(ext)
        else:
            found[ext] = hit
    if not missing:
        return found
    files = [f"ind.{name}.{ext}" for ext in missing]
    searched = " and ".join(str(d) for d in dirs)
    hint = (
        f"Put the raw Planetoid files in {dirs[0]} (from https://github.com/kimiyoung/planetoid/tree/master/data), "
        "or point --data-root / NGRA_DATA at a folder holding them"
    )
    if any(e in _FEATURE_EXTS for e in missing) and not structure:
        hint += f", or load '{name}:structure' (real graph, labels and split; random features)"
    if not download:
        raise DatasetNotFoundError(
            f"{name}: missing raw file(s) {', '.join(files)}; searched {searched} (downloading is off). {hint}."
        )
    target = dirs[0]
    if not writable(target):
        raise DatasetNotFoundError(
            f"{name}: missing raw file(s) {', '.join(files)}; searched {searched}. {target} is "
            f"read-only, so they were not downloaded there. {hint}."
        )
    for ext, fname in zip(missing, files):
        url = planetoid_url(name, ext)
        try:
            found[ext] = fetch(url, target / fname, sha256=_SHA256.get(fname), progress=progress)
        except (DownloadError, PermissionError, OSError) as err:
            raise DatasetNotFoundError(
                f"{name}: missing raw file(s) {', '.join(files)}; searched {searched}. "
                f"Downloading {fname} from {url} into {target} failed ({err}). {hint}."
            ) from err
    return found


class _RawUnpickler(pickle._Unpickler):
    """Unpickles only what the Planetoid files contain (no arbitrary code on load).

    The pure-Python unpickler, not the C one: the C one sizes its memo table by the
    largest memo index, so a damaged BINPUT index makes it zero gigabytes (the OOM
    killer, not an error); here the memo is a dict. The files are small, so the
    speed is the same.
    """

    _ALLOWED: ClassVar[frozenset[tuple[str, str]]] = frozenset(
        {
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy.core.multiarray", "scalar"),
            ("numpy._core.multiarray", "scalar"),
            ("collections", "defaultdict"),
            ("collections", "OrderedDict"),
            ("__builtin__", "list"),
            ("builtins", "list"),
            ("__builtin__", "set"),
            ("builtins", "set"),
            ("__builtin__", "dict"),
            ("builtins", "dict"),
            ("__builtin__", "int"),
            ("builtins", "int"),
        }
    )

    def find_class(self, module: str, name: str):
        sparse = module.startswith("scipy.sparse") and name.endswith("_matrix")
        if not sparse and (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name} from a Planetoid file: only numpy arrays, "
                "scipy sparse matrices and a dict of lists are expected."
            )
        return super().find_class(module, name)


def _damaged(path: Path, name: str, what: str) -> DamagedFileError:
    """The error for a damaged raw file: what is wrong, whether its checksum matches, the fix."""
    want = _SHA256.get(path.name)
    check = ""
    if want is not None:
        same = sha256_of(path) == want
        check = (" Its sha256 matches the published file's." if same else
                 " Its sha256 differs from the published file's.")
    return DamagedFileError(
        path,
        f"{path} is damaged: {what}.{check} Delete it and load {name!r} again to download a "
        f"fresh copy (or copy it again from {planetoid_url(name, path.name.split('.', 2)[2])}).",
    )


def _read(path: Path, ext: str, name: str):
    """One raw file's object; any failure to read it is a :class:`DamagedFileError`."""
    try:
        if ext == "test.index":
            return np.array(path.read_bytes().split(), dtype=np.int64)
        with open(path, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # old pickles name scipy.sparse.csr
            return _RawUnpickler(f, encoding="latin1").load()
    except (OSError, MemoryError):
        raise
    except Exception as err:  # a damaged pickle fails in any of a dozen ways
        what = "one integer per line expected" if ext == "test.index" else "not a readable pickle"
        reason = str(err).rstrip(".")
        raise _damaged(path, name, f"{what} ({type(err).__name__}: {reason})") from None


def _check_raw(name: str, raw: dict, paths: dict[str, Path]) -> None:
    """The raw objects have the types and matching shapes the Planetoid files have.

    Sparse feature matrices are converted to CSR (checked) in place.
    """
    import scipy.sparse as sp

    width, _ = PLANETOID_NAMES[name]
    for ext in ("x", "tx", "allx", "y", "ty", "ally"):
        if ext not in raw:
            continue
        obj = raw[ext]
        if ext in _FEATURE_EXTS:
            if not sp.issparse(obj) or obj.ndim != 2 or obj.shape[1] != width:
                raise _damaged(paths[ext], name, f"expected a sparse [rows, {width}] feature "
                                                 f"matrix; got {_describe(obj)}")
            try:
                obj = raw[ext] = sp.csr_matrix(obj)
                obj.check_format(full_check=True)
            except Exception as err:  # scipy raises ValueError, IndexError, TypeError, ...
                raise _damaged(paths[ext], name, f"inconsistent sparse matrix ({err})") from None
        elif not (isinstance(obj, np.ndarray) and obj.ndim == 2 and obj.dtype.kind in "biuf"
                  and obj.shape[1] >= 1):
            raise _damaged(paths[ext], name,
                           f"expected a one-hot label matrix; got {_describe(obj)}")
    test_index = raw["test.index"]
    if test_index.size == 0 or np.unique(test_index).size != test_index.size:
        raise _damaged(paths["test.index"], name, "expected distinct test vertex ids, one a line")
    graph = raw["graph"]
    if not isinstance(graph, dict) or not all(
        isinstance(v, (list, tuple, set)) for v in graph.values()
    ):
        raise _damaged(paths["graph"], name,
                       f"expected a dict of adjacency lists; got {_describe(graph)}")
    rows = {ext: raw[ext].shape for ext in raw if ext not in ("graph", "test.index")}
    n_all = rows["ally"][0]
    pairs = [("y", "x"), ("ty", "tx"), ("ally", "allx")]
    mismatch = [(a, b) for a, b in pairs if b in rows and rows[a][0] != rows[b][0]]
    mismatch += [(a, "y") for a in ("ty", "ally") if rows[a][1] != rows["y"][1]]
    if rows["ty"][0] != test_index.size:
        mismatch.append(("ty", "test.index"))
    if mismatch:
        a, b = mismatch[0]
        shape_a, shape_b = list(rows[a]), list(rows.get(b, test_index.shape))
        if _SHA256.get(paths[a].name) == sha256_of(paths[a]):  # a is intact: b is the damaged one
            a, b, shape_a, shape_b = b, a, shape_b, shape_a
        raise _damaged(paths[a], name, f"its shape {shape_a} does not fit "
                                       f"ind.{name}.{b}'s {shape_b}")
    if rows["y"][0] + _VAL_SIZE > n_all:
        raise _damaged(paths["ally"], name, f"{n_all} rows; the public split needs at least "
                                            f"{rows['y'][0] + _VAL_SIZE}")
    if int(test_index.min()) != n_all or int(test_index.max()) >= len(graph):
        raise _damaged(paths["test.index"], name, f"test ids must lie in [{n_all}, {len(graph)}) "
                                                  "(after the labelled rows, inside the graph)")
    for path in paths.values():  # a flipped bit in a value parses: only the checksum tells
        want = _SHA256.get(path.name)
        if want is not None and sha256_of(path) != want:
            raise _damaged(path, name, "it reads as a Planetoid file, but its contents are not "
                                       "the published file's")


def _describe(obj: object) -> str:
    shape = getattr(obj, "shape", None)
    return type(obj).__name__ + (f" of shape {list(shape)}" if isinstance(shape, tuple) else "")
