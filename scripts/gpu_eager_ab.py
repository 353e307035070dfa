"""One arm of the eager A/B for the lean engine: the eager ``fused`` prefill of ``qwen3.5-tp8``,
1 × 512 tokens (``--requests``, ``--length``: another batch of equal prompts), timed on the GPU by wall clock around a synchronized forward (host-bound: the
host's launches are the forward's time). Run once per arm in a process of its own, the arms
alternated by ``scripts/gpu_lean.sh``; prints one JSON line. The package comes from ``sys.path``
(``PYTHONPATH`` names the checkout of the arm).

    python scripts/gpu_eager_ab.py ARM [--repeats 30] [--requests 1 --length 512] [--cprofile FILE]

``--cprofile FILE``: after the timed forwards, 10 more under ``cProfile`` (not timed), the
functions by their own time written to FILE: where the host time of an eager forward goes.
"""

import argparse
import contextlib
import cProfile
import datetime
import io
import json
import os
import pstats
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
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--cprofile")
    args = parser.parse_args()
    model = build_model("qwen3.5-tp8", device="cuda", dtype=torch.bfloat16)
    engine = Engine(model, strategy="fused", max_requests=max(2, args.requests))
    gen = torch.Generator().manual_seed(0)
    times = []

    def forward(i: int, profiler=None) -> float:
        batch = engine.prepare_prefill([
            Request(f"r{i}.{n}", torch.randint(0, model.config.vocab, (args.length,), generator=gen).tolist())
            for n in range(args.requests)])
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with profiler or contextlib.nullcontext():
            engine.forward_prefill(batch)
        torch.cuda.synchronize()
        ms = 1e3 * (time.perf_counter() - t0)
        engine.abort_prefill(batch)
        return ms

    for i in range(args.warmup + args.repeats):
        ms = forward(i)
        if i >= args.warmup:
            times.append(ms)
    if args.cprofile:
        profiler = cProfile.Profile()
        for i in range(10):
            forward(args.warmup + args.repeats + i, profiler)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(80)
        with open(args.cprofile, "w") as f:
            f.write(f"arm {args.arm} ({args.requests}x{args.length}), "
                    f"commit {os.environ.get('MAMBA_EDU_COMMIT', 'not given')}, "
                    f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}, "
                    f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
                    f"{__import__('triton').__version__}: 10 eager forwards under cProfile "
                    f"(python scripts/gpu_eager_ab.py {args.arm} --cprofile FILE)\n{text.getvalue()}")
    clock = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True).stdout.strip()
    print(json.dumps({"arm": args.arm, "shape": f"{args.requests}x{args.length}", "package": mamba_edu.__file__, "median_ms": statistics.median(times),
                      "min_ms": min(times), "max_ms": max(times), "repeats": len(times), "sm_mhz": clock,
                      "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "triton": __import__("triton").__version__}))


if __name__ == "__main__":
    main()
