"""The overlapped halo exchange equals the blocking one and one process: the inner /
boundary split of a rank's edges, one training step of GCN, GAT, G-GCN, a user layer and
one with a gather per field (also over the ring) on 2 gloo ranks over METIS and range
partitions, and ``--no-halo-overlap`` in a run."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import dist_ranks
from ngra.distributed import launch
from ngra.distributed.overlap import build_split
from ngra.kernels import dropout_rows
from ngra.models import build_model, prepare
from ngra.training import TrainConfig
from ngra.training.data import as_dataset, prepare_dataset
from ngra.training.ranks import prepare_shards
from ngra.training.run import train

MODELS = ("gcn", "gat", "ggcn", "user", "fields")
METHODS = ("metis", "range")


@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NGRA_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield str(shared_data)


def _cfg(data, model, **kw):
    # the user layers read no edge data: shards of a model prepared the same way (sage's)
    return TrainConfig(model="sage" if model in dist_ranks.USER_NETS else model,
                       dataset="cora", data_root=data, seed=0, progress=False, **kw)


def test_split_holds_each_local_edge_once():
    """Inner sources are owned rows, boundary sources halo rows, CSC order kept."""
    g = torch.Generator().manual_seed(0)
    d, h, e = 9, 5, 70
    dst = torch.randint(0, d, (e,), generator=g).sort().values
    src = torch.randint(0, d + h, (e,), generator=g)
    dst[-4:] = d - 1
    src[-4:] = torch.tensor([0, d, d + h - 1, d - 1])  # both kinds into one destination
    indptr = torch.zeros(d + 1, dtype=torch.int64)
    indptr[1:] = torch.bincount(dst, minlength=d).cumsum(0)
    split = build_split(d, h, indptr.to(torch.int32), src.to(torch.int32))
    seen = torch.zeros(e, dtype=torch.int64)
    for view, base, rows in ((split.inner, 0, d), (split.boundary, d, h)):
        pos = view.edge_ids.long()
        seen[pos] += 1
        tile_dst = torch.repeat_interleave(torch.arange(d), torch.diff(view.indptr.long()))
        assert torch.equal(tile_dst, dst[pos])
        assert torch.equal(view.src_idx.long() + base, src[pos])
        assert int(view.src_idx.max()) < rows
        rev_ip, rev_ix, rev_perm = (t.long() for t in view.rev)
        assert torch.equal(torch.diff(rev_ip),
                           torch.bincount(view.src_idx.long(), minlength=rows))
        assert torch.equal(rev_ix, tile_dst[rev_perm])
    assert torch.equal(seen, torch.ones_like(seen))
    # a rank without halo rows: an empty boundary tile
    split = build_split(d, 0, indptr, src.clamp(max=d - 1))
    assert split.boundary.num_edges == 0 and split.inner.num_edges == e


def _one_process(data, model, seed):
    """One training-mode step of ``model`` on the whole prepared graph, as the ranks
    take it (:func:`dist_ranks.overlap_steps`)."""
    cfg = _cfg(data, model)
    ds = prepare_dataset(as_dataset("cora", root=data), reorder="none", seed=0,
                         normalize=cfg.resolved()["normalize_features"])
    graph, edata = prepare(cfg.model_name, ds.graph, ds.edge_type, ds.num_edge_types)
    torch.manual_seed(seed)
    if model in dist_ranks.USER_NETS:
        net = dist_ranks.USER_NETS[model](ds.x.shape[1], 16, ds.num_classes)
    else:
        net = build_model(model, ds.x.shape[1], ds.num_classes,
                          num_edge_types=ds.num_edge_types)
    net.train()
    torch.manual_seed(seed + 1)
    with dropout_rows(torch.arange(ds.graph.num_nodes)):
        out = net(graph, ds.x, edata)
    m = ds.train_mask
    loss = F.cross_entropy(out[m], ds.y[m], reduction="sum")
    loss.backward()
    return out.detach(), float(loss.detach()), {n: p.grad for n, p in net.named_parameters()}


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_overlapped_equals_blocking_and_one_process(data):
    jobs = [(model, str(prepare_shards(_cfg(data, model, nprocs=2, partition_method=method))))
            for model in MODELS for method in METHODS]
    got, compressed = launch(dist_ranks.overlap_and_compressed, 2, jobs, 5, jobs[0][1],
                             threads=1)[0]
    for (model, folder), both in zip(jobs, got):
        where = f"{model} ({folder.split('/shards')[0].rsplit('-', 3)[1]})"
        ref_out, ref_loss, ref_grads = _one_process(data, model, 5)
        for overlap, res in both.items():  # the fields layer: "ring" too
            mode = "ring" if overlap == "ring" else "overlapped" if overlap else "blocking"
            at = f"{where}, {mode}"
            torch.testing.assert_close(res["out"], ref_out[res["ids"]], rtol=1e-4, atol=1e-5,
                                       msg=at)
            assert res["loss"] == pytest.approx(ref_loss, rel=1e-5), at
            for n, g in ref_grads.items():
                torch.testing.assert_close(res["grads"][n], g, rtol=1e-4, atol=1e-5,
                                           msg=f"{at}: {n}")
            stats = res["stats"]
            how = "ring" if overlap == "ring" else "halo" if overlap else "halo (blocking)"
            assert [s["how"] for s in stats] == [how] * 2, at
            assert all(s["calls"] == 1 and s["forward_bytes"] > 0 and s["backward_bytes"] > 0
                       and s["wait_s"] >= 0 for s in stats), at
        off, on = both[False], both[True]
        torch.testing.assert_close(on["out"], off["out"], rtol=1e-5, atol=1e-6, msg=where)
        # the same rows travel; a term without a gradient sends none back when overlapped
        for a, b in zip(off["stats"], on["stats"]):
            assert a["forward_bytes"] == b["forward_bytes"], where
            assert b["backward_bytes"] <= a["backward_bytes"], where
    # --halo-bits 8 and --halo-staleness 1 (GCN, METIS, 3 Adam steps): close, not exact
    exact, bits8, stale = (compressed[v]["losses"] for v in ("exact", "bits8", "stale"))
    assert bits8 != exact and stale != exact
    torch.testing.assert_close(bits8, exact, rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(stale, exact, rtol=2e-2, atol=1e-3)
    assert stale[0] == pytest.approx(exact[0], rel=1e-6)  # the first step waits for its own
    assert [s["how"] for s in compressed["stale"]["stats"]] == ["halo, stale 1"] * 2
    for a, b in zip(compressed["exact"]["stats"], compressed["bits8"]["stats"]):
        assert b["forward_bytes"] < 0.5 * a["forward_bytes"]


@pytest.mark.slow  # ~45 s (8 runs on 2 ranks); the flags' steps run in the test above
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_halo_flags_in_a_run(data, tmp_path):
    """``--halo-overlap`` / ``--no-halo-overlap`` train as one process; ``--halo-bits 8``
    trains close to it (a bounded difference on a fixed seed) and sends about a quarter of
    the halo bytes; ``--halo-staleness 1`` trains close to it too, from a checkpoint as
    well."""
    base = _cfg(data, "gat", nprocs=2, epochs=3, exchange="halo")
    folder = str(prepare_shards(base))
    jobs = [(dataclasses.replace(base, halo_overlap=on, halo_bits=bits), folder)
            for bits in (None, 8) for on in (True, False)]
    stale = _cfg(data, "gcn", nprocs=2, epochs=6, exchange="halo", halo_staleness=1)
    gcn_folder = str(prepare_shards(stale))
    ck = str(tmp_path / "ck")
    jobs += [(stale, gcn_folder),
             (dataclasses.replace(stale, epochs=3, checkpoint=ck, checkpoint_every=3),
              gcn_folder),
             (dataclasses.replace(stale, checkpoint=ck, checkpoint_every=3, resume=True),
              gcn_folder),
             (dataclasses.replace(base, exchange="ring"), folder)]
    on, off, on8, off8, st, _, resumed, ring = launch(dist_ranks.train_configs, 2, jobs,
                                                      threads=1)[0]
    one = train(_cfg(data, "gat", epochs=3))
    exact = train(_cfg(data, "gcn", epochs=6))

    def losses(s):
        return [h["loss"] for h in s["history"]]

    for s in (on, off, ring):
        torch.testing.assert_close(losses(s), losses(one), rtol=1e-4, atol=1e-5)
    for s in (on8, off8):  # 8-bit rows: close, not equal
        torch.testing.assert_close(losses(s), losses(one), rtol=2e-2, atol=1e-3)
        assert losses(s) != losses(one)
    torch.testing.assert_close(losses(on8), losses(off8), rtol=1e-4, atol=1e-5)
    for s, how in ((on, "halo"), (off, "halo (blocking)"), (on8, "halo, 8-bit"),
                   (off8, "halo (blocking), 8-bit"), (ring, "ring")):
        layers = s["exchange_per_layer"]
        assert [lay["how"] for lay in layers] == [how, how]
        assert all(lay["calls"] == 3 and len(lay["wait_s_per_rank"]) == 2
                   and all(b > 0 for b in lay["forward_bytes_per_rank"]) for lay in layers)
    # stale halos: the first step (and the first after a resume) exact, then close
    assert [lay["how"] for lay in st["exchange_per_layer"]] == ["halo, stale 1"] * 2
    assert losses(st)[0] == pytest.approx(losses(exact)[0], rel=1e-5)
    assert losses(st) != losses(exact)
    torch.testing.assert_close(losses(st), losses(exact), rtol=2e-2, atol=1e-3)
    assert len(resumed["history"]) == 6
    torch.testing.assert_close(losses(resumed)[:3], losses(st)[:3], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses(resumed), losses(st), rtol=2e-2, atol=1e-3)
    for exact8, small in ((on, on8), (off, off8)):
        for a, b in zip(exact8["exchange_per_layer"], small["exchange_per_layer"]):
            for r in range(2):  # W floats a row: 4 W bytes exact, W + 4 quantized
                assert b["forward_bytes_per_rank"][r] < 0.5 * a["forward_bytes_per_rank"][r]
                assert b["backward_bytes_per_rank"][r] < 0.5 * a["backward_bytes_per_rank"][r]


def test_bad_halo_flags_are_refused_before_training(capsys):
    from ngra.cli import main
    from ngra.training.config import check_config

    with pytest.raises(ValueError, match="halo_overlap must be True or False"):
        check_config(TrainConfig(model="gcn", dataset="cora", halo_overlap="yes"))
    with pytest.raises(ValueError, match=r"--halo-bits must be 8 .*; got 3"):
        check_config(TrainConfig(model="gcn", dataset="cora", nprocs=2, halo_bits=3))
    with pytest.raises(ValueError, match="--exchange ring streams exact chunks"):
        check_config(TrainConfig(model="gcn", dataset="cora", nprocs=2, halo_bits=8,
                                 exchange="ring"))
    with pytest.raises(ValueError, match="--halo-staleness must be 0 .* or 1 .*; got 2"):
        check_config(TrainConfig(model="gcn", dataset="cora", nprocs=2, halo_staleness=2))
    with pytest.raises(ValueError, match="cannot go with --no-halo-overlap"):
        check_config(TrainConfig(model="gcn", dataset="cora", nprocs=2, halo_staleness=1,
                                 halo_overlap=False))
    assert main(["train", "--dataset", "cora", "--nprocs", "2", "--halo-bits", "3",
                 "--no-progress"]) == 2
    assert "--halo-bits must be 8" in capsys.readouterr().err


def test_quantized_rows_round_trip():
    from ngra.distributed.halo import dequantize_rows, quantize_rows

    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 33, generator=g) * torch.logspace(-6, 3, 50).unsqueeze(1)
    x[3] = 0.0  # a zero row: scale 0, values 0
    x[4, 5] = -7.5  # a row's extreme is negative
    q = quantize_rows(x)
    assert q.dtype == torch.uint8 and q.shape == (50, 33 + 4)
    back = dequantize_rows(q, torch.float32)
    scale = x.abs().amax(1, keepdim=True) / 127
    assert torch.all((back - x).abs() <= scale / 2 * (1 + 1e-5) + 1e-30)
    assert torch.equal(back[3], torch.zeros(33)) and back[4, 5] == x[4, 5]
    assert dequantize_rows(quantize_rows(x[:0]), torch.float64).shape == (0, 33)
