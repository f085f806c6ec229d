"""Where a rank's peak above its partition goes: its high-water mark step by step.

What
    Issue 41's memory target: a rank's peak above its fixed cost within 1.25x of what its
    partition requires (``distributed_bench.py --memory``). This probe runs the steps of
    a rank's training loop by hand (``RankSession``: forward, loss, backward, gradient
    all-reduce, Adam, evaluation) on 2 ranks of one thread each, GCN, ``--exchange halo``,
    and records each rank's ``VmHWM`` after every step, for the graph and for the
    fixed-cost graph (R-MAT 2^6 of the same feature width and classes, as the benchmark),
    under each mapping threshold of large frees (``--free-from``: the rank's
    :func:`ngra.memstat.release_large_frees`, 8 MiB in ``ngra train``). The ratio after
    step ``i`` is (peak - fixed) / required, fixed being the small run's peak after the
    same step less its own requirement.

Run
    python experiments/rank_memory_phases.py      # R-MAT 2^17 range; 8 MiB and 1 MiB
Writes experiments/results/distributed_memory_phases.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from _bench_util import fmt_ratio, machine_info, markdown_table
from rank_fixed_cost import train_step

RESULTS = Path(__file__).resolve().parent / "results"
GRAPHS = {"rmat17": ("rmat:scale=17,edge_factor=8,feat=64", 64, 8),
          "cora": ("cora", 1433, 7)}


def rank_steps(cfg, folder: str, steps: int, free_from: int) -> dict:
    """On a rank: ``steps`` training steps and evaluations; the high-water mark after
    each, and what the partition requires."""
    import torch

    from ngra.distributed.dense import split_linears
    from ngra.memstat import peak_rss_bytes, release_large_frees
    from ngra.training.ranks import RankSession, open_shard

    shard, layout, groups = open_shard(cfg, Path(folder))
    release_large_frees(free_from)
    hyper, m = cfg.resolved(), shard.meta
    model = cfg.source.build(m["num_features"], m["num_classes"], hyper=hyper,
                             num_layers=hyper["num_layers"],
                             num_edge_types=m["num_edge_types"])
    s = RankSession(split_linears(model, layout, groups.tp), shard, None, groups.gradients,
                    layout)
    opt = torch.optim.Adam(s.model.parameters(), lr=hyper["lr"])
    peaks = []
    for _ in range(steps):
        train_step(s, opt)
        peaks.append(peak_rss_bytes())
    return {"peaks": peaks, "required": s.required_bytes()["total"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", default="rmat17", choices=sorted(GRAPHS))
    ap.add_argument("--method", default="range")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--free-from", default="8388608,1048576",
                    help="mapping thresholds of large frees to compare (bytes)")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--out", default=str(RESULTS / "distributed_memory_phases.md"))
    args = ap.parse_args()

    from ngra.distributed import launch
    from ngra.training import TrainConfig
    from ngra.training.ranks import prepare_shards

    spec, feat, classes = GRAPHS[args.graph]
    empty = f"rmat:scale=6,edge_factor=8,feat={feat},classes={classes}"
    rows = []
    for free in [int(v) for v in args.free_from.split(",")]:
        got = {}
        for label, ds in (("fixed", empty), ("graph", spec)):
            cfg = TrainConfig(model="gcn", dataset=ds, data_root=args.data_root, seed=0,
                              progress=False, nprocs=2, exchange="halo",
                              partition_method=args.method, threads=1)
            folder = str(prepare_shards(cfg))
            got[label] = launch(rank_steps, 2, cfg, folder, args.steps, free, threads=1)
        for r in range(2):
            f, g = got["fixed"][r], got["graph"][r]
            row = {"free": f"{free / 2**20:g} MiB", "rank": r,
                   "required": f"{g['required'] / 2**20:.1f} MB"}
            for i in range(args.steps):
                above = g["peaks"][i] - (f["peaks"][i] - f["required"])
                row[f"s{i}"] = (f"{above / 2**20:.1f} MB "
                                f"({fmt_ratio(above / g['required'])})")
            rows.append(row)
            print(row, flush=True)
    info = machine_info()
    lines = ["# A rank's peak above its fixed cost, step by step (issue 41)", "",
             "Regenerate: `" + " ".join(["python experiments/rank_memory_phases.py", *sys.argv[1:]])
             + "`"
             f" (git {info.get('git', '?')}, {info.get('date', '?')}): GCN on "
             f"{args.graph}, 2 ranks x 1 thread, {args.method}, halo exchange; after each "
             "training step and its evaluation, each rank's VmHWM less the fixed cost (the "
             "same steps' peak on R-MAT 2^6 of the same widths, less its requirement), and "
             "that over what the partition requires (`ngra.distributed.memory`). free: the "
             "rank's mapping threshold of large frees (`ngra train`: 8 MiB). The machine "
             f"was shared (load {os.getloadavg()[0]:.1f}).", "",
             markdown_table(rows, [("free", "large frees mapped from"), ("rank", "rank"),
                                   ("required", "required")]
                            + [(f"s{i}", f"after step {i + 1}") for i in range(args.steps)]),
             ""]
    Path(args.out).write_text("\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
