"""Where a CUDA-graph replay's time goes, without a profiler (H200, one call).

    OUT=/some/dir python scripts/replay_breakdown.py [--pdl] [--attention-calls]   # on the GPU

For the launch-bound 1 × 512 case, strategies ``fused`` and ``sync_free``, with the model's
attention as shipped (our Triton kernel) and with SDPA forced, arms alternating over 2 rounds
(with ``--pdl``, each also with programmatic dependent launch on, :mod:`mamba_edu.kernels.launch`).
The prefill is captured with two CUDA events recorded *inside* the graph, at its start and end,
and replayed ``REPEATS`` times between two events recorded on the stream around the launch. Per
replay:

- ``ttft_ms``: wall time of ``replay()`` plus the synchronize, as the benchmark times TTFT;
- ``host_launch_ms``: until ``replay()`` returned;
- ``start_ms``: from the event before the launch to the graph's first event (the launch call
  and the GPU picking the graph up);
- ``in_graph_ms``: from the graph's first event to its last (kernels and the gaps between them);
- ``end_ms``: from the graph's last event to the one after it;
- with ``--attention-calls`` (``fused`` only, no ``ttft.measure``), ``attention_ms``: the sum
  over the forward's attention calls, each between two more events captured around it.

Beside them, ``ttft.measure`` of the same case and arm: its TTFT and the GPU busy time of a
profiled replay. Writes ``$OUT/replay_breakdown[_pdl|_attention].json``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import torch

from mamba_edu.benchmarks import ttft
from mamba_edu.kernels.launch import programmatic_launch
from mamba_edu.model import layers
from mamba_edu.profiling.timing import Prefills

OUT = Path(os.environ.get("OUT", "out/replay_breakdown"))
REPEATS = 30
ROUNDS = 2


def with_events(fn, pairs: list):
    """``fn`` recording a CUDA event before and after each call (inside a capture they become
    nodes of the graph); each call's pair is appended to ``pairs``."""
    def call(*args, **kwargs):
        start, end = (torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))
        start.record()
        out = fn(*args, **kwargs)
        end.record()
        pairs.append((start, end))
        return out
    return call


def breakdown(bench, case, strategy, attention, attention_calls: bool) -> dict:
    """Medians over ``REPEATS`` replays of the fields in the module docstring."""
    engine = bench.engine(strategy, case.cache_chunk)
    prefills = Prefills(engine, case.lengths, seed=0)
    forward, calls = [], []
    layers.causal_attention = with_events(attention, calls) if attention_calls else attention
    engine._run_model = with_events(engine._run_model, forward)
    try:
        captured = engine.capture_prefill(prefills.next())
    finally:
        del engine._run_model
    prefills.logits = captured.logits
    # The warm-up forwards came first, each making the same calls: keep the captured one's.
    first, last = forward[-1]
    calls = calls[len(calls) - len(calls) // len(forward):]
    before, after = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    fields = {k: [] for k in ("ttft_ms", "host_launch_ms", "start_ms", "in_graph_ms", "end_ms",
                              "attention_ms")}
    for i in range(REPEATS + 3):
        torch.cuda.synchronize()
        before.record()
        t0 = time.perf_counter()
        captured.replay()
        t1 = time.perf_counter()
        after.record()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if i < 3:  # warm-up replays
            continue
        fields["ttft_ms"].append((t2 - t0) * 1e3)
        fields["host_launch_ms"].append((t1 - t0) * 1e3)
        fields["start_ms"].append(before.elapsed_time(first))
        fields["in_graph_ms"].append(first.elapsed_time(last))
        fields["end_ms"].append(last.elapsed_time(after))
        fields["attention_ms"].append(sum(s.elapsed_time(e) for s, e in calls))
    prefills.close()
    out = {k: statistics.median(v) for k, v in fields.items()}
    if not attention_calls:
        del out["attention_ms"]
    else:
        out["attention_calls"] = len(calls)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pdl", action="store_true", help="also every arm with PDL on")
    p.add_argument("--attention-calls", action="store_true",
                   help="time the attention calls inside the graph (fused only)")
    opts = p.parse_args()
    pdl_modes = (False, True) if opts.pdl else (False,)
    strategies = ("fused",) if opts.attention_calls else ("fused", "sync_free")
    case = next(c for c in ttft.headline_cases() if c.name == "launch_bound_1x512")
    args = argparse.Namespace(repeats=15, warmup=3, seed=0, no_profile=False)
    bench = ttft.make_benches([case], torch.device("cuda"), torch.bfloat16)[case.preset]
    shipped = layers.causal_attention
    arms = {"triton_attention": shipped, "sdpa": functools.partial(shipped, backend="torch")}
    rows = []
    try:
        for rnd, strategy in itertools.product(range(ROUNDS), strategies):
            for (arm, attention), pdl in itertools.product(arms.items(), pdl_modes):
                row = dict(arm=arm, pdl=pdl, strategy=strategy, round=rnd)
                with programmatic_launch(pdl):
                    row.update(breakdown(bench, case, strategy, attention, opts.attention_calls))
                    if not opts.attention_calls:
                        layers.causal_attention = attention
                        measured = ttft.measure(bench, case, case.preset, strategy, "graph",
                                                args, None)
                        row.update(measure_ttft_ms=measured.ttft_ms,
                                   measure_gpu_busy_ms=measured.gpu_busy_ms,
                                   measure_error=measured.error)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        layers.causal_attention = shipped
    OUT.mkdir(parents=True, exist_ok=True)
    suffix = "_attention" if opts.attention_calls else "_pdl" if opts.pdl else ""
    (OUT / f"replay_breakdown{suffix}.json").write_text(json.dumps(
        dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, case=asdict(case),
             repeats=REPEATS, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
