"""Partition-book invariants on the labeled graph cases: every edge owned exactly once,
halos exact, global <-> local ids inverse; files; refusing another graph's or a stale book."""

from __future__ import annotations

import pytest
import torch

import ngra
from ngra.partition import permute_graph
from ngra.partition.book import BookError, build_book, check_book, load_book, save_book

from partition_cases import CASES

METHODS = ("metis", "range")


def _reference_halo(graph, book, r):
    """The halo by brute force: sources of rank r's in-edges owned by another rank."""
    owner = book.owner()
    src, dst = graph.edge_index()
    mine = owner[dst] == r
    remote = src[mine & (owner[src] != r)]
    return torch.unique(book.reordering.rank[remote])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("k", [1, 2, 3, 5, "N+3"])  # "N+3": more ranks than vertices
def test_invariants(graph_case, method, k):
    g = graph_case
    if k == "N+3":
        if g.num_nodes > 50:
            pytest.skip("K > N is covered by the small cases")
        k = g.num_nodes + 3
    book = build_book(g, k, method)
    n = g.num_nodes
    # the destination ranges tile [0, N) and the in-edges tile [0, E)
    assert book.bounds[0] == 0 and book.bounds[-1] == n
    assert bool((book.bounds[1:] >= book.bounds[:-1]).all())
    assert book.edge_bounds[0] == 0 and book.edge_bounds[-1] == g.num_edges
    # every edge is owned exactly once: by the owner of its destination
    owner = book.owner()
    src, dst = g.edge_index()
    counts = torch.bincount(owner[dst], minlength=k) if g.num_edges else torch.zeros(k)
    assert counts.tolist() == (book.edge_bounds[1:] - book.edge_bounds[:-1]).tolist()
    assert torch.bincount(owner, minlength=k).tolist() == \
        (book.bounds[1:] - book.bounds[:-1]).tolist()
    cut = int((owner[src] != owner[dst]).sum()) if g.num_edges else 0
    assert book.edge_cut == cut
    rg = permute_graph(g, book.reordering)
    for r in range(k):
        halo = book.halo_of(r)
        assert torch.equal(halo, _reference_halo(g, book, r))
        # global <-> local ids are inverse on the local rows, -1 elsewhere
        local = book.local_ids(r)
        assert torch.equal(book.to_local(r, local), torch.arange(local.numel()))
        others = torch.tensor(sorted(set(range(n)) - set(local.tolist())), dtype=torch.int64)
        assert bool((book.to_local(r, others) == -1).all())
        # the in-edges of r read only local rows
        e0, e1 = (int(book.edge_bounds[i]) for i in (r, r + 1))
        assert bool((book.to_local(r, rg.indices[e0:e1]) >= 0).all())
        # what r receives from p is exactly what p sends to r
        recv = book.recv_counts(r)
        assert recv[r] == 0 and sum(recv) == halo.numel()
        for p in range(k):
            sent = book.send_rows(p, r)
            assert sent.numel() == recv[p]
            lo, _ = book.owned(p)
            assert torch.equal(sent + lo, halo[sum(recv[:p]): sum(recv[:p + 1])])
    f = book.figures()
    assert f["halo_rows"] == [book.halo_of(r).numel() for r in range(k)]
    assert f["vertices"] == (book.bounds[1:] - book.bounds[:-1]).tolist()


def test_a_hub_lands_whole_in_one_rank():
    g = CASES["hub"]
    book = build_book(g, 4, "range")
    assert int(book.owner()[0]) in range(4)
    hub_rank = int(book.owner()[0])
    assert int(book.edge_bounds[hub_rank + 1] - book.edge_bounds[hub_rank]) >= 40


def test_metis_cuts_fewer_edges_than_ranges_on_a_clustered_graph():
    blocks = [torch.randint(0, 50, (2, 400)) + 50 * b for b in range(4)]
    bridges = torch.randint(0, 200, (2, 20))
    g = ngra.Graph.from_edge_index(torch.cat(blocks + [bridges], 1)[:, torch.randperm(1620)],
                                   num_nodes=200)
    perm = torch.randperm(200)  # scatter the clusters over the id range
    g = ngra.Graph.from_edge_index(perm[g.edge_index()], num_nodes=200)
    assert build_book(g, 4, "metis").edge_cut < build_book(g, 4, "range").edge_cut


def test_save_load_roundtrip(tmp_path):
    g = CASES["power_law"]
    book = build_book(g, 3, "metis", spec="x")
    save_book(book, tmp_path / "b")
    back = load_book(tmp_path / "b")
    for name in ("bounds", "edge_bounds", "halo_ptr", "halo"):
        assert torch.equal(getattr(back, name), getattr(book, name))
    assert torch.equal(back.reordering.order, book.reordering.order)
    assert back.figures() == book.figures()
    check_book(back, g, "x")


def test_another_graph_or_a_stale_book_is_refused(tmp_path):
    g = CASES["power_law"]
    book = build_book(g, 2, "range", spec="rmat:scale=9")
    with pytest.raises(BookError, match="built for rmat:scale=9 .* not for cora"):
        check_book(book, g, "cora")
    with pytest.raises(BookError, match="not for this graph .*ngra partition"):
        check_book(book, CASES["hub"])
    src, dst = g.edge_index()
    changed = ngra.Graph.from_edge_index(torch.stack([dst, src]), num_nodes=g.num_nodes)
    with pytest.raises(BookError, match="stale"):
        check_book(book, changed, "rmat:scale=9")


def test_damaged_books_are_refused(tmp_path):
    book = build_book(CASES["isolated"], 2, "range")
    save_book(book, tmp_path)
    (tmp_path / "book.pt").write_bytes((tmp_path / "book.pt").read_bytes()[:100])
    with pytest.raises(BookError, match="damaged"):
        load_book(tmp_path)
    with pytest.raises(FileNotFoundError, match="ngra partition"):
        load_book(tmp_path / "nothing")


def test_bad_arguments():
    g = CASES["isolated"]
    with pytest.raises(ValueError, match="method must be one of"):
        build_book(g, 2, "random")
    with pytest.raises(ValueError, match=">= 1"):
        build_book(g, 0)
