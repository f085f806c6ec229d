"""Edge direction: reciprocity in every summary, symmetric= on every file loader and interop
import, OGB's add_inverse_edge, and one warning for a one-direction edge list."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from test_ogb_format import make_ogb

from ngra import Graph
from ngra.datasets import describe, direction, from_dgl, from_pyg, load, load_edgelist, load_ogb
from ngra.datasets.base import csc_graph

WARNING = "ngra.datasets.direction"


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direction, "_warned", set())


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == WARNING]


def _ring_once(path: Path, n: int = 12) -> Path:
    """An undirected ring plus chords, each edge written once (a one-direction list)."""
    lines = [f"{i} {(i + 1) % n}" for i in range(n)] + [f"{i} {i + n // 2}" for i in range(3)]
    path.write_text("# undirected, each edge once\n" + "\n".join(lines) + "\n")
    return path


def _pairs(graph: Graph) -> set[tuple[int, int]]:
    return set(map(tuple, graph.edge_index().t().tolist()))


def test_reciprocity_against_a_plain_count():
    rng = np.random.default_rng(int(torch.randint(1 << 30, ())))
    src, dst = rng.integers(0, 30, 200), rng.integers(0, 30, 200)
    g = Graph.from_edge_index(torch.from_numpy(np.stack([src, dst])), num_nodes=30)
    edges = [(s, d) for s, d in zip(src.tolist(), dst.tolist()) if s != d]
    present = set(edges)
    want = sum((d, s) in present for s, d in edges) / len(edges)
    assert direction.reciprocity(g) == pytest.approx(want)
    assert direction.reciprocity(Graph.from_edge_index(torch.tensor([[1], [1]]), 3)) is None
    sym = csc_graph(src, dst, 30, symmetric=True, remove_self_loops=False, dedup=False)
    assert direction.reciprocity(sym) == 1.0


def test_chunked_reciprocity_matches_the_sorted_count(monkeypatch: pytest.MonkeyPatch):
    """Past SORT_MAX_EDGES the CSC is walked (a binary search an edge, on every thread):
    the same figure, on graphs with unsorted columns (sorted in chunks of any size),
    multi-edges, self-loops and isolated vertices."""
    import ngra.kernels.cpu.util as cpu_util

    monkeypatch.setattr(cpu_util, "_MIN_PARALLEL_BYTES", 0)  # the threads on tiny graphs
    rng = np.random.default_rng(int(torch.randint(1 << 30, ())))
    for trial in range(40):
        n, m = int(rng.integers(1, 40)), int(rng.integers(0, 300))
        src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
        if trial % 3 == 0:  # mostly reciprocal
            src, dst = np.concatenate([src, dst[: m // 2]]), np.concatenate([dst, src[: m // 2]])
        g = Graph.from_edge_index(torch.from_numpy(np.stack([src, dst])), num_nodes=n)
        deduped = csc_graph(src, dst, n, symmetric=False, remove_self_loops=False, dedup=True)
        for graph in (g, deduped):  # columns as listed, and sorted (no copy made)
            monkeypatch.setattr(direction, "SORT_MAX_EDGES", 1 << 40)
            monkeypatch.setattr(direction, "_CHUNK", 1 << 22)
            want = direction.reciprocity(graph)
            monkeypatch.setattr(direction, "SORT_MAX_EDGES", 0)
            monkeypatch.setattr(direction, "_CHUNK", int(rng.integers(1, 64)))
            got = direction.reciprocity(graph)
            assert got == pytest.approx(want) if want is not None else got is None, trial


def test_symmetric_adds_only_missing_reverses():
    # 0<->1 listed both ways (and 0->1 twice), 1->2 once, a self-loop on 3
    src, dst = np.array([0, 1, 0, 1, 3]), np.array([1, 0, 1, 2, 3])
    s, d, added = direction.add_missing_reverses(src, dst, 4)
    assert added.tolist() == [3]
    assert list(zip(s.tolist(), d.tolist())) == [(0, 1), (1, 0), (0, 1), (1, 2), (3, 3), (2, 1)]
    g = csc_graph(src, dst, 4, symmetric=True, remove_self_loops=False, dedup=False)
    assert g.num_edges == 6  # the reciprocal pair is not doubled


def test_one_direction_edge_list_warns_once_and_symmetric_fixes_it(tmp_path, caplog):
    path = _ring_once(tmp_path / "ring.txt")
    spec = f"edgelist:{path},feat=4,classes=2"
    with caplog.at_level(logging.WARNING):
        ds = load(spec)
        load(spec)  # from the cache: same process, no second warning
    assert ds.summary()["reciprocity"] == 0.0 and ds.summary()["symmetric"] is False
    (msg,) = _warnings(caplog)
    assert "0.0% of its 15 edges have their reverse" in msg
    assert f"load it with {spec},symmetric=true" in msg and "symmetric=false" in msg
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        sym = load(spec + ",symmetric=true")
        stated = load(f"csv:{path},feat=4,classes=2,symmetric=false")  # csv: an alias
    assert not _warnings(caplog)
    assert sym.num_edges == 30 and sym.reciprocity == 1.0
    assert sym.summary()["direction"] == "symmetric=true given"
    assert stated.num_edges == 15 and stated.summary()["direction"] == "symmetric=false given"


def test_cached_one_direction_list_warns_in_a_new_process(tmp_path, caplog, monkeypatch):
    spec = f"edgelist:{_ring_once(tmp_path / 'ring.txt')},feat=4,classes=2"
    load(spec)
    caplog.clear()
    monkeypatch.setattr(direction, "_warned", set())  # as a fresh process
    with caplog.at_level(logging.WARNING):
        ds = load(spec)
    assert ds.info["cache"] == "hit" and len(_warnings(caplog)) == 1


def test_directed_graph_with_reciprocal_edges_and_lg_files_do_not_warn(tmp_path, caplog):
    mutual = tmp_path / "mutual.txt"
    mutual.write_text("0 1\n1 0\n1 2\n2 1\n2 3\n")  # 80% reciprocal: a directed graph
    lg = tmp_path / "g.lg"
    lg.write_text("4,3,d,g\n1,2\n2,3\n3,4\n")  # the header says directed
    with caplog.at_level(logging.WARNING):
        assert load_edgelist(mutual, feat=2, classes=2).reciprocity == pytest.approx(0.8)
        ds = load_edgelist(lg, feat=2, classes=2)
    assert not _warnings(caplog)
    assert ds.info["direction"] == "LG header: directed" and ds.info["symmetric"] is False


def _one_direction_ogb(folder: Path) -> Path:
    make_ogb(folder)
    lines = "\n".join(f"{i},{(i + 1) % 6}" for i in range(6)) + "\n"
    (folder / "raw" / "edge.csv.gz").unlink()
    (folder / "raw" / "edge.csv").write_text(lines)
    return folder


def test_ogb_one_direction_warns_with_the_spec_option(tmp_path, caplog):
    folder = _one_direction_ogb(tmp_path / "social")
    with caplog.at_level(logging.WARNING):
        ds = load(f"ogb:{folder}")
    (msg,) = _warnings(caplog)
    assert f"load it with ogb:{folder},symmetric=true" in msg
    assert ds.num_edges == 6 and ds.summary()["reciprocity"] == 0.0
    sym = load(f"ogb:{folder},symmetric=true")
    assert sym.num_edges == 12 and sym.reciprocity == 1.0


@pytest.mark.parametrize("where", ["inside", "beside"])
@pytest.mark.parametrize("flag", ["True", "False"])
def test_ogb_master_csv_add_inverse_edge_is_honoured(tmp_path, caplog, where, flag):
    folder = _one_direction_ogb(tmp_path / "ogbn_social")
    master = folder / "master.csv" if where == "inside" else tmp_path / "master.csv"
    master.write_text(f",ogbn-other,ogbn-social\nadd_inverse_edge,False,{flag}\n"
                      "download_name,other,social\n")
    with caplog.at_level(logging.WARNING):
        ds = load(f"ogb:{folder}")
    assert not _warnings(caplog)  # the format said
    assert ds.num_edges == (12 if flag == "True" else 6)
    assert ds.info["direction"].startswith(f"{master} add_inverse_edge={flag} (ogbn-social)")
    assert load(f"ogb:{folder},symmetric=false").num_edges == 6  # the option wins


def test_ogb_known_dataset_name_uses_ogbs_value(tmp_path, caplog):
    folder = _one_direction_ogb(tmp_path / "ogbn_products")  # OGB: add_inverse_edge True
    with caplog.at_level(logging.WARNING):
        ds = load_ogb(folder)
    assert not _warnings(caplog)
    assert ds.num_edges == 12 and "add_inverse_edge=True for ogbn-products" in ds.info["direction"]


def test_bad_master_csv_value_is_named(tmp_path):
    folder = _one_direction_ogb(tmp_path / "ogbn_x")
    (folder / "master.csv").write_text(",ogbn-x\nadd_inverse_edge,maybe\n")
    with pytest.raises(ValueError, match="add_inverse_edge of ogbn-x must be True or False"):
        load_ogb(folder)


def _data_one_direction():
    tg = pytest.importorskip("torch_geometric")
    ei = torch.tensor([[0, 1, 2, 0], [1, 2, 3, 3]])
    return tg.data.Data(x=torch.randn(4, 3), y=torch.tensor([0, 1, 0, 1]), edge_index=ei,
                        edge_weight=torch.tensor([1.0, 2.0, 3.0, 4.0]),
                        edge_type=torch.tensor([0, 1, 0, 1]))


def test_from_pyg_symmetric_copies_edge_data(caplog):
    data = _data_one_direction()
    with caplog.at_level(logging.WARNING):
        plain = from_pyg(data)
    assert "from_pyg(data, name='pyg', symmetric=True)" in _warnings(caplog)[0]
    ds = from_pyg(data, symmetric=True)
    assert plain.num_edges == 4 and ds.num_edges == 8 and ds.reciprocity == 1.0
    ei, w = ds.graph.edge_index(), ds.graph.edge_weight_original()
    for (s, d), weight, et in zip(ei.t().tolist(), w.tolist(), ds.edge_type.tolist()):
        k = [(a, b) for a, b in data.edge_index.t().tolist()].index(tuple(sorted((s, d))))
        assert weight == data.edge_weight[k] and et == data.edge_type[k]


def test_from_dgl_symmetric(caplog):
    from ngra.compat import import_dgl

    try:
        dgl = import_dgl()
    except ImportError:
        pytest.skip("DGL not installed")
    g = dgl.graph((torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])), num_nodes=3)
    g.ndata["feat"], g.ndata["label"] = torch.randn(3, 2), torch.tensor([0, 1, 0])
    assert _pairs(from_dgl(g, symmetric=True).graph) == {(0, 1), (1, 2), (2, 0), (1, 0),
                                                          (2, 1), (0, 2)}
    with caplog.at_level(logging.WARNING):
        assert from_dgl(g, symmetric=False).reciprocity == 0.0
    assert not _warnings(caplog)


def test_every_file_loader_documents_symmetric():
    text = describe()
    for usage in ("edgelist:PATH[", "twitter[", "ogb:PATH["):
        block = text.split(usage, 1)[1].split("\n  ", 1)[0]
        assert "symmetric=auto" in block
    assert text.count("symmetric: add each edge's missing reverse") == 2  # edgelist, ogb
    assert "csv = edgelist" in text
