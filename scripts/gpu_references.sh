#!/usr/bin/env bash
# On the GPU machine: install the reference implementations carried as wheels (docs/references.md
# says how they travel in parts) and run the same-run reference benchmark.
#   scripts/gpu_references.sh [extra args for python -m mamba_edu.benchmarks.references]
# Writes $OUT/references.json, $OUT/references.log, $OUT/imports.log and $OUT/gpu_clocks.csv.
# STAGE_ONLY=1: install what this call carried and stop (the parts arrive over several calls).
# REFS=0 skips the reference benchmark; BENCH_MODULE=mamba_edu.lab.bench_lab_arms adds the lab arm; GPU_TESTS_S=N runs the GPU tests for at most N s;
# KERNELS_S=N runs bench-kernels (decode, conv, layer, host rows) for at most N s.
# The package runs from .wS/src.tgz (git archive of a commit, .wS/commit names it) when carried.
set -uo pipefail
OUT=$(realpath -m "${OUT:-out}")
mkdir -p "$OUT" /tmp/site
# Each call may carry some of the parts (a warm machine keeps /tmp between calls): stash the
# split FlashInfer dependency, join it once both parts have arrived, install what is new.
mkdir -p /tmp/parts
cp -n .w?/cutlass_cu13.part.* /tmp/parts/ 2>/dev/null
if [ -f /tmp/parts/cutlass_cu13.part.aa ] && [ -f /tmp/parts/cutlass_cu13.part.ab ]; then
    cat /tmp/parts/cutlass_cu13.part.* \
        > /tmp/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
fi
# The CUTLASS DSL wheels share one folder (nvidia_cutlass_dsl/): pip --target would let the last
# one replace the others', so they go into /tmp/cut together, once all four have arrived; their
# .pth (which adds dsl_packages to sys.path) is not run from a --target folder: PYTHONPATH does it.
cp -n .w?/nvidia_cutlass_dsl*.whl /tmp/parts/ 2>/dev/null
CUT=(/tmp/nvidia_cutlass_dsl_libs_cu13-*.whl /tmp/parts/nvidia_cutlass_dsl_libs_base-*.whl
     /tmp/parts/nvidia_cutlass_dsl_libs_core-*.whl /tmp/parts/nvidia_cutlass_dsl-[0-9]*.whl)
if ls "${CUT[@]}" >/dev/null 2>&1 && [ ! -f /tmp/cut/.got ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cut "${CUT[@]}" \
        2>&1 | tail -2 && touch /tmp/cut/.got
fi
for whl in .w?/*.whl; do
    case "$whl" in */nvidia_cutlass_dsl*) continue ;; esac
    [ -f "$whl" ] && [ ! -f "/tmp/site/.got_$(basename "$whl")" ] || continue
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$whl" 2>&1 | tail -2 && touch "/tmp/site/.got_$(basename "$whl")"
done
if [ -f .wC/fi_trim.tgz ] && [ ! -f /tmp/site/.got_fi_trim ]; then
    tar xzf .wC/fi_trim.tgz -C /tmp/site && touch /tmp/site/.got_fi_trim
fi
if [ -n "${STAGE_ONLY:-}" ]; then ls /tmp/site; exit 0; fi
SRC=$PWD
if [ -f .wS/src.tgz ]; then
    SRC=/tmp/src; rm -rf $SRC; mkdir -p $SRC; tar xzf .wS/src.tgz -C $SRC
    export MAMBA_EDU_COMMIT=$(cat .wS/commit)
fi
export PYTHONPATH=/tmp/site:/tmp/cut:/tmp/cut/nvidia_cutlass_dsl/dsl_packages:$SRC PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv -lms 500 > "$OUT/gpu_clocks.csv" &
SMI=$!
for m in fla flash_qla tilelang flashinfer.gdn_prefill; do
    echo "== import $m" >> "$OUT/imports.log"
    (cd "$SRC" && python3 -c "import $m") >> "$OUT/imports.log" 2>&1 && echo "import $m: ok" \
        || { echo "import $m: FAILED"; tail -4 "$OUT/imports.log"; }
done
if [ "${REFS:-1}" != 0 ]; then
    (cd "$SRC" && python3 -m "${BENCH_MODULE:-mamba_edu.benchmarks.references}" --out "$OUT/references.json" \
        --clock-log benchmarks/references_clocks.csv "$@") 2>&1 \
        | tee "$OUT/references.log" | grep -v "^\[FLA Backend\]" | tail -40
    grep -h "FLA Backend" "$OUT/references.log" | sort | uniq -c | head
fi
if [ -n "${KERNELS_S:-}" ]; then
    (cd "$SRC" && FLA_DISABLE_BACKEND_DISPATCH=1 timeout $((KERNELS_S + 60)) python3 -m \
        mamba_edu.benchmarks.kernels --out "$OUT/kernels" --budget-s "$KERNELS_S") 2>&1 | tail -30
fi
kill $SMI
# The GPU tests of the same tree (they need no reference packages).
if [ -n "${GPU_TESTS_S:-}" ]; then
    (cd "$SRC" && timeout "$GPU_TESTS_S" python3 -m pytest tests -m gpu -q -p no:cacheprovider \
        --continue-on-collection-errors -o addopts="" -rfE) > "$OUT/pytest_gpu.log" 2>&1
    echo "GPU tests: exit $?"; tail -15 "$OUT/pytest_gpu.log"
fi
