#!/usr/bin/env bash
# GPU checks of the serving stack (state pool, strategies, engine, sync sniffer) on one GPU.
# Self-contained: no network, no install (the repo is put on PYTHONPATH). Target < 5 minutes.
#   OUT=/some/dir scripts/gpu_serving.sh
# Writes to $OUT: device.txt, pytest_gpu.txt (the GPU-marked tests of the serving files),
# serving_gpu.txt / serving_gpu.json (sniffer sync counts per strategy for the qwen3-next preset,
# set_sync_debug_mode("error") outcome, eager time, CUDA-graph replay vs eager).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_serving}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}

{ nvidia-smi -L; $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  2>&1 | tee "$OUT/device.txt"

if $PY -c "import pytest" 2>/dev/null; then
  timeout 150 $PY -m pytest -q -m gpu -p no:cacheprovider --continue-on-collection-errors \
    tests/profiling/test_syncs.py tests/serving/test_model.py tests/test_engine.py tests/serving/test_serving_strategies.py \
    tests/serving/test_serving_pool.py tests/serving/test_serving_cache.py tests/serving/test_serving_planning.py \
    2>&1 | tee "$OUT/pytest_gpu.txt"
else
  echo "pytest not installed: GPU tests skipped" | tee "$OUT/pytest_gpu.txt"
fi

timeout 240 $PY - "$OUT" <<'PYEOF' 2>&1 | tee "$OUT/serving_gpu.txt"
import json, statistics, sys, time
import torch
from mamba_edu.serving.bucket import Bucket
from mamba_edu.engine import Engine, Request
from mamba_edu.model import build_model
from mamba_edu.profiling import count_syncs, cuda_sync_guard

out_dir = sys.argv[1]
model = build_model("qwen3-next", device="cuda", dtype=torch.bfloat16)
cfg = model.config
print(f"qwen3-next stand-in: {cfg.n_layers} layers ({len(cfg.gdn_layers)} GDN, {len(cfg.attn_layers)} "
      f"attention), dense MLP {cfg.mlp_width} wide standing in for the MoE, bf16, random weights")
gen = torch.Generator().manual_seed(0)
prompts = {name: [torch.randint(0, cfg.vocab, (n,), generator=gen).tolist() for n in lens]
           for name, lens in (("tracked", [256, 200, 100]), ("untracked", [60, 40]))}
results = []


def rerun(engine, batch):
    """A prepared batch runs once: put its slots back to their prepared states, then run it."""
    engine.reset_prefill(batch)
    return engine.forward_prefill(batch)


for strategy in ("naive", "precomputed", "sync_free", "fused"):
    for label, toks in prompts.items():
        engine = Engine(model, strategy=strategy, max_requests=4, cache_slots=2)
        batch = engine.prepare_prefill([Request(i, t) for i, t in enumerate(toks)])
        engine.forward_prefill(batch)  # warm-up (Triton compiles on first use)
        torch.cuda.synchronize()
        with count_syncs() as syncs:
            eager = rerun(engine, batch).clone()
        torch.cuda.synchronize()
        with cuda_sync_guard(raise_on_sync=False) as guard:
            rerun(engine, batch)
        times = []
        for _ in range(5):
            engine.reset_prefill(batch)  # a batch runs once; re-arm it (host work, untimed)
            torch.cuda.synchronize(); t = time.perf_counter()
            engine.forward_prefill(batch)
            torch.cuda.synchronize(); times.append((time.perf_counter() - t) * 1e3)
        row = dict(strategy=strategy, batch=label, lengths=[len(t) for t in toks],
                   tracked=batch.track_mask, syncs=syncs.count, by_op=dict(syncs.by_op),
                   sites=dict(syncs.sites), sync_debug_error_passed=guard.passed,
                   sync_debug_error=(guard.error or "").splitlines()[0] if guard.error else None,
                   eager_ms_median=statistics.median(times))
        if strategy in ("sync_free", "fused"):
            ref = rerun(engine, batch).clone()
            captured = engine.capture_prefill(Bucket(sum(map(len, toks)), len(toks)), "graph")
            engine.reset_prefill(batch)
            rep = captured.replay(batch).clone()
            torch.cuda.synchronize()
            row["graph_vs_eager_max_abs"] = (rep - ref).abs().max().item()
            gt = []
            for _ in range(5):
                engine.reset_prefill(batch)  # re-arm (host work, untimed); the replay refills
                torch.cuda.synchronize(); t = time.perf_counter()
                captured.replay(batch)
                torch.cuda.synchronize(); gt.append((time.perf_counter() - t) * 1e3)
            row["graph_ms_median"] = statistics.median(gt)
            del captured
        results.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "sites"}), flush=True)
        del engine, batch
        torch.cuda.empty_cache()
json.dump(results, open(f"{out_dir}/serving_gpu.json", "w"), indent=1)
PYEOF
