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
* **speedup** over ``naive`` in the same case;
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
import csv
import gc
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path
from typing import Callable

import matplotlib.pyplot as plt
import torch
from tqdm import tqdm

from mamba_edu.profiling.bubbles import analyze_trace
from mamba_edu.profiling.plots import plot_strategy_bars, plot_sweep, plot_timelines
from mamba_edu.profiling.syncs import count_syncs, cuda_sync_guard
from mamba_edu.benchmarks.timing import Prefills, timed_calls
from mamba_edu.profiling.traces import FORWARD_RANGE, record_trace, trim_trace
from mamba_edu.serving import STRATEGIES
from mamba_edu.serving.bucket import CAPTURE_MODES, Bucket

CAPTURABLE = tuple(name for name, cls in STRATEGIES.items() if cls.capturable)
SWEEP_TOKENS = (512, 1024, 2048, 4096, 8192, 16384)
SWEEP_TRACKED = (0.0, 0.5, 1.0)
SWEEP_PRESET = "qwen3-next"
CPU_PRESET = "tiny"
TRIM_CPU_US = 2.0  # committed traces drop CPU ops shorter than this (views, reshapes)
MOE_NOTE = "a dense MLP of the active-expert width stands in for the mixture of experts"


@dataclass(frozen=True)
class Case:
    """A batch to prefill: a preset and prompt lengths; ``group`` is headline or a sweep's name.

    Tracking follows docs/conventions.md: a request is tracked iff its length ≥ ``cache_chunk``. The
    tracked-fraction sweep uses that: with ``cache_chunk = 1024`` a 1024-token prompt is tracked
    and a 1023-token one is not, at the same cost otherwise.
    """

    name: str
    preset: str
    lengths: tuple[int, ...]
    group: str = "headline"
    cache_chunk: int = 64
    x: float = 0.0  # the sweep's x value (total tokens or tracked fraction)

    @property
    def shape(self) -> str:
        """``8x1024``, or ``8x~1024`` for mixed lengths of at most 1024."""
        sizes = set(self.lengths)
        return f"{len(self.lengths)}x{'' if len(sizes) == 1 else '~'}{max(sizes)}"

    @property
    def tracked(self) -> int:
        return sum(n >= self.cache_chunk for n in self.lengths)


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


@dataclass
class Result:
    """One row of results.json / results.csv. GPU-only fields are ``None`` on a CPU."""

    case: str
    group: str
    x: float
    preset: str
    shape: str
    requests: int
    tokens: int
    tracked: int
    strategy: str
    mode: str                        # "eager" or a capture mode (see Engine.capture_prefill)
    repeats: int = 0
    ttft_ms: float | None = None     # median
    ttft_min_ms: float | None = None
    syncs: int | None = None         # sniffer: ops that synchronize, per forward
    trace_syncs: int | None = None   # host waits in the GPU trace
    sync_guard: bool | None = None   # passed torch.cuda.set_sync_debug_mode("error")
    gpu_busy_ms: float | None = None
    idle_fraction: float | None = None
    speedup: float | None = None     # naive eager TTFT / this TTFT, same case
    host_ms: float | None = None     # median time until the call returned (launches, no sync)
    error: str | None = None         # why this measurement failed
    started_utc: str | None = None   # when its timing began (to match GPU clock logs)

    @property
    def label(self) -> str:
        return self.strategy if self.mode == "eager" else f"{self.strategy}+{self.mode}"

    @classmethod
    def of(cls, case: Case, preset: str, strategy: str, mode: str, **measured):
        """A row of ``case`` on ``preset``, its measured fields from ``measured`` (None if not)."""
        return cls(case.name, case.group, case.x, preset, case.shape, len(case.lengths),
                   sum(case.lengths), case.tracked, strategy, mode, **measured)


class ModelBench:
    """One model and its engines, one per (strategy, cache chunk), reused across cases."""

    def __init__(self, model, max_requests: int):
        self.model, self.max_requests = model, max_requests
        self.engines: dict[tuple[str, int], object] = {}

    def engine(self, strategy: str, cache_chunk: int):
        from mamba_edu.engine import Engine

        key = (strategy, cache_chunk)
        if key not in self.engines:
            self.engines[key] = Engine(self.model, strategy, max_requests=self.max_requests,
                                       cache_chunk=cache_chunk)
        return self.engines[key]


def measure(bench: ModelBench, case: Case, preset: str, strategy: str, mode: str, args,
            trace_dir: Path | None, barrier: Callable[[], None] | None = None) -> Result:
    """All numbers of one (case, strategy, mode); ``trace_dir`` keeps its trimmed trace.

    A capture mode captures one bucket of the case's size; each timed repeat replays it on a
    freshly prepared batch, the host refill included.

    ``barrier`` (tensor-parallel ranks, :mod:`mamba_edu.benchmarks.ttft_tp`): called before the
    capture and before each timed forward, so that the ranks start together; and a failure is
    raised instead of recorded, since the other ranks wait for this one in a collective.
    """
    row = Result.of(case, preset, strategy, mode, repeats=args.repeats)
    prefills = Prefills(bench.engine(strategy, case.cache_chunk), case.lengths, args.seed)
    forward, setup = prefills.forward, prefills.next
    try:
        if mode != "eager":
            batch = prefills.next()  # one replay before the warm-up: the capture's own check
            if barrier is not None:
                barrier()
            captured = prefills.engine.capture_prefill(Bucket(sum(case.lengths), len(case.lengths)), mode)
            forward = partial(prefills.forward, replay=captured.replay)
            forward(batch)
        for _ in range(args.warmup):
            forward(setup())
        row.started_utc = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        times, host = timed_calls(forward, setup if barrier is None else _then(setup, barrier),
                                  args.repeats)
        row.ttft_ms, row.ttft_min_ms = statistics.median(times), min(times)
        row.host_ms = statistics.median(host)
        arg = setup()
        with count_syncs() as sniffed:
            forward(arg)
        row.syncs = sniffed.count
        arg = setup()
        with cuda_sync_guard(raise_on_sync=False) as guard:
            forward(arg)
        row.sync_guard = guard.passed
        if guard.passed is False:
            forward(arg)  # the guard stopped this forward at its first sync: complete the batch
        if not args.no_profile:
            profile_into(row, forward, setup, trace_dir)
    except Exception as err:  # one failing strategy must not lose the rest of a GPU run
        if barrier is not None:
            raise
        row.error = f"{type(err).__name__}: {err}"
        tqdm.write(f"{case.name} {row.label}: {row.error}")
        bench.engines.pop((strategy, case.cache_chunk))  # the next measurement gets a fresh engine
    finally:
        prefills.close()
    return row


def _then(setup: Callable[[], object], after: Callable[[], None]) -> Callable[[], object]:
    """``setup`` followed by ``after`` (returning what ``setup`` returned)."""
    def both():
        arg = setup()
        after()
        return arg
    return both


def trace_name(row: Result) -> str:
    """File stem of a row's trace, also its worker name in TensorBoard."""
    return row.label.replace("+", "_")


def profile_into(row: Result, forward, setup, trace_dir: Path | None) -> None:
    """Record one forward, fill the trace-based fields of ``row`` and keep the trimmed trace."""
    with tempfile.TemporaryDirectory() as tmp:
        rec = record_trace(forward, tmp, trace_name(row), setup=setup)
        analysis = analyze_trace(rec.chrome_trace, FORWARD_RANGE, label=row.label)
        if trace_dir is not None:
            trim_trace(rec.chrome_trace, trace_dir / f"{trace_name(row)}.pt.trace.json.gz",
                       min_cpu_us=TRIM_CPU_US)
    if analysis.has_gpu:  # a CPU forward (also --device cpu on a GPU machine) has no GPU lane
        row.gpu_busy_ms = analysis.gpu_busy_us / 1e3
        row.idle_fraction = analysis.idle_fraction
        row.trace_syncs = analysis.n_syncs


def run_case(bench: ModelBench, case: Case, preset: str, args, bar: tqdm,
             runs: Path | None = None, barrier: Callable[[], None] | None = None) -> list[Result]:
    """Every requested strategy (eager, then captured in the modes it allows) on one case.
    Headline cases keep their traces in ``runs/<case>/`` (default ``args.out/runs``);
    ``barrier``: see :func:`measure`."""
    runs = args.out / "runs" if runs is None else runs
    trace_dir = runs / case.name if case.group == "headline" else None
    rows = []
    for strategy in args.strategies:
        for mode in modes(strategy, args.graphs):
            bar.set_postfix_str(f"{case.name} {strategy} {mode}")
            rows.append(measure(bench, case, preset, strategy, mode, args, trace_dir, barrier))
            bar.update()
    naive = next((r.ttft_ms for r in rows if r.label == "naive"), None)
    for r in rows:
        r.speedup = naive / r.ttft_ms if naive and r.ttft_ms else None
    # Each engine owns a state pool and each capture a graph memory pool: keeping them across
    # cases ran the H200 out of memory in the sweeps, so every case starts from a clean device.
    bench.engines.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def modes(strategy: str, graphs: bool) -> list[str]:
    if not graphs:
        return ["eager"]
    return ["eager", *CAPTURE_MODES] if strategy in CAPTURABLE else ["eager", "breakable"]


def preset_for(case: Case, device: torch.device, preset: str | None = None) -> str:
    """``preset`` when given (``--preset``), else the case's own on a GPU, :data:`CPU_PRESET` on a
    CPU."""
    return preset or (case.preset if device.type == "cuda" else CPU_PRESET)


def make_benches(cases: list[Case], device, dtype, forced: str | None = None, seed: int = 0,
                 build: Callable | None = None) -> dict[str, ModelBench]:
    """One bench per preset, its model built once (``build(preset, device=, dtype=, seed=)``,
    default :func:`~mamba_edu.model.build_model`) and sized for the largest batch of its cases."""
    from mamba_edu.model import build_model

    build = build_model if build is None else build
    benches = {}
    for preset in dict.fromkeys(preset_for(c, device, forced) for c in cases):
        largest = max(len(c.lengths) for c in cases if preset_for(c, device, forced) == preset)
        benches[preset] = ModelBench(build(preset, device=device, dtype=dtype, seed=seed), largest)
    return benches


def write_results(rows: list[Result], out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({**meta, "results": [asdict(r) for r in rows]},
                                                 indent=1))
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[fl.name for fl in fields(rows[0] if rows else Result)])
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


RENAMED_KEYS = {"bubble_fraction": "idle_fraction"}  # results written before the rename


def load_results(out: Path) -> list[Result]:
    """The rows of ``out/results.json``, e.g. measured on a GPU and drawn elsewhere (also files
    written before a field was renamed, see :data:`RENAMED_KEYS`)."""
    rows = json.loads((out / "results.json").read_text())["results"]
    return [Result(**{RENAMED_KEYS.get(key, key): value for key, value in row.items()}) for row in rows]


def make_figures(rows: list[Result], out: Path) -> list[Path]:
    """Per headline case a timeline (one row per strategy, from its trimmed trace) and bars; per
    sweep TTFT against its x value. Failed measurements are left out. Returns the paths."""
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
    """A compact fixed-width table: one line per measurement."""
    def cell(value, fmt, width):
        return f"{'-' if value is None else format(value, fmt):>{width}}"

    lines = [f"{'case':<22}{'strategy':<18}{'TTFT ms':>9}{'busy ms':>9}{'idle %':>8}"
             f"{'syncs':>7}{'trace':>7}{'speedup':>9}{'host ms':>9}"]
    for r in rows:
        idle = None if r.idle_fraction is None else 100 * r.idle_fraction
        line = (f"{r.case:<22}{r.label:<18}{cell(r.ttft_ms, '.2f', 9)}{cell(r.gpu_busy_ms, '.2f', 9)}"
                f"{cell(idle, '.1f', 8)}{cell(r.syncs, 'd', 7)}{cell(r.trace_syncs, 'd', 7)}"
                f"{cell(r.speedup, '.2f', 9)}{cell(r.host_ms, '.2f', 9)}")
        lines.append(line + (f"  FAILED {r.error[:60]}" if r.error else ""))
    return "\n".join(lines)


DTYPES = ("auto", "float32", "bfloat16", "float16")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The bench's options (shared by ``mamba-edu bench`` and ``python -m
    mamba_edu.benchmarks.ttft``); the values are checked by :func:`check_args`."""
    from mamba_edu._cli import DEVICES, non_negative_int, positive_float, positive_int, seed_int
    from mamba_edu.model.config import PRESETS

    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where to run; auto = cuda when a GPU is visible, else cpu")
    p.add_argument("--preset", choices=["auto", *PRESETS], default="auto",
                   help=f"model preset of every case; auto = each case's own on a GPU, "
                        f"{CPU_PRESET} on a CPU")
    p.add_argument("--out", type=Path, default=Path("out/bench"), help="output folder")
    p.add_argument("--cases", default="auto",
                   help="comma-separated case names or groups: all, headline, tokens, tracked; "
                        "auto = all on a GPU, headline on a CPU")
    p.add_argument("--strategies", default=",".join(STRATEGIES),
                   help=f"comma-separated, from {', '.join(STRATEGIES)}")
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
    args.device = resolve_device(p, args.device)
    cuda = args.device.type == "cuda"
    check_out_dir(p, args.out)
    args.strategies = [s for s in args.strategies.split(",") if s]
    if unknown := sorted(set(args.strategies) - set(STRATEGIES)):
        p.error(f"unknown --strategies {unknown}; choose from {', '.join(STRATEGIES)}")
    if not args.strategies:
        p.error(f"--strategies is empty; choose from {', '.join(STRATEGIES)}")
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


def run_meta(args: argparse.Namespace) -> dict:
    """What results.json says about the run besides its rows (``skipped``: cases cut by the time
    limit, filled in as the run goes)."""
    return {"device": torch.cuda.get_device_name() if args.device.type == "cuda" else "cpu",
            "torch": torch.__version__, "dtype": args.dtype, "quick": args.quick,
            "repeats": args.repeats, "note": MOE_NOTE,
            "ttft": "median wall time of one synchronized prefill forward",
            "created": time.strftime("%Y-%m-%d %H:%M:%S"), "skipped": []}


def run(args: argparse.Namespace) -> int:
    """The bench on checked arguments (:func:`check_args`): 0 when every measurement succeeded,
    1 when one failed (its row says why)."""
    if args.tp > 1:
        from mamba_edu.benchmarks.ttft_tp import run_tp

        return run_tp(args)
    if args.replot:
        rows = load_results(args.out)
        make_figures(rows, args.out)
        print(format_table(rows))
        return 0
    started = time.monotonic()
    device, cases = args.device, args.case_list
    if device.type == "cpu":
        why = "--device cpu" if torch.cuda.is_available() else "No GPU"
        print(f"{why}: every case runs the {args.preset or CPU_PRESET!r} preset on the CPU. Sync counts are real; "
              "TTFT is CPU time, and GPU bubbles and CUDA graphs need a GPU.", flush=True)
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
