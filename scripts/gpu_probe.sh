#!/usr/bin/env bash
# On the GPU machine: unpack the references (fla, FlashQLA, TileLang and their needs, packed as
# one xz tarball in .wR/refs_site.tar.xz; docs/references.md says how) and run
# scripts/probe_shared_arms.py over arm pairs and variants, then the reference benchmark on
# CASES with ARMS. Writes $OUT/probe.jsonl, $OUT/probe.log, $OUT/references.json, $OUT/gpu_clocks.csv.
set -uo pipefail
OUT=$(realpath -m "${OUT:-out}")
mkdir -p "$OUT" /tmp/site
[ -f /tmp/site/.got ] || { tar -xJf .wR/refs_site.tar.xz -C /tmp/site && touch /tmp/site/.got; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv -lms 500 > "$OUT/gpu_clocks.csv" &
SMI=$!
for pair in ${PAIRS:-}; do
    for variant in ${VARIANTS:-default}; do
        extra=(); cache=4
        case $variant in own) extra=(--own-inputs) ;; cache) cache=4096 ;; eager) extra=(--eager-after) ;; esac
        FLA_TENSOR_CACHE_SIZE=$cache timeout 150 python3 scripts/probe_shared_arms.py \
            --case "${PROBE_CASE:-qwen3-next 16x256}" --arms "$pair" "${extra[@]}" \
            --log "$OUT/probe.jsonl" >> "$OUT/probe.log" 2>&1
        echo "$pair $variant: exit $?"
    done
done
if [ -n "${CASES:-}" ]; then
    python3 -m mamba_edu.benchmarks.references --out "$OUT/references.json" --cases "$CASES" \
        --arms "${ARMS:-ours,fla_triton,fla_dispatch,flashqla}" --clock-log "${CLOCK_LOG:-}" \
        2>&1 | grep -v "^\[FLA Backend\]" | tail -30
fi
kill $SMI
