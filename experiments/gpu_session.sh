#!/usr/bin/env bash
# One lent GPU session's device checks, in priority order, each under its own time limit, each part's output kept
# in $OUT (or ./gpu_out): the scripts' tables for docs/perf/gpu_check.rst. About 7.5 minutes on one H200 (the parts' limits add to 9.7 minutes).
#
#   bash experiments/gpu_session.sh            # on the device machine, from the repository's root
#
# Packages the device image lacks (highspy, array-api-compat) are installed from wheels in .whl/ when present
# (python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl highspy array-api-compat).
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
{
    date -u; uptime; nproc
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    python3 -c "import torch, transformers, numpy; print('torch', torch.__version__, 'transformers', transformers.__version__, 'numpy', numpy.__version__)"
} 2>&1 | tee "$OUT/gpu_check.txt"   # at most 8 files come back: the machine heads the first part's file

part() {  # [FILE=F] part NAME SECONDS COMMAND...: one part under its limit, its output in $OUT/NAME.txt (or F.txt)
    local name=$1 limit=$2 file=${FILE:-$1}
    shift 2
    echo "### $name (limit ${limit} s) $(date -u +%H:%M:%S)"
    timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$OUT/$file.txt"
    echo "### $name: exit ${PIPESTATUS[0]} $(date -u +%H:%M:%S); load $(cut -d' ' -f1-3 /proc/loadavg)"
}

# 1. the decoders' predictions against real decoding (each prediction's parts beside the decodes'), the profile's own
#    work, transformers (about 2.5 minutes on an H200)
part gpu_check 240 python3 experiments/gpu_check.py --budget-s 180 --rounds 3
# 2. the tree bound against the target's 64-node tree call, on a random-weight pair of SmolLM2-135M's shape
FILE=gpu_check part tree_bound 130 python3 experiments/gpu_tree_bound.py --budget-s 90  # at most 8 files come back
# 3. where the profile's walk spends its time outside the forward passes (cProfile, torch.profiler)
part walk 90 python3 experiments/gpu_profile_walk.py --out "$OUT" --prompts 4 --positions 8 --lines 30
# 4. the decoders' device routes (chains and trees) on the small random pair, against transformers
part decode_overhead 90 python3 experiments/bench_decode_overhead.py --pairs small --device cuda --L 2,4 --prompts 2 \
    --repeats 3 --tokens 32 --trees "eagle2:4,4,16,topk:branching(2,2),iid:branching(2,2):specinfer,wor:branching(2,2):sequoia"
# 5. the batched alpha_k on CUDA beside numpy and torch on the host
part alpha_k 30 python3 experiments/bench_alpha_k.py --batched-only --quick
date -u
