#!/usr/bin/env bash
# One GPU call for the token buckets: the bucket GPU tests (fla's too with fla; unless TESTS_S=0),
# then the fresh-batch bucket benchmark of $CASES (default all), the SM clock logged beside it;
# everything packed into $OUT/buckets.tgz.
#   OUT=... MAMBA_EDU_COMMIT=... CASES=launch_bound_512x1,sweep bash scripts/gpu_buckets.sh
# KERNELS=triton,fla adds fla's prefill arms (eager and breakable; not fused) beside ours. fla-core
# comes from the carried site: carry .wR, stage it with `STEP=0 bash scripts/gpu_staged.sh` (into
# /tmp/site, einops too), then on the same warm machine:
#   PYTHONPATH=/tmp/site KERNELS=triton,fla CASES=launch_bound_512x1 OUT=... bash scripts/gpu_buckets.sh
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
FINAL=$(realpath -m "${OUT:-out}")
S=/tmp/buckets; rm -rf $S; mkdir -p $S
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $S/gpu.txt; cat $S/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
    -lms 500 > $S/gpu_clocks.csv &
SMI=$!
TAIL=${TAIL:-40}
source "$HERE/gpu_step.sh"
TESTS="tests/engine/test_bucket.py tests/engine/test_engine.py"
case "${KERNELS:-triton}" in *fla*) TESTS="$TESTS tests/serving/test_fla_backend.py" ;; esac
if [ "${TESTS_S:-150}" != 0 ]; then
    step pytest_gpu "${TESTS_S:-150}" python3 -m pytest $TESTS -m gpu -q \
        -p no:cacheprovider -o addopts="" -rfE -x
fi
step buckets "${BENCH_S:-380}" python3 -m mamba_edu bench-buckets --out $S/bench --rounds 3 --repeats 5 \
    --cases "${CASES:-all}" --prefill-kernels "${KERNELS:-triton}"
kill $SMI
tar czf "$FINAL/buckets.tgz" -C $S . && ls -la "$FINAL"
