#!/usr/bin/env bash
# The TTFT benchmark on a GPU (the H200): headline cases, then the sweeps, into $OUT.
#
#   OUT=/some/dir bash scripts/gpu_bench.sh          # on the GPU machine, from any directory
#
# Needs only python3 with torch + triton + matplotlib + tqdm (no network, nothing installed: the
# package is used from this checkout). Finishes in under 9 minutes: the bench starts no new case
# after BENCH_MINUTES and is killed at BENCH_TIMEOUT seconds, keeping the cases it finished.
# BENCH_ARGS adds bench options, e.g. BENCH_ARGS="--cases headline --quick" for a short run.
# $OUT receives 8 files, none in a subfolder:
#   results.json, results.csv                  every measurement
#   timeline_*.png, bars_*.png (2 cases each)  the headline figures
#   bench.log                                  the full output
#   bench_artifacts.tar.gz                     runs/ (trimmed traces, TensorBoard layout), all figures,
#                                              gpu_clocks.csv (SM clock, power, temperature over the run)
set -uo pipefail

cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu_bench}
PY=${PYTHON:-python3}
BENCH_MINUTES=${BENCH_MINUTES:-5.5}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-450}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MPLBACKEND=Agg
mkdir -p "$OUT"
WORK=$(mktemp -d)
LOG="$OUT/bench.log"

"$PY" -c 'import torch, triton, matplotlib, tqdm
print("torch", torch.__version__, "triton", triton.__version__,
      "gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
assert torch.cuda.is_available(), "this script is for a GPU machine"' 2>&1 | tee "$LOG" || exit 1

# SM clock, power and temperature every 200 ms: a replay that runs slower than eager shows here.
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
    -lms 200 > "$WORK/gpu_clocks.csv" 2>/dev/null &
CLOCKS=$!
timeout "$BENCH_TIMEOUT" "$PY" -m mamba_edu bench --out "$WORK" --cases all \
    --repeats 7 --warmup 2 --max-minutes "$BENCH_MINUTES" ${BENCH_ARGS:-} 2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
kill "$CLOCKS" 2>/dev/null
if [ ! -f "$WORK/results.json" ]; then
    echo "bench exited with $status before finishing a single case; see $LOG" | tee -a "$LOG"
    exit 1
fi
if [ "$status" -ne 0 ]; then
    echo "bench exited with $status (124: timed out); redrawing from what was measured" | tee -a "$LOG"
    "$PY" -m mamba_edu bench --out "$WORK" --replot 2>&1 | tee -a "$LOG"
fi

cp "$WORK"/results.json "$WORK"/results.csv "$OUT"/ 2>/dev/null
for case in gpu_bound_8x1024 launch_bound_1x512; do
    cp "$WORK/timeline_$case.png" "$WORK/bars_$case.png" "$OUT"/ 2>/dev/null
done
tar czf "$OUT/bench_artifacts.tar.gz" -C "$WORK" $(cd "$WORK" && ls -d runs *.png gpu_clocks.csv 2>/dev/null)
echo "--- trace sizes (trimmed, gzipped) ---" | tee -a "$LOG"
(cd "$WORK" && du -ch runs/*/*.pt.trace.json.gz 2>/dev/null | tail -n 1) | tee -a "$LOG"
ls -la "$OUT" | tee -a "$LOG"
echo "--- results (TTFT: median ms; busy: GPU busy ms; idle: bubble fraction) ---" | tee -a "$LOG"
"$PY" -c "import sys; from pathlib import Path; from mamba_edu.benchmarks.ttft import format_table, load_results
print(format_table(load_results(Path(sys.argv[1]))))" "$WORK" 2>&1 | tee -a "$LOG"
exit "$status"
