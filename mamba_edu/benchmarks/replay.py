"""Replay overhead and bubbles of a captured prefill, by two instruments, rounds alternated.

``python -m mamba_edu.benchmarks.replay [--out out/bench/replay.json] [--rounds 3]``

For each case (``qwen3.5-tp8`` at 1 × 512, 16 × 256 and 8 × 1024, with the LM head sharded as
tensor parallelism 8 shards it: a vocabulary slice of 1/8) and capture mode (``graph``, the whole
forward; ``gdn_inside`` and ``breakable``, pieces), a bucket of the ``fused`` strategy the size
of the case is captured and filled with one batch; its graphs' replays (without the refill) are
timed by

- **events**: ms per replay from two CUDA events around ``replays`` back-to-back replays (no
  profiler attached), and
- **trace**: one profiled replay of the same capture: ``busy``, the union of its kernels'
  intervals, and ``span``, its first kernel's start to its last kernel's end;

and reported as ``events_overhead = (events − busy) / busy`` and ``span_overhead = (span − busy)
/ busy``. Busy comes from the trace in both, so each ratio divides times of one kind of run by
busy time of the same capture (``busy`` and ``span`` from one instrument; ``events`` from the
other, over many replays). A round measures every (case, mode) by both instruments, in an order
rotated from round to round; each row keeps every round's values, the median and the spread, and
the SM clock read after each measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

CASES = [[512], [256] * 16, [1024] * 8]
PRESET = "qwen3.5-tp8"
VOCAB_SHARDS = 8  # tensor parallelism 8 gives each GPU a 1/8 slice of the vocabulary
MODES = ("graph", "gdn_inside", "breakable")


def overheads(events_ms: float, busy_intervals: list[tuple[float, float]]) -> dict:
    """The two ratios from a replay's events time (ms) and the merged busy intervals (µs, sorted,
    disjoint) of its profiled replay: ``busy_ms``, ``span_ms``, ``events_overhead``,
    ``span_overhead``."""
    if not busy_intervals:
        raise ValueError("the profiled replay ran no kernel on the GPU")
    busy = sum(end - start for start, end in busy_intervals) / 1e3
    span = (busy_intervals[-1][1] - busy_intervals[0][0]) / 1e3
    return dict(busy_ms=busy, span_ms=span, events_overhead=(events_ms - busy) / busy,
                span_overhead=(span - busy) / busy)


def _events_ms(replay, replays: int) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        replay()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / replays


def _profiled_busy(replay) -> list[tuple[float, float]]:
    from mamba_edu.profiling.bubbles import analyze_trace
    from mamba_edu.profiling.traces import FORWARD_RANGE, record_trace
    with tempfile.TemporaryDirectory() as tmp:
        rec = record_trace(lambda: replay(), tmp, "replay")
        return analyze_trace(rec.chrome_trace, FORWARD_RANGE).gpu_busy


def _capture(model, lengths, mode: str):
    from mamba_edu.benchmarks.timing import Prefills
    from mamba_edu.engine import Engine
    from mamba_edu.engine import Bucket
    prefills = Prefills(Engine(model, "fused", max_requests=len(lengths)), tuple(lengths), 0)
    captured = prefills.engine.capture_prefill(Bucket(sum(lengths), len(lengths)), mode)
    prefills.forward(prefills.next(), replay=captured.replay)  # fills the static buffers
    return prefills, captured.graph.replay


def measure(rounds: int = 3, replays: int = 50) -> list[dict]:
    from mamba_edu.benchmarks.common import sm_clock_mhz
    from mamba_edu.model import build_model
    from mamba_edu.model.config import get_config
    vocab = get_config(PRESET).vocab // VOCAB_SHARDS
    model = build_model(PRESET, device="cuda", dtype=torch.bfloat16, vocab=vocab)
    rows, live = [], []
    for lengths in CASES:
        for mode in MODES:
            prefills, replay = _capture(model, lengths, mode)
            for _ in range(3):
                replay()
            rows.append(dict(case=f"{PRESET} {len(lengths)}x{lengths[0]}", mode=mode,
                             strategy="fused", vocab=vocab, rounds=[]))
            live.append((prefills, replay))
    for r in range(rounds):
        order = list(range(len(rows)))
        order = order[r % len(order):] + order[:r % len(order)]
        for i in order:
            replay = live[i][1]
            events = _events_ms(replay, replays)
            busy = _profiled_busy(replay)
            rows[i]["rounds"].append(overheads(events, busy) | dict(events_ms=events,
                                                                     sm_mhz=sm_clock_mhz()))
    for row in rows:
        for key in ("events_ms", "busy_ms", "span_ms", "events_overhead", "span_overhead"):
            values = [x[key] for x in row["rounds"]]
            row[key] = statistics.median(values)
            row[key + "_spread"] = max(values) - min(values)
    for prefills, _ in live:
        prefills.close()
    return rows


def main(argv=None) -> int:
    from mamba_edu.benchmarks.common import OUT, commit_hash, package_versions, say_where
    parser = argparse.ArgumentParser(prog="python -m mamba_edu.benchmarks.replay",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT / "bench" / "replay.json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replays", type=int, default=50)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    say_where(args.out)
    rows = measure(args.rounds, args.replays)
    versions = package_versions()
    meta = dict(commit=commit_hash(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                device=torch.cuda.get_device_name(), torch=versions["torch"],
                triton=versions["triton"], rounds=args.rounds, replays=args.replays,
                instrument="events: CUDA events around back-to-back replays; busy and span: one "
                           "profiled replay of the same capture")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    for row in rows:
        print(f"{row['case']:<22} {row['mode']:<10} events {row['events_ms']:.4f} ms  busy "
              f"{row['busy_ms']:.4f}  events overhead {100 * row['events_overhead']:.1f} %  span "
              f"overhead {100 * row['span_overhead']:.1f} %")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
