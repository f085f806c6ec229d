#!/bin/bash
# NCCL as far as one GPU allows: torchrun with one rank (the distributed trainer's whole
# path: shards, DistGraph, exchange groups, gradient all-reduce on NCCL) against one
# process on the same GPU; the summaries land in $OUT (default: a temporary folder).
# Run from the repository root on a machine with a GPU; ngra importable (installed, or a
# PYTHONPATH layout as the device machine's: S names the folder to build it in).
# Results: experiments/results/distributed_nccl.md.
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1
S=${S:-/tmp/site}; rm -rf $S; mkdir -p $S
cp -r ngra $S/ngra; cp -r kernels $S/ngra/kernels; cp -r partition $S/ngra/partition; cp -r datasets $S/ngra/datasets
export PYTHONPATH=$S NGRA_CACHE=/tmp/ngcache
cd /tmp
D=${D:-"rmat:scale=20,edge_factor=16,feat=64,classes=8,seed=0"}; DEV=${DEV:-cuda}
T0=$(date +%s)
timeout 100 python3 -m ngra train --device $DEV --model gcn --dataset $D --epochs 4 --no-progress --out $OUT/one_gcn.json 2>&1 | tail -1
echo "one gcn $(( $(date +%s) - T0 )) s"
for job in "gcn halo" "gcn ring" "gat halo"; do set -- $job
timeout 90 python3 -m torch.distributed.run --nproc_per_node 1 -m ngra train --device $DEV --model $1 --dataset $D --epochs 4 --exchange $2 --no-progress --out $OUT/nccl_$1_$2.json 2>&1 | grep -E "rank 0 of|test_acc" | tail -3
echo "nccl $1 $2 $(( $(date +%s) - T0 )) s"
done
