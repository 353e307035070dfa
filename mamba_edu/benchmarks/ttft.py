"""Time to first token, GPU bubbles and syncs per tracking strategy: ``python -m mamba_edu bench``.

For every case (a model preset and a batch of prompt lengths) and every strategy, in one run on
one machine:

* **TTFT** — median wall time of one synchronized prefill forward
  (``engine.forward_prefill``), each repeat on a freshly prepared batch, so it starts from the
  same pool state; and **host time**, the median time until the call returned (the launches,
  before the synchronize): when it is close to TTFT, the forward is launch-bound;
* **syncs per forward** — counted by the sniffer (:func:`mamba_edu.profiling.count_syncs`), and on
  a GPU also read from the trace (``cudaStreamSynchronize`` and friends);
* **GPU busy time and idle fraction** — from one forward recorded with ``torch.profiler``;
* **speedup** over ``naive`` in the same case, on a GPU (on a CPU the strategies cannot differ in
  time: nothing waits for a device);
* on a GPU, the same prefill **captured** for a token bucket the size of the case
  (:meth:`Engine.capture_prefill <mamba_edu.engine.Engine.capture_prefill>`) and replayed on each
  repeat's fresh batch, the host refill of the static buffers included: ``breakable`` (every
  strategy: SGLang today), and for the sync-free strategies ``gdn_inside`` (the GDN layers
  inside the graph pieces) and ``graph`` (the whole forward in one graph). Fresh lengths on
  every repeat: ``python -m mamba_edu bench-buckets`` (:mod:`mamba_edu.benchmarks.buckets`).

Headline cases (docs/conventions.md): GPU-bound ``qwen3-next`` 8 × 1024 tokens; launch-bound
``qwen3.5-tp8`` 1 × 512, 16 × 256 and 8 × 1024. Sweeps: total tokens 512 … 16384 and the
fraction of tracked requests 0, ½, 1. A dense MLP stands in for the mixture of experts.

Outputs in ``--out``: ``results.json``, ``results.csv``, figures, and for the headline cases one
trimmed trace per strategy in TensorBoard's layout, ``runs/<case>/<strategy>.pt.trace.json.gz``
(also what https://ui.perfetto.dev opens). On a CPU the ``tiny`` preset runs instead: the sync
counts are real, bubbles need a GPU.

``--tp N``, under ``torchrun --nproc-per-node N``: the same on N tensor-parallel ranks, per rank
(:mod:`mamba_edu.benchmarks.ttft_tp`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mamba_edu._cli import PRESET_NAMES, STRATEGY_NAMES
from mamba_edu.benchmarks.common import (CPU_PRESET, MOE_NOTE, OUT, Case, Result, make_benches,
                                         modes, preset_for, run_case, run_meta, say_where,
                                         trace_name, write_results)

SWEEP_TOKENS = (512, 1024, 2048, 4096, 8192, 16384)
SWEEP_TRACKED = (0.0, 0.5, 1.0)
SWEEP_PRESET = "qwen3-next"


def headline_cases() -> list[Case]:
    return [
        Case("gpu_bound_8x1024", "qwen3-next", (1024,) * 8),
        Case("launch_bound_1x512", "qwen3.5-tp8", (512,)),
        Case("launch_bound_16x256", "qwen3.5-tp8", (256,) * 16),
        Case("launch_bound_8x1024", "qwen3.5-tp8", (1024,) * 8),
    ]


def sweep_cases(quick: bool) -> list[Case]:
    """Total tokens in prompts of up to 1024 tokens; then 8 × 1024 with a fraction tracked."""
    tokens = SWEEP_TOKENS[::2] if quick else SWEEP_TOKENS
    cases = [Case(f"tokens_{t}", SWEEP_PRESET, (min(t, 1024),) * max(1, t // 1024), "tokens", x=t)
             for t in tokens]
    for f in SWEEP_TRACKED:
        k = round(8 * f)
        cases.append(Case(f"tracked_{f:g}", SWEEP_PRESET, (1024,) * k + (1023,) * (8 - k),
                          "tracked", cache_chunk=1024, x=f))
    return cases


def select_cases(spec: str, quick: bool) -> list[Case]:
    """``spec``: comma-separated case names or groups (``headline``, ``tokens``, ``tracked``,
    ``all``)."""
    every = headline_cases() + sweep_cases(quick)
    wanted = set(spec.split(","))
    chosen = [c for c in every if {"all", c.name, c.group} & wanted]
    unknown = wanted - {"all"} - {c.name for c in every} - {c.group for c in every}
    if unknown or not chosen:
        raise SystemExit(f"unknown --cases {sorted(unknown) or spec}; choose from "
                         f"all, headline, tokens, tracked, {', '.join(c.name for c in every)}")
    return chosen


RENAMED_KEYS = {"bubble_fraction": "idle_fraction"}  # results written before the rename


def load_results(out: Path) -> list[Result]:
    """The rows of ``out/results.json``, e.g. measured on a GPU and drawn elsewhere (also files
    written before a field was renamed, see :data:`RENAMED_KEYS`)."""
    rows = json.loads((out / "results.json").read_text())["results"]
    return [Result(**{RENAMED_KEYS.get(key, key): value for key, value in row.items()}) for row in rows]


def make_figures(rows: list[Result], out: Path) -> list[Path]:
    """Per headline case a timeline (one row per strategy, from its trimmed trace) and bars; per
    sweep TTFT against its x value. Failed measurements are left out. Returns the paths."""
    import matplotlib.pyplot as plt

    from mamba_edu.profiling.bubbles import analyze_trace
    from mamba_edu.profiling.plots import plot_strategy_bars, plot_sweep, plot_timelines
    from mamba_edu.profiling.traces import FORWARD_RANGE

    rows = [r for r in rows if r.error is None]
    written = []
    for case in dict.fromkeys(r.case for r in rows if r.group == "headline"):
        mine = [r for r in rows if r.case == case]
        title = f"{case}: {mine[0].preset}, {mine[0].shape} tokens, {mine[0].tracked} tracked"
        traces = [(r, out / "runs" / case / f"{trace_name(r)}.pt.trace.json.gz") for r in mine]
        analyses = [analyze_trace(p, FORWARD_RANGE, label=r.label) for r, p in traces if p.exists()]
        if analyses:
            written.append(out / f"timeline_{case}.png")
            plt.close(plot_timelines(analyses, written[-1], title=title))
        written.append(out / f"bars_{case}.png")
        plt.close(plot_strategy_bars([r.label for r in mine], [r.ttft_ms for r in mine],
                                     [r.gpu_busy_ms for r in mine], [r.syncs for r in mine],
                                     written[-1], title=title))
    sweeps = (("tokens", "total prompt tokens"), ("tracked", "fraction of requests tracked"))
    for group, xlabel in sweeps:
        mine = [r for r in rows if r.group == group]
        if not mine:
            continue
        series: dict[str, dict[float, float]] = {}
        for r in mine:
            series.setdefault(r.label, {})[r.x] = r.ttft_ms
        written.append(out / f"sweep_{group}.png")
        plt.close(plot_sweep(series, xlabel, "TTFT (ms, median)", written[-1],
                             log_x=group == "tokens", title=f"TTFT vs {xlabel} ({mine[0].preset})"))
    return written


def format_table(rows: list[Result]) -> str:
    """A compact fixed-width table: one line per measurement. The speedup column is left out
    where no row has one: a CPU run (see :func:`~mamba_edu.benchmarks.common.run_case`)."""
    def cell(value, fmt, width):
        return f"{'-' if value is None else format(value, fmt):>{width}}"

    speedup = any(r.speedup is not None for r in rows)
    lines = [f"{'case':<22}{'strategy':<18}{'TTFT ms':>9}{'busy ms':>9}{'idle %':>8}"
             f"{'syncs':>7}{'trace':>7}{'speedup' if speedup else '':>{9 if speedup else 0}}"
             f"{'host ms':>9}"]
    for r in rows:
        idle = None if r.idle_fraction is None else 100 * r.idle_fraction
        line = (f"{r.case:<22}{r.label:<18}{cell(r.ttft_ms, '.2f', 9)}{cell(r.gpu_busy_ms, '.2f', 9)}"
                f"{cell(idle, '.1f', 8)}{cell(r.syncs, 'd', 7)}{cell(r.trace_syncs, 'd', 7)}"
                f"{cell(r.speedup, '.2f', 9) if speedup else ''}{cell(r.host_ms, '.2f', 9)}")
        lines.append(line + (f"  FAILED {r.error[:60]}" if r.error else ""))
    return "\n".join(lines)


DTYPES = ("auto", "float32", "bfloat16", "float16")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The bench's options (shared by ``mamba-edu bench`` and ``python -m
    mamba_edu.benchmarks.ttft``); the values are checked by :func:`check_args`."""
    from mamba_edu._cli import DEVICES, non_negative_int, positive_float, positive_int, seed_int

    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where to run; auto = cuda when a GPU is visible, else cpu")
    p.add_argument("--preset", choices=["auto", *PRESET_NAMES], default="auto",
                   help=f"model preset of every case; auto = each case's own on a GPU, "
                        f"{CPU_PRESET} on a CPU")
    p.add_argument("--out", type=Path, default=OUT / "bench",
                   help="output folder (data/… replaces the committed record, and says so)")
    p.add_argument("--cases", default="auto",
                   help="comma-separated case names or groups: all, headline, tokens, tracked; "
                        "auto = all on a GPU, headline on a CPU")
    p.add_argument("--strategies", default=",".join(STRATEGY_NAMES),
                   help=f"comma-separated, from {', '.join(STRATEGY_NAMES)}")
    p.add_argument("--repeats", type=positive_int, default=10, help="timed forwards per measurement")
    p.add_argument("--warmup", type=non_negative_int, default=3, help="untimed forwards first")
    p.add_argument("--quick", action="store_true",
                   help="at most 3 repeats and 1 warm-up, every other point of the token sweep")
    p.add_argument("--no-graphs", dest="graphs", action="store_false",
                   help="skip the CUDA-graph replays (there are none on a CPU)")
    p.add_argument("--no-profile", action="store_true", help="skip the profiled runs")
    p.add_argument("--max-minutes", type=positive_float, default=None,
                   help="start no new case after this long (results so far are kept); "
                        "default: no limit")
    p.add_argument("--replot", action="store_true",
                   help="measure nothing: redraw the figures from --out/results.json and its traces")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="model dtype; auto = bfloat16 on a GPU, float32 on a CPU")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the weights and prompts")
    p.add_argument("--tp", type=positive_int, default=1, metavar="N",
                   help="tensor parallelism over N ranks, one process each, started by torchrun: "
                        "torchrun --nproc-per-node N -m mamba_edu bench --tp N (gloo on the CPU, "
                        "NCCL on N GPUs); per rank TTFT and syncs beside the 1-rank syncs, in "
                        "--out (out/bench_tpN when --out is left out; docs/tensor_parallel.md)")
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Resolve the ``auto`` values and turn every bad value into a usage error (exit 2) before
    anything is built or measured."""
    from mamba_edu._cli import check_out_dir, resolve_device
    from mamba_edu.benchmarks.ttft_tp import check_tp_args

    if args.replot:
        if args.tp > 1:
            p.error("--replot redraws a single-device run from its results.json; not with --tp")
        if not (args.out / "results.json").is_file():
            p.error(f"--replot: no results.json in {args.out} (measure first, or point --out at a "
                    "folder with one)")
        check_out_dir(p, args.out)
        return args
    say_where(args.out)
    args.device = resolve_device(p, args.device)
    cuda = args.device.type == "cuda"
    check_out_dir(p, args.out)
    args.strategies = [s for s in args.strategies.split(",") if s]
    if unknown := sorted(set(args.strategies) - set(STRATEGY_NAMES)):
        p.error(f"unknown --strategies {unknown}; choose from {', '.join(STRATEGY_NAMES)}")
    if not args.strategies:
        p.error(f"--strategies is empty; choose from {', '.join(STRATEGY_NAMES)}")
    if twice := sorted({s for s in args.strategies if args.strategies.count(s) > 1}):
        p.error(f"--strategies lists {', '.join(twice)} twice; name each strategy once")
    if args.cases == "auto":
        args.cases = "all" if cuda else "headline"
    try:
        args.case_list = select_cases(args.cases, args.quick)
    except SystemExit as err:  # select_cases says which names are known
        p.error(str(err))
    args.preset = None if args.preset == "auto" else args.preset
    if args.dtype == "auto":
        args.dtype = "bfloat16" if cuda else "float32"
    if args.quick:
        args.repeats, args.warmup = min(args.repeats, 3), min(args.warmup, 1)
    args.graphs = args.graphs and cuda
    check_tp_args(p, args)  # --tp N: torchrun's N processes, N splitting the presets
    return args


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from mamba_edu._cli import HelpFormatter, plain, prog_name

    p = argparse.ArgumentParser(prog=prog or f"{prog_name()} bench", description=plain(__doc__),
                                formatter_class=HelpFormatter)
    return add_arguments(p)


def parse_args(argv) -> argparse.Namespace:
    """Parsed and checked arguments (usage errors exit 2)."""
    p = build_parser()
    return check_args(p, p.parse_args(argv))


def main(argv=None) -> int:
    parser = build_parser()
    return run(check_args(parser, parser.parse_args(argv)))


def run(args: argparse.Namespace) -> int:
    """The bench on checked arguments (:func:`check_args`): 0 when every measurement succeeded,
    1 when one failed (its row says why)."""
    if args.tp > 1:  # a torchrun rank: run_tp ends the process
        from mamba_edu.benchmarks.ttft_tp import run_tp

        run_tp(args)
    say_where(args.out)
    if args.replot:
        rows = load_results(args.out)
        make_figures(rows, args.out)
        print(format_table(rows))
        return 0
    import torch
    from tqdm import tqdm

    started = time.monotonic()
    device, cases = args.device, args.case_list
    if device.type == "cpu":
        why = "--device cpu" if torch.cuda.is_available() else "No GPU"
        print(f"{why}: every case runs the {args.preset or CPU_PRESET!r} preset on the CPU. Sync counts are real; "
              "TTFT is CPU time (no speedup column: nothing waits for a GPU, so the strategies "
              "cannot differ), and GPU bubbles and CUDA graphs need a GPU.", flush=True)
    print(f"Note: {MOE_NOTE}.", flush=True)
    meta = run_meta(args)
    benches = make_benches(cases, device, getattr(torch, args.dtype), args.preset, args.seed)
    rows: list[Result] = []
    total = sum(len(modes(st, args.graphs)) for st in args.strategies) * len(cases)
    with tqdm(total=total, desc="bench", unit="run") as bar:
        for case in cases:  # headline cases first, so a time limit cuts the sweeps
            if args.max_minutes and time.monotonic() - started > 60 * args.max_minutes:
                meta["skipped"].append(case.name)
                continue
            preset = preset_for(case, device, args.preset)
            rows += run_case(benches[preset], case, preset, args, bar)
            write_results(rows, args.out, meta)  # a run cut short keeps what it measured
    write_results(rows, args.out, meta)
    make_figures(rows, args.out)
    print(format_table(rows))
    if meta["skipped"]:
        print(f"skipped (time limit): {', '.join(meta['skipped'])}")
    print(f"results, figures and traces in {args.out}/")
    return 0 if rows and not any(r.error for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
