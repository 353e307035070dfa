#!/usr/bin/env bash
# One GPU call: the GPU tests at HEAD and what the GPU machine has installed. The machine has no
# network: carry .gpu_site/site.tgz (the pure-Python packages the grading tests import, packed from
# the venv) so that no test file fails to collect.
#   MAMBA_EDU_COMMIT=$(git rev-parse --short HEAD) OUT=... bash scripts/gpu_tests.sh
set -uo pipefail
OUT=$(realpath -m "${OUT:-out}"); S=/tmp/gputests; rm -rf $S /tmp/gpu_site; mkdir -p $S $OUT /tmp/gpu_site
[ -f .gpu_site/site.tgz ] && tar xzf .gpu_site/site.tgz -C /tmp/gpu_site
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg PYTHONPATH=$PWD:/tmp/gpu_site
source scripts/gpu_step.sh
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader | tee $S/gpu.txt
python3 -c "import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__)" | tee -a $S/gpu.txt
python3 -m pip list 2>/dev/null | grep -iE "flashinfer|flash.linear|^fla |cutlass|nvidia-cu|tilelang|sgl" > $S/pip_probe.txt; cat $S/pip_probe.txt
TAIL=30 step pytest_gpu ${TESTS_S:-420} python3 -m pytest tests -m gpu -q -p no:cacheprovider -o addopts="" -rfEs \
    --continue-on-collection-errors
tar -czf $OUT/gputests.tgz -C $S . && ls -la $OUT
