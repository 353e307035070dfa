"""The benchmark harness: what the timing drivers share.

* The TTFT bench's measurement of one (case, strategy, mode) and of a whole case
  (:class:`Case`, :class:`Result`, :class:`ModelBench`, :func:`measure`, :func:`run_case`, :func:`write_results`),
  used by the single-device bench (:mod:`.ttft`) and its tensor-parallel twin (:mod:`.ttft_tp`);
  each imports this module, never the other (``ttft`` starts ``ttft_tp`` only for ``--tp N``).
* What every results file records about its run: :func:`commit_hash`, :func:`package_versions`,
  :func:`sm_clock_mhz`.
* Where results go: :data:`OUT` by default; :func:`say_where` says so in one line when a run
  writes into the repository's committed ``data/`` instead.

Heavy imports (torch, the profiler, the engine) sit inside the functions that use them, so that
``mamba-edu bench --help`` imports none of them and answers at once.
"""

from __future__ import annotations

import csv
import gc
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import argparse

    import torch

#: Every benchmark writes under this folder unless ``--out`` says otherwise.
OUT = Path("out")
CPU_PRESET = "tiny"
TRIM_CPU_US = 2.0  # committed traces drop CPU ops shorter than this (views, reshapes)
MOE_NOTE = "a dense MLP of the active-expert width stands in for the mixture of experts"


def say_where(out: Path) -> None:
    """One line before a run that writes into the repository's ``data/`` (the committed record,
    read by ``scripts/make_results.py``): what it replaces. Silent elsewhere."""
    from mamba_edu._runtime import data_dir

    data = data_dir().resolve()
    if Path(out).resolve().is_relative_to(data):
        print(f"writing into {out}: this replaces the committed record there "
              "(scripts/make_results.py reads data/; git diff shows what changed)", flush=True)


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
    from tqdm import tqdm

    from mamba_edu.benchmarks.timing import Prefills, timed_calls
    from mamba_edu.profiling.syncs import count_syncs, cuda_sync_guard
    from mamba_edu.engine import Bucket

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
    from mamba_edu.profiling.bubbles import analyze_trace
    from mamba_edu.profiling.traces import FORWARD_RANGE, record_trace, trim_trace

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


def run_case(bench: ModelBench, case: Case, preset: str, args, bar,
             runs: Path | None = None, barrier: Callable[[], None] | None = None) -> list[Result]:
    """Every requested strategy (eager, then captured in the modes it allows) on one case.
    Headline cases keep their traces in ``runs/<case>/`` (default ``args.out/runs``);
    ``barrier``: see :func:`measure`; ``bar``: a tqdm bar, one step per measurement. The
    speedup over ``naive`` eager is filled in on a GPU only: on a CPU nothing waits for a
    device, so the strategies cost the same and a ratio of their times is noise."""
    import torch

    runs = args.out / "runs" if runs is None else runs
    trace_dir = runs / case.name if case.group == "headline" else None
    rows = []
    for strategy in args.strategies:
        for mode in modes(strategy, args.graphs):
            bar.set_postfix_str(f"{case.name} {strategy} {mode}")
            rows.append(measure(bench, case, preset, strategy, mode, args, trace_dir, barrier))
            bar.update()
    naive = next((r.ttft_ms for r in rows if r.label == "naive"), None)
    on_gpu = args.device.type == "cuda"
    for r in rows:
        r.speedup = naive / r.ttft_ms if on_gpu and naive and r.ttft_ms else None
    # Each engine owns a state pool and each capture a graph memory pool: keeping them across
    # cases ran the H200 out of memory in the sweeps, so every case starts from a clean device.
    bench.engines.clear()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def modes(strategy: str, graphs: bool) -> list[str]:
    """The modes a strategy runs in: eager, then (``graphs``) the capture modes it allows."""
    from mamba_edu.serving import STRATEGIES
    from mamba_edu.engine import CAPTURE_MODES

    if not graphs:
        return ["eager"]
    return ["eager", *CAPTURE_MODES] if STRATEGIES[strategy].capturable else ["eager", "breakable"]


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
    """``results.json`` (``meta`` and the rows) and ``results.csv`` (the rows) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({**meta, "results": [asdict(r) for r in rows]},
                                                 indent=1))
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[fl.name for fl in fields(rows[0] if rows else Result)])
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)


def run_meta(args: argparse.Namespace) -> dict:
    """What results.json says about the run besides its rows (``skipped``: cases cut by the time
    limit, filled in as the run goes)."""
    import torch

    return {"device": torch.cuda.get_device_name() if args.device.type == "cuda" else "cpu",
            "torch": torch.__version__, "dtype": args.dtype, "quick": args.quick,
            "repeats": args.repeats, "note": MOE_NOTE,
            "ttft": "median wall time of one synchronized prefill forward",
            "created": time.strftime("%Y-%m-%d %H:%M:%S"), "skipped": []}




def package_versions() -> dict:
    """torch, Python and every kernel library a results file may depend on (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    out = {"torch": torch.__version__, "python": platform.python_version()}
    for name in ("triton", "fla-core", "flash-linear-attention", "flash-qla", "tilelang",
                 "flashinfer-python", "nvidia-cutlass-dsl"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def package_checkout() -> Path:
    """The folder above the imported ``mamba_edu`` package (its checkout, in a clone)."""
    return Path(__file__).resolve().parents[2]


def commit_hash() -> str | None:
    """``MAMBA_EDU_COMMIT`` where set (a copy of the tree whose ``.git`` may be stale, as on a
    GPU machine), else git's HEAD of the checkout the package is imported from, wherever the
    run starts (None outside git)."""
    if os.environ.get("MAMBA_EDU_COMMIT"):
        return os.environ["MAMBA_EDU_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(package_checkout()), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def sm_clock_mhz() -> float | None:
    """The current SM clock of this process's GPU (NVML), or None where NVML is missing."""
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # NVML is optional: the clock is then not recorded
        return None
