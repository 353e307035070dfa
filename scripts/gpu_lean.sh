#!/usr/bin/env bash
# One GPU call for the lean-engine issue: the GPU tests at HEAD, then the eager fused prefill of
# qwen3.5-tp8 1 x 512 before (the checkout in .before/, carried) and after (HEAD), arms alternated
# over $ROUNDS rounds in processes of their own, the SM clock logged; then one cProfile of each
# arm at 1 x 512 (untimed, cprofile_ARM.txt). SHAPES adds batches (requests x length) to the
# rounds. Results in $OUT/lean.tgz.
# ARMS picks the arms: "after ARM" times a lab arm of mamba_edu/lab/bench_lab_eager.py (workspace,
# prologue) beside HEAD. (The run of data/bench/lean_eager_h100_61deccc.json had an arm "bound",
# the lab's bound launches, before they became mamba_edu/kernels/launcher.py.)
# The GPU machine's copy has no usable git history: pass the commit, as
#   MAMBA_EDU_COMMIT=$(git rev-parse --short HEAD) OUT=... bash scripts/gpu_lean.sh
# (the benchmarks stamp their files with it).
set -uo pipefail
OUT=$(realpath -m "${OUT:-out}"); S=/tmp/lean; rm -rf $S; mkdir -p $S $OUT
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
source scripts/gpu_step.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $S/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 500 \
    > $S/gpu_clocks.csv &
SMI=$!
[ "${TESTS_S:-240}" = 0 ] || TAIL=25 step pytest_gpu ${TESTS_S:-240} python3 -m pytest tests -m gpu -q -p no:cacheprovider -o addopts="" -rfE \
    --continue-on-collection-errors
arm() {  # arm NAME [ARGS of gpu_eager_ab.py]
    local name=$1; shift
    case $name in
        before)    PYTHONPATH=$PWD/.before timeout 200 python3 scripts/gpu_eager_ab.py before "$@" ;;
        after)     PYTHONPATH=$PWD timeout 200 python3 scripts/gpu_eager_ab.py after "$@" ;;
        workspace|prologue) PYTHONPATH=$PWD timeout 200 python3 -m mamba_edu.lab.bench_lab_eager gpu $name "$@" ;;
    esac
}
for round in $(seq ${ROUNDS:-3}); do
    for shape in ${SHAPES:-1x512}; do  # SHAPES="1x512 8x1024": requests x length, each alternated
        for name in ${ARMS:-before after}; do  # ARMS="after ARM": a lab arm (bench_lab_eager.ARMS)
            arm $name --requests ${shape%x*} --length ${shape#*x} >> $S/eager_ab.jsonl 2>> $S/eager_ab.err
        done
    done
done
cat $S/eager_ab.jsonl; tail -5 $S/eager_ab.err
for name in ${ARMS:-before after}; do  # then, untimed: where each arm's host time goes
    arm $name --repeats 3 --cprofile $S/cprofile_$name.txt > /dev/null 2>> $S/eager_ab.err
done
head -40 $S/cprofile_*.txt
kill $SMI
tar -czf $OUT/lean.tgz -C $S . && ls -la $OUT
