#!/usr/bin/env bash
# One GPU call that measures what the open issues need, each step time-boxed, everything packed
# into $OUT/session.tgz (one file: the device tool returns at most 8).
#   OUT=... bash scripts/gpu_session.sh      (carry .wE and .wS: docs/references.md)
# Steps: the GPU tests; the reference benchmark with the lab's chunk-loop arm; the TTFT bench's
# headline cases (eager and each bucket capture mode); the replay-overhead benchmark.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
FINAL=$(realpath -m "${OUT:-out}")
S=/tmp/session; rm -rf $S; mkdir -p $S
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $S/gpu.txt; cat $S/gpu.txt
OUT=$S STAGE_ONLY=1 bash scripts/gpu_references.sh > $S/stage.log 2>&1
SRC=/tmp/src; rm -rf $SRC; mkdir -p $SRC; tar xzf .wS/src.tgz -C $SRC
export MAMBA_EDU_COMMIT=$(cat .wS/commit) PYTHONPATH=/tmp/site:/tmp/cut:/tmp/cut/nvidia_cutlass_dsl/dsl_packages:$SRC \
    PYTHONUNBUFFERED=1 MPLBACKEND=Agg
cd $SRC
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
    -lms 500 > $S/gpu_clocks.csv &
SMI=$!
source "$HERE/gpu_step.sh"
step pytest_gpu "${TESTS_S:-110}" python3 -m pytest tests -m gpu -q -p no:cacheprovider -o addopts="" -rfE
step references "${REFS_S:-230}" python3 -m mamba_edu.lab.bench_lab_arms --out $S/references.json \
    --arms "${ARMS:-ours,fla_triton,lab_chunk_loop}" --budget-s "${REFS_BUDGET:-150}"
step ttft "${TTFT_S:-170}" python3 -m mamba_edu bench --out $S/bench --cases headline --repeats 7 \
    --warmup 2 --max-minutes 2.2
step replay "${REPLAY_S:-90}" python3 -m mamba_edu.benchmarks.replay --out $S/replay.json
kill $SMI
tar czf "$FINAL/session.tgz" -C $S . && ls -la "$FINAL"
