"""Memory proportional to the partition (issue 41 item 4): a rank's ``required_bytes``
(:func:`ngra.distributed.memory.partition_bytes`) equals a direct count of its shard's
arrays, its overlap split and its layers' kept activations, and its peak (``VmHWM`` of
the rank process) above the fixed cost stays within a measured bound of it."""

from __future__ import annotations

import pytest
import torch

import dist_ranks
from ngra.distributed import launch
from ngra.distributed.cost import PartitionStats
from ngra.distributed.link import calibrate
from ngra.distributed.memory import LayerWidths, partition_bytes
from ngra.distributed.overlap import build_split
from ngra.training import TrainConfig
from ngra.training.ranks import prepare_shards

#: Cora's features and classes; the fixed-cost run's graph has them too
CORA_F, CORA_C, HIDDEN = 1433, 7, 16


@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NGRA_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield str(shared_data)


def _nbytes(*ts) -> int:
    return sum(t.nbytes for t in ts if t is not None)


def test_partition_bytes_refuses_a_rank_outside():
    stats = PartitionStats((3, 2), (1, 1), (1, 1), ((4, 1), (1, 3)))
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\); got 2"):
        partition_bytes(stats, 2, features=4, classes=2, layers=[])


@pytest.mark.slow  # three launches of 2 ranks: ~30 s quiet, 2 min loaded
@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_rank_memory_is_its_partition_above_the_fixed_cost(data):
    cfg = TrainConfig(model="gcn", dataset="cora", data_root=data, seed=0, progress=False,
                      nprocs=2, epochs=4, exchange="halo")
    # the fixed cost: the same run, in rank processes of its own, on 64 vertices of
    # Cora's widths (in the same processes the Cora run would reuse what it freed)
    empty = TrainConfig(model="gcn", dataset=f"rmat:scale=6,edge_factor=8,feat={CORA_F},"
                        f"classes={CORA_C}", data_root=data, seed=0, progress=False,
                        nprocs=2, epochs=4, exchange="halo")
    folder = prepare_shards(cfg)
    calibrate(2, refresh=False)  # measured here once: a run measuring it peaks higher
    fixed_run, run = (launch(dist_ranks.train_configs, 2, [(c, str(f))], threads=1)[0][0]
                      for c, f in ((empty, prepare_shards(empty)), (cfg, folder)))

    stats = PartitionStats.from_dict(run["partition_stats"])
    for r, mem in enumerate(run["memory_per_rank"]):
        s = torch.load(folder / f"rank{r}.pt", weights_only=True)
        d, h = int(s["num_own"]), int(s["halo"].numel())
        e = int(s["indices"].numel())
        part = mem["required"]
        assert mem["required_bytes"] == part["total"] == sum(
            v for k, v in part.items() if k != "total")
        # what the shard holds, array by array
        assert part["data"] == _nbytes(s["x"], s["y"], s["row_ids"], s["train_mask"],
                                       s["val_mask"], s["test_mask"])
        assert part["structure"] == _nbytes(s["indptr"], s["indices"], s["edge_ids"],
                                            s["src_factor"], s["dst_factor"], s["halo"],
                                            s["send_idx"])
        split = build_split(d, h, s["indptr"][: d + 1], s["indices"])
        assert part["split"] == sum(_nbytes(v.indptr, v.src_idx, v.edge_ids, *v.rev)
                                    for v in (split.inner, split.boundary))
        # GCN: each layer keeps its input, its propagated rows (owned and halo: the lin
        # moves before propagation) and its output
        layers = [(CORA_F, HIDDEN), (HIDDEN, CORA_C)]
        assert part["activations"] == sum(4 * (d * a + (d + h) * b + d * b)
                                           for a, b in layers)
        assert (d, h, e) == (stats.rows[r], stats.received[r], sum(stats.edges[r]))
        assert part == partition_bytes(stats, r, features=CORA_F, classes=CORA_C,
                                       layers=[LayerWidths(a, 4 * b, b) for a, b in layers],
                                       params=CORA_F * HIDDEN + HIDDEN + HIDDEN * CORA_C
                                       + CORA_C)
        # the peak above the fixed cost (the empty run's peak less its tiny partition):
        # 1.2-1.35x measured (distributed_bench.py --memory; a few MB of the fixed cost
        # move between runs); a second copy of the features kept would add 0.5x
        f = fixed_run["memory_per_rank"][r]
        above = mem["peak_rss"] - (f["peak_rss"] - f["required_bytes"])
        assert 0.8 * mem["required_bytes"] <= above <= 1.6 * mem["required_bytes"], (
            above / 2**20, mem["required_bytes"] / 2**20)
        assert 0 < mem["fixed_bytes"] < mem["peak_rss"]
