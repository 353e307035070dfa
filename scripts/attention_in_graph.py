"""How long the attention layers take inside the 1 × 512 replay, without a profiler (H200).

    OUT=/some/dir python scripts/attention_in_graph.py      # on the GPU, from the repository root

The model's ``causal_attention`` is wrapped so that a CUDA event is recorded before and after
every call. Recorded during the capture, the events become nodes of the graph. The ``fused``
prefill of ``launch_bound_1x512`` is captured with our Triton kernel (as shipped) and with SDPA
forced, arms alternating over 2 rounds, and each graph is replayed 30 times. Per replay it sums:

- ``attention_ms``: the 15 attention calls, event to event;
- ``in_graph_ms``: the whole forward, from an event at the model's start to one at its end.

Medians go to ``$OUT/attention_in_graph.json``.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
from pathlib import Path

import torch

from mamba_edu.benchmarks import ttft
from mamba_edu.model import layers
from mamba_edu.profiling.timing import Prefills

OUT = Path(os.environ.get("OUT", "out/attention_in_graph"))
REPEATS = 30
ROUNDS = 2


def timed(fn, pairs):
    """``fn`` with an event pair around each call, appended to ``pairs``."""
    def call(*args, **kwargs):
        start, end = (torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
        start.record()
        out = fn(*args, **kwargs)
        end.record()
        pairs.append((start, end))
        return out
    return call


def replay_times(bench, case, attention) -> dict:
    """Capture the ``fused`` forward with ``attention`` timed, replay it, return the medians."""
    pairs, forward = [], []
    engine = bench.engine("fused", case.cache_chunk)
    prefills = Prefills(engine, case.lengths, seed=0)
    layers.causal_attention = timed(attention, pairs)
    engine._run_model = timed(engine._run_model, forward)
    try:
        captured = engine.capture_prefill(prefills.next())
    finally:
        del engine._run_model
    prefills.logits = captured.logits
    pairs, forward = pairs[-15:], forward[-1:]  # the captured calls (the warm-ups came first)
    attention_ms, in_graph_ms = [], []
    for i in range(REPEATS + 3):
        captured.replay()
        torch.cuda.synchronize()
        if i >= 3:
            attention_ms.append(sum(s.elapsed_time(e) for s, e in pairs))
            in_graph_ms.append(forward[0][0].elapsed_time(forward[0][1]))
    prefills.close()
    return dict(attention_ms=statistics.median(attention_ms), attention_calls=len(pairs),
                in_graph_ms=statistics.median(in_graph_ms))


def main() -> int:
    case = next(c for c in ttft.headline_cases() if c.name == "launch_bound_1x512")
    bench = ttft.make_benches([case], torch.device("cuda"), torch.bfloat16)[case.preset]
    shipped = layers.causal_attention
    arms = {"triton_attention": shipped, "sdpa": functools.partial(shipped, backend="torch")}
    rows = []
    try:
        for rnd in range(ROUNDS):
            for arm, attention in arms.items():
                rows.append(dict(arm=arm, round=rnd, **replay_times(bench, case, attention)))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        layers.causal_attention = shipped
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "attention_in_graph.json").write_text(json.dumps(
        dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, repeats=REPEATS,
             rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
