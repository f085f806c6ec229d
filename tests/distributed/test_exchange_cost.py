"""The exchange cost model (``ngra.distributed.cost``) on hand-made partitions."""

from __future__ import annotations

import pytest

from ngra.distributed.cost import PartitionStats, choose_exchange, predict
from ngra.distributed.link import AlphaBeta, LinkModel


def _link(beta: float, stream: float = 4e9, shared: float = 1.0) -> LinkModel:
    """A link whose ranks compute as fast per rank whatever ``shared`` says (the rates
    are scaled by it): ``shared`` then only says how busy the cores are."""
    ops = {op: AlphaBeta(1e-4, beta) for op in
           ("p2p", "all_to_all", "all_reduce", "all_gather", "broadcast")}
    return LinkModel("gloo", "cpu", 4, "test", ops, gemm_flops=1e11, gather_bytes=2e9 * shared,
                     stream_bytes=stream * shared, shared=shared)


def _stats(rows: int, halo: int, local_edges: int, remote_edges: int) -> PartitionStats:
    """Four equal ranks; each receives ``halo`` rows from (and sends as many to) the
    others and has ``remote_edges`` in-edges from each other rank."""
    edges = tuple(tuple(local_edges if r == j else remote_edges for j in range(4))
                  for r in range(4))
    return PartitionStats((rows,) * 4, (halo,) * 4, (halo,) * 4, edges)


def test_a_small_halo_is_exchanged_and_a_whole_graph_halo_on_a_slow_link_streams():
    small = _stats(100_000, 2_000, 1_000_000, 10_000)
    assert choose_exchange(small, 64, _link(1e-9)).strategy == "halo"
    # every rank reads every row of every other rank, the link is slow and the edges are
    # many: the ring hides its transfers behind compute, the halo waits for its all_to_all
    dense = _stats(100_000, 300_000, 3_000_000, 3_000_000)
    assert choose_exchange(dense, 64, _link(1e-8)).strategy == "ring"


def test_the_ring_pays_for_its_partial_sums():
    """Few edges a row: the ring's K partials of the owned rows and their merges cost
    more than padding the halo once (what the vertex-side term adds to the model)."""
    sparse = _stats(1_000_000, 900_000, 1_000_000, 1_000_000)
    halo, ring = predict(sparse, 64, _link(1e-10))
    assert ring > halo
    halo_fast, ring_fast = predict(sparse, 64, _link(1e-10, stream=1e15))  # free row work
    assert halo - halo_fast < ring - ring_fast


def test_an_attention_layers_halo_walks_its_edges_once_more():
    """GAT's halo tile runs attention_aggregate (one more walk over the edges in backward
    than the ring's softmax_aggregate tiles): with many local edges that tips the choice."""
    st = _stats(100_000, 100_000, 3_000_000, 300_000)
    link = _link(1e-10)
    plain, attending = predict(st, 64, link), predict(st, 64, link, attention=True)
    assert attending[1] == plain[1]  # the ring's tiles are the same
    walk = 3_000_000 + 3 * 300_000  # a rank's in-edges, one more time
    assert attending[0] - plain[0] == pytest.approx(walk * 64 / link.gather_bytes)
    assert choose_exchange(st, 64, link).strategy == "halo"
    choice = choose_exchange(st, 64, link, attention=True)
    assert choice.strategy == "ring" and choice.as_dict()["attention"] is True


def test_busy_cores_hide_no_ring_transfer():
    """Ranks that outnumber the cores (``shared`` 2) cannot move a chunk while computing:
    the ring's steps cost compute plus half the transfer, the halo's prediction is the same."""
    st = _stats(200_000, 100_000, 1_000_000, 1_000_000)
    free, busy = predict(st, 64, _link(3e-9)), predict(st, 64, _link(3e-9, shared=2.0))
    assert busy[0] == pytest.approx(free[0])
    assert busy[1] > free[1] * 1.3  # transfer and compute about equal: +0.5 of the smaller


def test_forced_strategy_and_bad_input():
    st = _stats(10, 2, 10, 1)
    assert choose_exchange(st, 8, _link(1e-9), "ring").strategy == "ring"
    assert choose_exchange(st, 8, None).strategy == "halo"  # no link: halo, no prediction
    with pytest.raises(ValueError, match="exchange must be one of"):
        choose_exchange(st, 8, _link(1e-9), "both")


def test_an_overlapped_halo_hides_its_exchange_behind_the_inner_edges():
    st = _stats(100_000, 100_000, 3_000_000, 300_000)
    link = _link(1e-9)
    blocking, ring = predict(st, 64, link)
    hidden, ring_too = predict(st, 64, link, overlap=True)
    assert hidden < blocking and ring_too == ring
    comm = link.all_to_all(100_000 * 64)
    assert blocking - hidden == pytest.approx(2 * comm)  # both directions hidden whole
    # no inner edges: nothing to hide behind, the exchange costs what it blocks
    none = _stats(100_000, 100_000, 0, 300_000)
    assert predict(none, 64, link, overlap=True)[0] == pytest.approx(predict(none, 64, link)[0])
    # an attention layer's overlapped tiles run softmax_aggregate: no extra walk
    assert predict(st, 64, link, attention=True, overlap=True)[0] == pytest.approx(hidden)
    choice = choose_exchange(st, 64, link, overlap=True)
    assert choice.as_dict()["overlap"] is True and choice.halo_s == pytest.approx(hidden)
