"""Fuzzing battery for the loaders: generated and mutated edge lists (SNAP, LG), OGB raw
folders, Planetoid files and spec strings. Each input loads into a valid dataset or
raises DatasetError / DatasetNotFoundError with a message (see tests/fuzzing.py)."""

from __future__ import annotations

import pickle
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("hypothesis")
from fuzzing import documented_errors, maybe_gzipped, mutated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ngra.datasets import (
    DatasetError,
    DatasetNotFoundError,
    load,
    load_edgelist,
    load_ogb,
    load_planetoid,
    parse_spec,
    read_edgelist,
)
from ngra.datasets.spec import _ALIASES, _REGISTRY

pytestmark = pytest.mark.timeout(240)
LOADER_ERRORS = (DatasetError, DatasetNotFoundError)


def _check_dataset(ds, feat: int | None = None) -> None:
    """A loaded dataset is internally consistent (NodeDataset checked the rest)."""
    n = ds.num_nodes
    ei = ds.graph.edge_index()
    assert ei.shape == (2, ds.num_edges)
    if ds.num_edges:
        assert 0 <= int(ei.min()) and int(ei.max()) < n
    assert ds.graph.indptr.shape == (n + 1,) and int(ds.graph.indptr[-1]) == ds.num_edges
    if feat is not None:
        assert ds.x.shape == (n, feat)
    for mask in (ds.train_mask, ds.val_mask, ds.test_mask):
        assert not bool((mask & (ds.y < 0)).any())


def _scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="ngra-fuzz-"))


# ----------------------------------------------------------------- edge lists
_TOKEN = st.one_of(
    st.integers(0, 12).map(str),
    st.integers(-3, 2**70).map(str),
    st.sampled_from(["nan", "inf", "1.5", "2e1", "x", "0x1", "-0", "\u0663", "1,2"]),
)
_LINE = st.one_of(
    st.tuples(st.lists(_TOKEN, max_size=4), st.sampled_from([" ", "\t", ",", ", "])).map(
        lambda t: t[1].join(t[0])
    ),
    st.sampled_from(["# comment", "% comment", "", "  "]),
)
_LG_HEADER = st.builds(
    lambda n, e, kind: f"{n},{e},{kind},g", st.integers(0, 12), st.integers(0, 12),
    st.sampled_from("ud"),
)


@st.composite
def edge_list_files(draw: st.DrawFn) -> bytes:
    """Generated edge-list text (SNAP or LG), or a valid one mutated, maybe gzipped."""
    if draw(st.booleans()):
        lines = draw(st.lists(_LINE, max_size=10))
        if draw(st.booleans()):
            lines.insert(0, draw(_LG_HEADER))
        text = draw(st.sampled_from(["\n", "\r\n"])).join(lines).encode()
    else:
        edges = draw(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=12))
        if draw(st.booleans()):  # LG: 1-based ids and a header
            text = f"10,{len(edges)},u,g\n".encode() + b"".join(
                f"{s + 1},{d + 1}\n".encode() for s, d in edges)
        else:
            text = b"# snap\n" + b"".join(f"{s}\t{d}\n".encode() for s, d in edges)
        text = draw(mutated(text))
    return draw(maybe_gzipped(text))


@given(edge_list_files())
def test_fuzz_edge_lists(data: bytes) -> None:
    folder = _scratch()
    try:
        path = folder / "g.txt"
        path.write_bytes(data)
        with documented_errors(*LOADER_ERRORS):
            el = read_edgelist(path, progress=False)
            assert el.src.shape == el.dst.shape and el.src.dtype == np.int64
            if el.src.size:
                assert min(el.src.min(), el.dst.min()) >= 0
                assert max(el.src.max(), el.dst.max()) < el.num_nodes
        with documented_errors(*LOADER_ERRORS):
            _check_dataset(load_edgelist(path, feat=3, classes=2, progress=False), feat=3)
    finally:
        shutil.rmtree(folder)


# ----------------------------------------------------------------------- OGB
def _ogb_files(n: int, f: int, edges: list[tuple[int, int]], labels: list[str]) -> dict:
    rng = np.random.default_rng(n * 31 + f)
    feats = rng.standard_normal((n, f)).round(3)
    ids = list(range(n))
    return {
        "raw/edge.csv": "".join(f"{s},{d}\n" for s, d in edges),
        "raw/node-feat.csv": "".join(",".join(map(str, row)) + "\n" for row in feats),
        "raw/node-label.csv": "".join(lab + "\n" for lab in labels),
        "raw/num-node-list.csv": f"{n}\n",
        "split/s/train.csv": "".join(f"{i}\n" for i in ids[: max(1, n // 2)]),
        "split/s/valid.csv": "".join(f"{i}\n" for i in ids[n // 2 : n // 2 + 1]),
        "split/s/test.csv": "".join(f"{i}\n" for i in ids[n // 2 + 1 :]),
    }


@st.composite
def ogb_folders(draw: st.DrawFn) -> dict[str, bytes | None]:
    """A tiny valid OGB raw layout with one file mutated, emptied or removed."""
    n = draw(st.integers(1, 6))
    f = draw(st.integers(1, 3))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=8))
    labels = draw(st.lists(st.sampled_from(["0", "1", "2", "nan", ""]), min_size=n, max_size=n))
    files: dict[str, bytes | None] = {
        k: v.encode() for k, v in _ogb_files(n, f, edges, labels).items()
    }
    victim = draw(st.sampled_from(sorted(files)))
    how = draw(st.sampled_from(["mutate", "mutate", "empty", "remove", "none"]))
    if how == "mutate":
        files[victim] = draw(mutated(files[victim]))
    elif how == "empty":
        files[victim] = b""
    elif how == "remove":
        files[victim] = None
    return {k: (v if v is None else draw(maybe_gzipped(v))) for k, v in files.items()}


@given(ogb_folders())
def test_fuzz_ogb_folders(files: dict[str, bytes | None]) -> None:
    folder = _scratch()
    try:
        for name, data in files.items():
            if data is not None:
                path = folder / "ogbn_fuzz" / (name + (".gz" if data[:2] == b"\x1f\x8b" else ""))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
        with documented_errors(*LOADER_ERRORS):
            ds = load_ogb(folder / "ogbn_fuzz", progress=False)
            _check_dataset(ds)
            assert ds.x.dtype == torch.float32 and ds.x.shape[0] == ds.num_nodes
    finally:
        shutil.rmtree(folder)


# ------------------------------------------------------------------ Planetoid
_PLANETOID_EXTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")


@st.composite
def planetoid_damage(draw: st.DrawFn, real: dict[str, bytes]) -> tuple[str, bytes]:
    """One of Cora's raw files, mutated or replaced by a generated pickle."""
    ext = draw(st.sampled_from(_PLANETOID_EXTS))
    if ext != "test.index" and draw(st.booleans()):
        obj = draw(st.one_of(
            st.none(),
            st.integers(),
            st.lists(st.integers(-2, 3000), max_size=5),
            st.dictionaries(st.integers(-2, 3000), st.lists(st.integers(-2, 3000), max_size=3),
                            max_size=4),
            st.tuples(st.integers(0, 4), st.integers(0, 8)).map(lambda s: np.ones(s, np.int32)),
        ))
        return ext, pickle.dumps(obj, protocol=2)
    return ext, draw(mutated(real[ext]))


@pytest.fixture(scope="module")
def cora_files(data_dir: Path) -> dict[str, bytes]:
    return {ext: (data_dir / "planetoid" / f"ind.cora.{ext}").read_bytes()
            for ext in _PLANETOID_EXTS}


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_planetoid_files(cora_files: dict[str, bytes], data: st.DataObject) -> None:
    ext, damaged = data.draw(planetoid_damage(cora_files))
    folder = _scratch()
    try:
        (folder / "planetoid").mkdir()
        for name, raw in cora_files.items():
            (folder / "planetoid" / f"ind.cora.{name}").write_bytes(raw)
        (folder / "planetoid" / f"ind.cora.{ext}").write_bytes(damaged)
        with documented_errors(*LOADER_ERRORS):
            _check_dataset(load_planetoid("cora", folder, download=False), feat=1433)
    finally:
        shutil.rmtree(folder)


# ---------------------------------------------------------------- spec strings
_NAMES = sorted(_REGISTRY) + sorted(_ALIASES)
_KEYS = sorted({p.name for e in _REGISTRY.values() for p in e.params})
_VALUES = st.one_of(
    st.integers(-3, 2**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["true", "no", "auto", "", "x", "1e3", "0.5", "structure", "id"]),
    st.text(max_size=5),
)


@st.composite
def spec_strings(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        return draw(st.text(max_size=30))
    name = draw(st.sampled_from(_NAMES) | st.text(max_size=6))
    args = draw(st.lists(
        st.one_of(st.tuples(st.sampled_from(_KEYS) | st.text(max_size=4), _VALUES).map("=".join),
                  _VALUES),
        max_size=4,
    ))
    return name + (":" + ",".join(args) if args or draw(st.booleans()) else "")


@given(spec_strings())
def test_fuzz_spec_strings(spec: str) -> None:
    with documented_errors(DatasetError):
        parsed = parse_spec(spec)
        again = parse_spec(parsed.canonical())
        assert again.canonical() == parsed.canonical()


@given(
    st.sampled_from(["sbm:nodes={n},blocks={k}", "rmat:scale={s},edge_factor={k}"]),
    st.integers(0, 40), st.integers(-1, 6), st.integers(1, 6),
    st.lists(st.tuples(
        st.sampled_from(["feat", "classes", "noise", "train", "val", "edge_types", "p_in",
                         "seed", "symmetric", "a", "labels"]),
        st.sampled_from(["0", "-1", "1", "3", "0.5", "nan", "inf", "1e-9", "true", "diffusion"]),
    ), max_size=3, unique_by=lambda kv: kv[0]),
)
def test_fuzz_small_generated_specs(template: str, n: int, k: int, s: int, extra: list) -> None:
    spec = template.format(n=n, k=k, s=s) + "".join(f",{key}={v}" for key, v in extra)
    with documented_errors(DatasetError):
        _check_dataset(load(spec, cache=False, progress=False))
