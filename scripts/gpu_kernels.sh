#!/usr/bin/env bash
# GPU run of the kernels issue (#3): the GPU tests of tests/test_kernels_*.py and the benchmark.
# Usage (repository root, on the H200):  OUT=/some/folder bash scripts/gpu_kernels.sh
# Everything lands in $OUT: pytest log + junit XML, benchmark JSON/CSV + log, summary.txt.
# Each step runs even when an earlier one failed; the exit status is non-zero if any failed.
# Time limits per step (30 + 180 + 280 s) keep the whole run under 8.5 minutes.
set -u
OUT="${OUT:-data/benchmarks}"
mkdir -p "$OUT"
: > "$OUT/steps.txt"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the package from this checkout
PY="${PYTHON:-python}"
status=0
step() {  # step NAME TIMEOUT_S COMMAND...: run, log to $OUT/NAME.log, remember a failure
    local name="$1" limit="$2"; shift 2
    echo "== $name: $*"
    local start=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc ($((SECONDS - start)) s)" | tee -a "$OUT/steps.txt"
    tail -n 25 "$OUT/$name.log"
    [ "$rc" -eq 0 ] || status=1
}

unset TRITON_INTERPRET
step environment 30 "$PY" -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name()); import importlib.util as u; print('fla importable:', u.find_spec('fla') is not None)"
step pytest_kernels 180 "$PY" -m pytest tests/test_kernels_*.py -q -rfEs -p no:cacheprovider --junitxml="$OUT/pytest_kernels.xml"
step bench_kernels 280 "$PY" -m mamba_edu.benchmarks.kernels --out "$OUT" --budget-s 190

{
    echo "steps:"; cat "$OUT/steps.txt"
    echo; echo "pytest:"; tail -n 3 "$OUT/pytest_kernels.log"
    echo; echo "benchmark (ms, median; ratio = ours / fla, graph replay):"
    sed -n '/^case /,/^wrote /p' "$OUT/bench_kernels.log"
} > "$OUT/summary.txt"
echo; cat "$OUT/summary.txt"
exit $status
