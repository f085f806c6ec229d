#!/usr/bin/env bash
# Workload characterization (in the spirit of "Architectural Implications of Graph Neural
# Networks", IEEE CAL 2020): time per SAGA stage, analytic FLOPs/bytes, peak memory, for
# GCN, GAT, GraphSAGE, GIN, GG-NN and R-GCN in ngra (compiled), ngra's generic executor
# (the fusion experiment), PyG and DGL, inference and training.
#
# Writes experiments/results/characterization/{runs.csv,report.md,stages.png,roofline.png,
# ceilings.json,config.json}.
#
# Two invocations appended into one folder, because the graphs differ by 300x in size:
#   1. small graphs (Cora, CiteSeer, PubMed structure): the whole grid, 2 repeats a round
#      after 2 warm-ups (ngra keeps a mostly-zero input's CSR from its second use on:
#      with one warm-up that one-time build fell inside the median of 2);
#   2. large graphs (ego-Twitter with synthetic features, R-MAT 2^18): 1 instrumented repeat
#      a round after 1 warm-up, no separate uninstrumented timing; inference and training
#      with ngra,
#      PyG and DGL. FULL=1 adds ngra's generic executor there too (the fusion experiment on
#      large graphs: hours on 2 cores, and most of its training runs exceed the memory cap).
# Both run 3 rounds, the frameworks taking turns (every framework's group, then again), and
# report each run's median round: on this shared machine, whose speed drifts by up to 2x
# over minutes, cells 5-15% apart changed winner between two grids that ran one framework's
# group after another.
# Every run is capped (--timeout, --memory-cap-gb): a run over a cap is recorded as skipped
# with its reason in runs.csv and report.md instead of hanging the grid.
#
# Usage: experiments/characterize_all.sh            (env: PY, OUT, NGRA_DATA, THREADS, FULL)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
OUT=${OUT:-experiments/results/characterization}
DATA=${NGRA_DATA:-$(cd .. && pwd)/shared/data}
THREADS=${THREADS:-2}
FULL=${FULL:-0}
MODELS=gcn,gat,sage,gin,ggnn,rgcn
SMALL="cora;citeseer;pubmed:structure"
LARGE="twitter;rmat:scale=18,edge_factor=16,feat=64,classes=8"

LARGE_MODES=inference,training
if [ "$FULL" = 1 ]; then
  LARGE_FRAMEWORKS=ngra,ngra-generic,pyg,dgl
else
  LARGE_FRAMEWORKS=ngra,pyg,dgl
fi

rm -rf "$OUT"
mkdir -p "$OUT"
start=$(date +%s)

"$PY" -m ngra.cli characterize --models "$MODELS" --datasets "$SMALL" \
  --frameworks ngra,ngra-generic,pyg,dgl --mode inference,training \
  --rounds 3 --repeats 2 --warmup 2 --timeout 60 --memory-cap-gb 6 --threads "$THREADS" \
  --data-root "$DATA" --out "$OUT"

"$PY" -m ngra.cli characterize --models "$MODELS" --datasets "$LARGE" \
  --frameworks "$LARGE_FRAMEWORKS" --mode "$LARGE_MODES" \
  --rounds 3 --repeats 1 --warmup 1 --no-plain --timeout 120 --memory-cap-gb 6 --threads "$THREADS" \
  --data-root "$DATA" --out "$OUT" --append --reuse-ceilings

# worker logs hold profiler chatter; failures and skips are already in runs.csv
rm -rf "$OUT/logs"
echo "characterization done in $(( $(date +%s) - start )) s: $OUT"
