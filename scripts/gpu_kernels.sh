#!/usr/bin/env bash
# GPU run of the kernels: the GPU tests of tests/test_kernels_*.py and the kernel benchmark.
# Usage (repository root, on the H200):  OUT=/some/folder bash scripts/gpu_kernels.sh
# flash-linear-attention (the comparison) is taken from the environment, or installed from the
# wheels in $WHEELS (default .whl/, e.g. fla_core-0.6.0-py3-none-any.whl) when that folder exists.
# Everything lands in $OUT: pytest log + junit XML, benchmark JSON/CSV + log, summary.txt.
# Each step runs even when an earlier one failed; the exit status is non-zero if any failed.
# Time limits per step (30 + PYTEST_S + BENCH_S s; defaults 120 and 250) keep the whole run
# under 7 minutes; the benchmark skips its remaining cases after BUDGET_S (default 200) s.
set -u
OUT="${OUT:-data/benchmarks}"
WHEELS="${WHEELS:-.whl}"
mkdir -p "$OUT"
: > "$OUT/steps.txt"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the package from this checkout
export FLA_DISABLE_BACKEND_DISPATCH=1                 # fla's pure Triton path
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
if [ -d "$WHEELS" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/fla_site "$WHEELS"/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/fla_site"
fi
step environment 30 "$PY" -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name()); import importlib.util as u; print('fla importable:', u.find_spec('fla') is not None)"
# Several workers compile the kernels' autotune configs in parallel (when pytest-xdist is there).
workers=$("$PY" -c "import xdist" 2>/dev/null && echo "-n 6")
step pytest_kernels "${PYTEST_S:-120}" "$PY" -m pytest tests/test_kernels_*.py -q -rfEs -p no:cacheprovider $workers --junitxml="$OUT/pytest_kernels.xml"
step bench_kernels "${BENCH_S:-250}" "$PY" -m mamba_edu.benchmarks.kernels --out "$OUT" \
    --budget-s "${BUDGET_S:-200}"

{
    echo "steps:"; cat "$OUT/steps.txt"
    echo; echo "pytest:"; tail -n 3 "$OUT/pytest_kernels.log"
    echo; echo "benchmark (ms, median; ratio = ours / fla, graph replay):"
    sed -n '/^case /,/^wrote /p' "$OUT/bench_kernels.log"
} > "$OUT/summary.txt"
echo; cat "$OUT/summary.txt"
exit $status
