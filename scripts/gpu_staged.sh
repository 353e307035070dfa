#!/usr/bin/env bash
# Three calls to one warm GPU machine, for issue 41's measurements: the references travel in
# parts (docs/references.md, "Getting the references onto a GPU machine") and each call does the
# work its parts allow. Run from the repository root with OUT set; STEP picks the call:
#   STEP=1 (carry .wR: fla, FlashQLA, TileLang and their needs; FlashInfer's Python files)
#          the per-kernel breakdown of ours and FlashQLA (python -m mamba_edu.benchmarks.breakdown)
#   STEP=2 (carry .wA: the CUTLASS DSL wheels and the first half of libs-cu13, xz-packed)
#          the GPU tests and the replay-overhead and decode rows
#   STEP=3 (carry .wB: the second half) FlashInfer installed; the reference table on $CASES with
#          every arm, then the breakdown of FlashInfer while $BUDGET_S lasts (BREAKDOWN_FI=0: none).
#          Again with STEP=3 and no carry, on the same warm machine, for more $CASES.
#   STEP=0 (any carry) stages what it carried and stops.
#   STEP=4 (no carry; after 1-3 for FlashInfer, else ARMS=ours,lab_scan_builds_wu) the lab's
#          scan_builds_wu: its GPU test, timed beside ours (and FlashInfer) on the breakdown's
#          shapes, then its per-kernel breakdown (docs/references.md, "A first step ...").
# Each call writes $OUT/step<N>.tgz (logs and JSON) and prints the lines that matter.
set -uo pipefail
OUT=$(realpath -m "${OUT:-out}"); S=/tmp/step$STEP; rm -rf $S; mkdir -p $S /tmp/site /tmp/parts
export PYTHONPATH=/tmp/site:/tmp/cut:/tmp/cut/nvidia_cutlass_dsl/dsl_packages:$PWD \
    PYTHONUNBUFFERED=1 MPLBACKEND=Agg
source scripts/gpu_step.sh
command -v ncu >/dev/null || export PATH=$PATH:$(ls -d /opt/nvidia/nsight-compute/*/ 2>/dev/null | tail -1)
for f in .w?/refs_site.tar.xz .w?/fi_trim.tar.xz; do
    [ -f "$f" ] && [ ! -f "/tmp/site/.got_$(basename "$f")" ] && tar -xJf "$f" -C /tmp/site \
        && touch "/tmp/site/.got_$(basename "$f")"
done
for whl in .wR/einops-*.whl; do  # fla imports einops, which not every GPU image has
    [ -f "$whl" ] && ! python3 -c "import einops" 2>/dev/null && \
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$whl"
done
cp -n .wA/*.whl .wA/*.part.* .wB/*.part.* /tmp/parts/ 2>/dev/null
if [ -f /tmp/parts/cu13.tar.xz.part.ab ] && [ -f /tmp/parts/cu13.tar.xz.part.aa ] && [ ! -f /tmp/cut/.got ]; then
    # the four CUTLASS DSL packages share nvidia_cutlass_dsl/: the three wheels in one pip call,
    # then libs-cu13 unpacked over them
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cut \
        /tmp/parts/nvidia_cutlass_dsl*.whl && cat /tmp/parts/cu13.tar.xz.part.* | xz -d \
        | tar -x -C /tmp/cut && touch /tmp/cut/.got
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
        /tmp/parts/cuda_tile*.whl /tmp/parts/nccl4py*.whl
fi
echo "staged: $(ls -a /tmp/site | grep -c '^\.got') site parts, cutlass $([ -f /tmp/cut/.got ] && echo yes || echo no)"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
    -lms 500 > $S/gpu_clocks.csv &
SMI=$!
case $STEP in
1)  TAIL=20 step breakdown 500 python3 -m mamba_edu.benchmarks.breakdown --out $S \
        --arms "${ARMS:-ours,flashqla}" --timeout-s 200 \
        --clock-log benchmarks/breakdown_clocks.csv ;;
2)  step pytest_gpu 260 python3 -m pytest tests -m gpu -q -p no:cacheprovider -o addopts="" -rfE \
        --continue-on-collection-errors
    step replay 120 python3 -m mamba_edu.benchmarks.replay --out $S/replay.json
    step kernels 150 python3 -m mamba_edu.benchmarks.kernels --out $S/kernels --quick --no-fla \
        --budget-s 90 ;;
3)  TAIL=20 step references "${REFS_S:-420}" python3 -m mamba_edu.benchmarks.references --out $S/references.json \
        --cases "$CASES" --arms ours,fla_triton,fla_dispatch,flashqla,flashinfer \
        --clock-log benchmarks/references_staged_clocks.csv --budget-s "${REFS_BUDGET_S:-1e9}"
    left=$(( ${BUDGET_S:-560} - SECONDS ))
    [ "${BREAKDOWN_FI:-1}" = 1 ] && [ $left -gt 60 ] && TAIL=20 step breakdown_fi $left python3 -m mamba_edu.benchmarks.breakdown \
        --out $S --arms flashinfer --timeout-s 120 --clock-log benchmarks/breakdown_fi_clocks.csv ;;
4)  BREAKDOWN_CASES="qwen3-next 1x8192,qwen3-next 8x1024,qwen3-next 1x32768,qwen3-next 8x4096"
    step pytest_lab 120 python3 -m pytest tests/lab/test_lab_scan_builds_wu.py -m gpu -q -p no:cacheprovider -o addopts=""
    TAIL=20 step lab_arms 240 python3 -m mamba_edu.lab.bench_lab_arms --out $S/lab_arms.json \
        --cases "$BREAKDOWN_CASES" --arms "${ARMS:-ours,lab_scan_builds_wu,flashinfer}" \
        --clock-log benchmarks/lab_arms_clocks.csv
    TAIL=20 step lab_breakdown 200 python3 -m mamba_edu.lab.bench_lab_breakdown --out $S \
        --cases "$BREAKDOWN_CASES" --arms ours,lab_scan_builds_wu --timeout-s 100 \
        --clock-log benchmarks/lab_breakdown_clocks.csv ;;
esac
kill $SMI
rm -f $S/*.ncu-rep
tar -czf $OUT/step$STEP.tgz -C $S .
ls -la $OUT
