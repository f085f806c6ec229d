#!/usr/bin/env bash
# The prepared GPU check (issue 38): the GPU tests, then the GPU benchmark against PyG
# (experiments/gpu_bench.py -> results/gpu.md) and streaming out of device memory
# (experiments/gpu_streaming.py -> results/gpu_streaming.md). Sized for one GPU in at most
# 8 minutes, so that a lent machine's 15 minutes of device time allow one rerun.
#
#   bash experiments/gpu_check.sh            # from the repository root, on a GPU machine
#   PARTS="pytest bench" bash experiments/gpu_check.sh    # some parts only (about 150 + 200
#                                                         # + 90 s for the default three)
#
# Parts: pytest, streaming, bench (the default: all three), profile (gpu_profile.py: where a
# streamed epoch's time and resident GCN's memory go), distributed (issue 41's overlapped vs
# blocking halo on R-MAT 2^17 on the host's 16 cores: no GPU, the cores; needs pymetis in .whl).
#
# ngra runs from a copy of the package layout (ngra.kernels = kernels/, ...) on PYTHONPATH,
# so nothing is installed; wheels carried in .whl/ (`make gpu-wheels`: the PyG version the
# tests pin, where the machine has another or none) are unpacked beside it. Logs and the two reports also go to $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
S=${S:-/tmp/ngra-site}
rm -rf "$S"; mkdir -p "$S"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$S" .whl/*.whl
fi
cp -r ngra "$S/ngra"; cp -r kernels "$S/ngra/kernels"
cp -r partition "$S/ngra/partition"; cp -r datasets "$S/ngra/datasets"
export PYTHONPATH="$S${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export NGRA_CACHE=${NGRA_CACHE:-/tmp/ngra-cache} NGRA_CALIBRATION=${NGRA_CALIBRATION:-/tmp/ngra-calibration}
T0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"

PARTS=${PARTS:-pytest streaming bench}
has() { [[ " $PARTS " == *" $1 "* ]]; }

if has pytest; then
    stamp "pytest -m gpu"
    # -P: the working directory's ngra/ (the source folder, without kernels/ inside it) must
    # not shadow the package layout on PYTHONPATH
    # per-test times in the log, and a per-test limit (pytest-timeout is on the GPU image) so
    # one slow test cannot take the others' time
    timeout 150 python3 -P -m pytest -q -m gpu -p no:cacheprovider --durations=0 --timeout 60 \
        tests/runtime tests/kernels 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25
fi
if has streaming; then
    stamp "gpu_streaming.py"
    timeout 200 python3 experiments/gpu_streaming.py 2>&1 | tee "$OUT/gpu_streaming.log"
    cp experiments/results/gpu_streaming.md "$OUT/" 2>/dev/null
fi
if has bench; then
    stamp "gpu_bench.py"
    timeout 200 python3 experiments/gpu_bench.py 2>&1 | tee "$OUT/gpu_bench.log"
    cp experiments/results/gpu.md "$OUT/" 2>/dev/null
fi
if has profile; then
    stamp "gpu_profile.py"
    timeout 150 python3 -P experiments/gpu_profile.py 2>&1 | tail -5
    cp experiments/results/gpu_profile.md "$OUT/" 2>/dev/null
fi
if has distributed; then
    stamp "distributed_bench.py --overlap (16 host cores)"
    # from /tmp: its `python -m ngra` ranks must not import the source folder ngra/ of the cwd
    (REPO=$(pwd); cd /tmp && timeout "${DIST_TIMEOUT:-200}" python3 \
        "$REPO/experiments/distributed_bench.py" --overlap --graphs rmat17 \
        --models "${DIST_MODELS:-gcn128,gat}" --steps 6 --epochs 3 2>&1 | tail -8)
    cp experiments/results/distributed_overlap.csv experiments/results/distributed.md "$OUT/" \
        2>/dev/null
fi

stamp "done"
