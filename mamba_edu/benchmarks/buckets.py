"""Prefill time on fresh batches, eager and replayed from a captured token bucket:
``python -m mamba_edu bench-buckets --out DIR`` (a CUDA GPU).

A server never replays the batch it captured: each forward is a new batch, copied into the
bucket's static buffers before the replay (:mod:`mamba_edu.engine.bucket`). So every repeat here
draws **new lengths** within the bucket (1 to ``max_requests`` requests, together between half
and all of ``max_tokens`` tokens, new random tokens), and the time of a replay includes that host
refill. The arms, each on the same sequence of batches:

* ``eager`` — ``engine.forward_prefill``, per strategy;
* ``breakable`` — SGLang today: graph pieces, every attention core an eager break, the LM head
  an eager tail; per strategy;
* ``gdn_inside`` — the same with the GDN layers inside the pieces (fixed-capacity metadata);
  ``sync_free`` and ``fused``;
* ``graph`` — the whole forward in one bucket graph; ``sync_free`` and ``fused``.

These run our Triton prefill kernel. ``--prefill-kernels triton,fla`` adds the arms of the case
that SGLang's fallback kernel can run (:mod:`mamba_edu.serving.fla_prefill`: ``eager`` and
``breakable``, not ``fused``); each row names its kernel (``prefill_kernel``).

Arms alternate within every round (their order rotated from round to round); each arm runs the
round's batches once untimed, then timed, as a server that has run a while (Triton compiles a
kernel per specialisation of its int arguments, and a fresh length can need a new one). Each row
keeps the median of every round, the median over rounds and their spread, and the SM clock read after each
round, the host time (until the call returned) and the Triton compilations while timed (0 in a
fair run). Once per arm, one forward is profiled and its trace kept (``runs/<case>/``): GPU busy
time, the forward's span, the idle time per break, and the kernels it launched (for eager arms,
host time per kernel); and one refill + replay runs under ``torch.cuda.set_sync_debug_mode
("error")`` (``sync_free`` / ``fused``). The sweep fixes the batches (one request of 384 to 512
tokens) and grows the bucket: padding waste against the graph's gain.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from mamba_edu.engine import Bucket

# Plain data, no torch: the cases are read by --help's parser, notebook 12 and its tests, and
# importing mamba_edu.engine imports torch (seconds). tests/benchmarks/test_bench_buckets.py checks
# that these names are the engine's and the serving layer's.
STRATEGIES = ("naive", "precomputed", "sync_free", "fused")
CAPTURE_MODES = ("breakable", "gdn_inside", "graph")
#: What fla's prefill can run (fla_prefill.check_prefill_kernel and the engine's check_capture
#: refuse the rest): no ``fused`` (its tracking is inside our kernel), no GDN inside a graph.
FLA_STRATEGIES = ("naive", "precomputed", "sync_free")
FLA_MODES = ("eager", "breakable")


@dataclass(frozen=True)
class BucketCase:
    """A preset and a bucket (``max_tokens``, ``max_requests``); ``batch_tokens``: every batch
    is one request of that many tokens (the sweep), else any batch that fits the bucket."""

    name: str
    preset: str
    max_tokens: int
    max_requests: int
    batch_tokens: tuple[int, int] | None = None  # one request of this many tokens (the sweep)

    @property
    def bucket(self) -> Bucket:
        """The engine's :class:`~mamba_edu.engine.Bucket` of this case (imports the engine)."""
        from mamba_edu.engine import Bucket

        return Bucket(self.max_tokens, self.max_requests)


CASES = [
    BucketCase("launch_bound_512x1", "qwen3.5-tp8", 512, 1),
    BucketCase("launch_bound_4096x16", "qwen3.5-tp8", 4096, 16),
    BucketCase("gpu_bound_8192x8", "qwen3-next", 8192, 8),
    # The arms that do not fit beside the first set's, each set with fused eager as its baseline.
    BucketCase("gpu_bound_8192x8_rest", "qwen3-next", 8192, 8),
]
SWEEP = [BucketCase(f"sweep_{t}", "qwen3.5-tp8", t, 1, batch_tokens=(384, 512))
         for t in (512, 1024, 2048, 4096, 8192)]


def draw_lengths(case: BucketCase, gen: torch.Generator) -> tuple[int, ...]:
    """A fresh batch for ``case``: 1..max_requests requests, max_tokens/2..max_tokens tokens."""
    import torch

    def randint(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))
    if case.batch_tokens is not None:
        return (randint(*case.batch_tokens),)
    n = randint(1, case.max_requests)
    total = randint(max(n, case.max_tokens // 2), case.max_tokens)
    cuts = sorted(torch.randperm(total - 1, generator=gen)[:n - 1].add(1).tolist())
    return tuple(e - s for s, e in zip([0, *cuts], [*cuts, total]))


def arms(case: BucketCase, kernels=("triton",)) -> list[tuple[str, str, str]]:
    """The case's arms, ``(strategy, mode, prefill_kernel)``: ours, then for each other kernel
    those of ours it can run (none in the sweep, which is ``fused`` only)."""
    ours = triton_arms(case)
    return ([(s, m, "triton") for s, m in ours]
            + [(s, m, k) for k in kernels if k != "triton"
               for s, m in ours if s in FLA_STRATEGIES and m in FLA_MODES])


def triton_arms(case: BucketCase) -> list[tuple[str, str]]:
    if case.batch_tokens is not None:  # the sweep: the fastest eager and graph arms only
        return [("fused", "eager"), ("fused", "gdn_inside"), ("fused", "graph")]
    out = [(s, "eager") for s in STRATEGIES] + [(s, "breakable") for s in STRATEGIES]
    # At 8192 tokens the twelve arms do not fit on one GPU beside each other (the whole-forward
    # graph's masked attention over the bucket alone is O(max_tokens²)), so they run as two sets.
    if case.name.endswith("_rest"):
        return [("fused", "eager"), ("precomputed", "breakable"), ("sync_free", "breakable"),
                ("sync_free", "graph"), ("fused", "graph")]
    if case.max_tokens > 4096:
        return out[:4] + [("naive", "breakable"), ("fused", "breakable"),
                          ("sync_free", "gdn_inside"), ("fused", "gdn_inside")]
    return out + [(s, m) for m in ("gdn_inside", "graph") for s in ("sync_free", "fused")]


class Arm:
    """One (strategy, mode, prefill kernel) on one model: its engine, its capture, its batches."""

    def __init__(self, model, case: BucketCase, strategy: str, mode: str, kernel: str = "triton"):
        from mamba_edu.benchmarks.timing import Prefills
        from mamba_edu.engine import Engine

        self.case, self.strategy, self.mode, self.kernel = case, strategy, mode, kernel
        engine = Engine(model, strategy, max_requests=case.max_requests, cache_slots=2,
                        prefill_kernel=kernel)
        self.prefills = Prefills(engine, lambda gen: draw_lengths(case, gen), 0)
        self.captured = None if mode == "eager" else engine.capture_prefill(case.bucket, mode)
        self.replay = None if self.captured is None else self.captured.replay

    def reseed(self, seed: int) -> None:
        self.prefills.gen.manual_seed(seed)

    def time_ms(self, repeats: int) -> tuple[list[float], list[float]]:
        """Wall and host times (ms) of ``repeats`` fresh batches; host: until the call returned."""
        from mamba_edu.benchmarks.timing import timed_calls
        return timed_calls(lambda b: self.prefills.forward(b, replay=self.replay),
                           self.prefills.next, repeats)

    @property
    def label(self) -> str:
        ours = f"{self.strategy}_{self.mode}"  # the trace's name: fla's beside ours
        return ours if self.kernel == "triton" else f"{self.kernel}_{ours}"

    def profile(self, trace_dir: Path) -> dict:
        """One profiled forward, its trace kept in ``trace_dir``: busy, span (first to last
        kernel), idle per break (ms, µs) and the kernels it ran."""
        from mamba_edu.profiling.bubbles import (analyze_trace, forward_range, forward_window,
                                                 load_trace, trace_events)
        from mamba_edu.profiling.traces import FORWARD_RANGE, record_trace
        # The profiled batch's lengths run once unprofiled first: cuDNN's attention builds a plan
        # for each new length (tens of ms), which a server that has run a while has cached.
        self.reseed(777)
        self.time_ms(1)
        self.reseed(777)
        with tempfile.TemporaryDirectory() as tmp:
            rec = record_trace(lambda b: self.prefills.forward(b, replay=self.replay), tmp, "bucket",
                               setup=self.prefills.next)
            trace_dir.mkdir(parents=True, exist_ok=True)
            kept = trace_dir / f"{self.label}.pt.trace.json.gz"
            shutil.copyfile(rec.chrome_trace, kept)  # gzipped already
        trace = load_trace(kept)  # read once: the kernels counted here, the rest analysed
        events = trace_events(trace)
        _, _, gpu = forward_window(events, forward_range(events, FORWARD_RANGE))
        a = analyze_trace(trace, FORWARD_RANGE)
        busy = a.gpu_busy_us
        span = a.gpu_busy[-1][1] - a.gpu_busy[0][0] if a.gpu_busy else 0.0
        pieces = self.captured.pieces if self.captured is not None else None
        breaks = len(pieces.breaks) if pieces is not None and hasattr(pieces, "breaks") else 0
        return dict(gpu_busy_ms=busy / 1e3, span_ms=span / 1e3, idle_ms=(span - busy) / 1e3,
                    breaks=breaks, idle_per_break_us=(span - busy) / breaks if breaks else None,
                    kernels=sum(e.cat == "kernel" for e in gpu), lead_ms=a.lead_us / 1e3)

    def syncs_ok(self) -> bool:
        from mamba_edu.profiling.syncs import cuda_sync_guard
        batch = self.prefills.next()
        with cuda_sync_guard(raise_on_sync=False) as guard:
            self.prefills.forward(batch, replay=self.replay)
        return bool(guard.passed)

    def close(self) -> None:
        self.prefills.close()


class CompileCounter:
    """Counts Triton compilations while it is on: a timed forward that compiles a new
    specialisation of a kernel (an int argument newly divisible by 16, say) is not a fair time."""

    def __init__(self):
        self.count = 0

    def __enter__(self):
        from triton import knobs
        self._before = knobs.runtime.jit_post_compile_hook
        knobs.runtime.jit_post_compile_hook = self._seen
        return self

    def _seen(self, *args, **kwargs):
        self.count += 1
        return self._before(*args, **kwargs) if self._before is not None else None

    def __exit__(self, *exc):
        from triton import knobs
        knobs.runtime.jit_post_compile_hook = self._before


def run_case(model, case: BucketCase, rounds: int, repeats: int, warmup: int, log,
             trace_dir: Path, kernels=("triton",)) -> list[dict]:
    from mamba_edu.benchmarks.common import sm_clock_mhz
    live = [Arm(model, case, s, m, k) for s, m, k in arms(case, kernels)]
    rows = [dict(case=case.name, preset=case.preset, max_tokens=case.max_tokens,
                 max_requests=case.max_requests, strategy=a.strategy, mode=a.mode,
                 prefill_kernel=a.kernel,
                 round_ms=[], round_host_ms=[], repeat_ms=[], sm_mhz=[], compiles_while_timed=0)
            for a in live]
    for arm in live:  # warm-up: Triton compiles a kernel per specialisation of its int arguments
        arm.reseed(12345)
        arm.time_ms(warmup)
    for r in range(rounds):
        order = list(range(len(live)))
        order = order[r % len(order):] + order[:r % len(order)]
        for i in order:
            live[i].reseed(1000 + r)  # every arm sees the same batches in a round,
            live[i].time_ms(repeats)  # once untimed: new Triton specialisations and cuDNN plans here
            live[i].reseed(1000 + r)
            with CompileCounter() as compiles:
                times, host = live[i].time_ms(repeats)
            rows[i]["compiles_while_timed"] += compiles.count
            rows[i]["repeat_ms"].append(times)
            rows[i]["round_ms"].append(statistics.median(times))
            rows[i]["round_host_ms"].append(statistics.median(host))
            rows[i]["sm_mhz"].append(sm_clock_mhz())
    for arm, row in zip(live, rows):
        row["ttft_ms"] = statistics.median(row["round_ms"])
        row["spread_ms"] = max(row["round_ms"]) - min(row["round_ms"])
        row["host_ms"] = statistics.median(row["round_host_ms"])
        if case.batch_tokens is None:
            row.update(arm.profile(trace_dir / case.name))
            if arm.mode == "eager":  # the host's cost per launched kernel, when it is the bottleneck
                row["host_us_per_kernel"] = 1e3 * row["host_ms"] / row["kernels"]
            if arm.strategy in ("sync_free", "fused") and arm.mode != "breakable":
                row["no_sync_with_refill"] = arm.syncs_ok()
        log(f"{case.name:<22} {arm.kernel:<7} {arm.strategy:<12} {arm.mode:<10} {row['ttft_ms']:9.3f} ms "
            f"± {row['spread_ms']:.3f}" + (f"  idle/break {row['idle_per_break_us']:.0f} µs"
                                            if row.get("idle_per_break_us") else ""))
        arm.close()
    eager = {(r["prefill_kernel"], r["strategy"]): r["ttft_ms"] for r in rows if r["mode"] == "eager"}
    for row in rows:  # against the eager arm of the same strategy and kernel
        base = eager.get((row["prefill_kernel"], row["strategy"]))
        row["vs_eager_same_strategy"] = base / row["ttft_ms"] if base else None
    return rows


#: The arms drawn in a case's timeline figure, in this order, where the case ran them.
TIMELINE_ARMS = [(s, "eager") for s in STRATEGIES] + [("fused", m) for m in CAPTURE_MODES]


def make_timelines(out: Path, cases: list[str]) -> list[Path]:
    """One figure per case from its kept traces (``runs/<case>/``): a row per arm of
    :data:`TIMELINE_ARMS`, each from its profiled forward. Returns the paths written."""
    import matplotlib.pyplot as plt

    from mamba_edu.profiling.bubbles import analyze_trace
    from mamba_edu.profiling.plots import plot_timelines
    from mamba_edu.profiling.traces import FORWARD_RANGE
    written = []
    for case in cases:
        traces = [(f"{s} {m}", out / "runs" / case / f"{s}_{m}.pt.trace.json.gz")
                  for s, m in TIMELINE_ARMS]
        analyses = [analyze_trace(p, FORWARD_RANGE, label=label) for label, p in traces if p.exists()]
        if analyses:
            written.append(out / f"timeline_{case}.png")
            plt.close(plot_timelines(analyses, written[-1],
                                     title=f"{case}: one profiled forward per arm, a fresh batch"))
    return written


def checked_kernels(parser: argparse.ArgumentParser, text: str) -> tuple[str, ...]:
    """``--prefill-kernels``, each one this machine can run (fla: CUDA and fla-core importable),
    or a usage error of one line. Ours always run: the others' arms are compared to them."""
    import torch

    from mamba_edu.serving import fla_prefill
    device = "cuda" if torch.cuda.is_available() else "cpu"
    kernels = tuple(dict.fromkeys(["triton", *text.split(",")]))
    for kernel in kernels:
        try:  # sync_free: a strategy every kernel runs (arms() leaves out what one cannot)
            fla_prefill.check_prefill_kernel(kernel, "sync_free", device)
        except (ValueError, RuntimeError) as error:
            parser.error(f"--prefill-kernels: {error}")
    return kernels


def main(argv=None) -> int:
    from mamba_edu.benchmarks.common import OUT, commit_hash, package_versions, say_where
    parser = argparse.ArgumentParser(prog="python -m mamba_edu bench-buckets",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT / "bench" / "buckets")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10, help="fresh batches per arm and round")
    parser.add_argument("--warmup", type=int, default=8, help="fresh batches per arm before timing")
    parser.add_argument("--cases", default="all", help="comma-separated case names, 'sweep' (the bucket sweep) or 'all'")
    parser.add_argument("--prefill-kernels", default="triton",
                        help="comma-separated GDN prefill kernels: triton (ours, always run), fla "
                             "(SGLang's fallback: adds the eager and breakable arms of naive, "
                             "precomputed and sync_free; needs fla-core 0.6.0)")
    args = parser.parse_args(argv)
    every = {c.name: c for c in CASES + SWEEP}
    names = args.cases.replace("all", ",".join(c.name for c in CASES) + ",sweep").split(",")
    unknown = sorted(set(names) - set(every) - {"sweep"})
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(every)}, sweep, all")
    kernels = checked_kernels(parser, args.prefill_kernels)
    import torch  # after the arguments: --help answers at once

    from mamba_edu.model import build_model

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (CUDA graphs)")
    chosen = [c for name in names for c in (SWEEP if name == "sweep" else [every[name]])]
    say_where(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    lines = []

    def log(line):
        print(line, flush=True)
        lines.append(line)

    versions = package_versions()
    meta = dict(commit=commit_hash(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                device=torch.cuda.get_device_name(), torch=versions["torch"], triton=versions["triton"],
                rounds=args.rounds, repeats=args.repeats, warmup=args.warmup, dtype="bfloat16",
                prefill_kernels=list(kernels),
                instrument="wall time of one synchronized forward (refill + replay for captured "
                           "arms), median of the repeats in a round; busy/span from one profiled forward",
                note="random weights; a dense MLP stands in for the mixture of experts")
    rows, models = [], {}
    for case in chosen:  # the results are written after every case: a later failure keeps them
        if case.preset not in models:
            models.clear()
            models[case.preset] = build_model(case.preset, device="cuda", dtype=torch.bfloat16)
        rows += run_case(models[case.preset], case, args.rounds, args.repeats, args.warmup, log,
                         args.out / "runs", kernels)
        gc.collect()  # a static bucket and its batch refer to each other: free the graphs now
        torch.cuda.empty_cache()
        (args.out / "results.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
        (args.out / "bench.log").write_text("\n".join(lines) + "\n")
    make_timelines(args.out, [c.name for c in chosen if c.batch_tokens is None])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
