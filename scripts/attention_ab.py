"""A/B in one GPU run: the model's attention as shipped (our Triton kernel at 1 × 512) against
SDPA forced, on the launch-bound 1 × 512 case, graph-replayed, arms alternating.

    OUT=/some/dir python scripts/attention_ab.py     # on the H200, from the repository root

For each round and arm it times the ``fused`` replay (TTFT median, GPU busy from a profiled
replay) and reads from that replay's trace how long after the start of the ``cudaGraphLaunch``
call the first GPU event began. Writes ``$OUT/attention_ab.json`` and the traces.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from dataclasses import asdict
from pathlib import Path

import torch

from mamba_edu.benchmarks import ttft
from mamba_edu.model import layers
from mamba_edu.profiling.bubbles import GPU_CATEGORIES, load_trace, trace_events

OUT = Path(os.environ.get("OUT", "out/attention_ab"))
ROUNDS = 2


def start_delay_ms(trace: Path) -> float:
    """From the start of the cudaGraphLaunch call to the first GPU event of the replay."""
    ev = trace_events(load_trace(trace))
    launch = next(e for e in ev if "GraphLaunch" in e.name)
    return (min(e.start for e in ev if e.cat in GPU_CATEGORIES) - launch.start) / 1e3


def main() -> int:
    case = next(c for c in ttft.headline_cases() if c.name == "launch_bound_1x512")
    args = argparse.Namespace(repeats=15, warmup=3, seed=0, no_profile=False)
    bench = ttft.make_benches([case], torch.device("cuda"), torch.bfloat16)[case.preset]
    shipped = layers.causal_attention
    arms = {"triton_attention": shipped,
            "sdpa": functools.partial(shipped, backend="torch")}
    rows = []
    for rnd in range(ROUNDS):
        for arm, attention in arms.items():
            layers.causal_attention = attention
            trace_dir = OUT / f"{arm}_{rnd}"
            row = ttft.measure(bench, case, case.preset, "fused", "graph", args, trace_dir)
            trace = trace_dir / f"{ttft.trace_name(row)}.pt.trace.json.gz"
            rows.append(dict(arm=arm, round=rnd, start_delay_ms=start_delay_ms(trace), **asdict(row)))
            print(arm, rnd, row.ttft_ms, row.gpu_busy_ms, rows[-1]["start_delay_ms"], flush=True)
    layers.causal_attention = shipped
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "attention_ab.json").write_text(json.dumps(
        dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
