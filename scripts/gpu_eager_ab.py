"""One arm of the eager A/B for the lean engine: the eager ``fused`` prefill of ``qwen3.5-tp8``,
1 × 512 tokens, timed on the GPU by wall clock around a synchronized forward (host-bound: the
host's launches are the forward's time). Run once per arm in a process of its own, the arms
alternated by ``scripts/gpu_lean.sh``; prints one JSON line. The package comes from ``sys.path``
(``PYTHONPATH`` names the checkout of the arm).

    python scripts/gpu_eager_ab.py ARM [--repeats 30]
"""

import argparse
import json
import statistics
import subprocess
import time

import torch

import mamba_edu
from mamba_edu.engine import Engine, Request
from mamba_edu.model import build_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("arm")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    model = build_model("qwen3.5-tp8", device="cuda", dtype=torch.bfloat16)
    engine = Engine(model, strategy="fused", max_requests=2)
    gen = torch.Generator().manual_seed(0)
    times = []
    for i in range(args.warmup + args.repeats):
        prompt = torch.randint(0, model.config.vocab, (512,), generator=gen).tolist()
        batch = engine.prepare_prefill([Request(f"r{i}", prompt)])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        engine.forward_prefill(batch)
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(1e3 * (time.perf_counter() - t0))
        engine.abort_prefill(batch)
    clock = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True).stdout.strip()
    print(json.dumps({"arm": args.arm, "package": mamba_edu.__file__, "median_ms": statistics.median(times),
                      "min_ms": min(times), "max_ms": max(times), "repeats": len(times), "sm_mhz": clock,
                      "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "triton": __import__("triton").__version__}))


if __name__ == "__main__":
    main()
