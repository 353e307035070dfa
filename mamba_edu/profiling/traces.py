"""Record a prefill under ``torch.profiler`` and keep a small trace of it.

:func:`record_trace` runs a callable a few times under the profiler. A schedule skips the first
calls (``wait``: not recorded at all; ``warmup``: recorded and thrown away, so that one-off costs
such as allocator growth or Triton compilation stay out) and keeps the ``active`` ones. Each call
runs inside a ``record_function`` range, by default ``prefill_forward``, which is how
:mod:`mamba_edu.profiling.bubbles` finds it again. It writes

* ``<out_dir>/<name>.json.gz`` — a Chrome/Perfetto trace (open it at https://ui.perfetto.dev);
* with ``tensorboard_dir``, the same trace in the layout that TensorBoard's profiler plugin
  (torch-tb-profiler) reads as one run with one worker:
  ``<tensorboard_dir>/<name>/<name>.<timestamp>.pt.trace.json.gz``.

:func:`trim_trace` keeps only the events of one forward, so that committed traces stay small.

The profiler's C++ library (Kineto) writes marker lines such as
``USDT:… SyncActivityProfilerHandler.cpp:52] profiler_start`` straight to the process's stderr
(file descriptor 2, below Python). :func:`quiet_profiler_logs` drops them, and ``record_trace``
uses it by default; every other stderr line is kept.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.profiler import (
    ProfilerActivity,
    profile,
    record_function,
    schedule,
    tensorboard_trace_handler,
)

from mamba_edu._runtime import synchronize
from mamba_edu.profiling.bubbles import forward_range, forward_window, load_trace, trace_events
from mamba_edu.probes import FORWARD_RANGE
from mamba_edu.profiling.trace_files import MAX_TRACE_BYTES


@dataclass(frozen=True)
class RecordedTrace:
    """Where :func:`record_trace` wrote its two copies of the trace."""

    chrome_trace: Path
    tensorboard_run: Path | None
    range_name: str = FORWARD_RANGE


#: Line prefixes of Kineto's own markers, dropped by :func:`quiet_profiler_logs`.
PROFILER_LOG_PREFIXES = ("USDT:", "STAGE:")


@contextlib.contextmanager
def quiet_profiler_logs(prefixes: tuple[str, ...] = PROFILER_LOG_PREFIXES):
    """Hide the lines starting with ``prefixes`` that C++ code writes to stderr inside the block.

    Kineto writes to file descriptor 2 directly, so ``sys.stderr`` redirection does not catch it
    (``KINETO_LOG_LEVEL`` could, but only by hiding its errors too). The block's fd-2 output goes
    to a temporary file; afterwards every line not starting with a prefix is written back to
    ``sys.stderr`` (in Jupyter that is the cell's stderr output).
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith(prefixes)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def record_trace(
    fn: Callable[..., object],
    out_dir: str | Path,
    name: str,
    *,
    setup: Callable[[], object] | None = None,
    range_name: str = FORWARD_RANGE,
    wait: int = 1,
    warmup: int = 1,
    active: int = 1,
    tensorboard_dir: str | Path | None = None,
    quiet: bool = True,
) -> RecordedTrace:
    """Profile ``fn`` ``wait + warmup + active`` times and save the active calls' trace.

    ``fn`` does one prefill forward, e.g. ``engine.forward_prefill`` or a CUDA-graph replay. With
    ``setup``, each call is ``fn(setup())`` and ``setup`` runs outside the range (the bench uses it
    to prepare a fresh batch). The GPU is synchronized before and after every call, outside the
    range, so nothing else overlaps it. ``tensorboard_dir=None`` skips the TensorBoard copy.
    ``quiet`` drops the profiler's ``USDT:``/``STAGE:`` lines from stderr
    (:func:`quiet_profiler_logs`).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    chrome = out_dir / f"{name}.json.gz"
    run = Path(tensorboard_dir) / name if tensorboard_dir is not None else None

    def on_trace_ready(prof: profile) -> None:
        # Kineto saves a trace only once: write the TensorBoard file, then copy it.
        if run is None:
            prof.export_chrome_trace(str(chrome))  # a ".gz" path is gzipped by torch
            return
        tensorboard_trace_handler(str(run), worker_name=name, use_gzip=True)(prof)
        newest = max(run.glob(f"{name}.*.pt.trace.json.gz"), key=lambda p: p.stat().st_mtime)
        shutil.copyfile(newest, chrome)

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    plan = schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    logs = quiet_profiler_logs() if quiet else contextlib.nullcontext()
    with logs, profile(activities=activities, schedule=plan, on_trace_ready=on_trace_ready) as prof:
        for _ in range(wait + warmup + active):
            args = (setup(),) if setup is not None else ()
            synchronize()  # the setup's uploads must not overlap the forward
            with record_function(range_name):
                fn(*args)
            synchronize()
            prof.step()
    return RecordedTrace(chrome, run, range_name)


def trim_trace(
    src: str | Path | dict,
    dst: str | Path,
    range_name: str = FORWARD_RANGE,
    *,
    index: int = -1,
    margin_us: float = 50.0,
    min_cpu_us: float = 0.0,
    max_bytes: int = MAX_TRACE_BYTES,
) -> Path:
    """Write to ``dst`` (gzipped JSON) only the events of one forward of ``src``.

    Kept: metadata events (process and thread names, which viewers need) and every event that
    overlaps the forward's window widened by ``margin_us``, except CPU operators shorter than
    ``min_cpu_us`` (view and reshape bookkeeping, the bulk of a long trace; a bubble that starts
    in one is then blamed on its parent). The trace's top-level fields (device properties, time
    base) are kept as they are. ``src`` may be either Chrome format; a file is read with the
    checks and the size cap ``max_bytes`` of :mod:`mamba_edu.profiling.trace_files` (raise it for
    a long untrimmed profile).
    """
    trace = load_trace(src, max_bytes=max_bytes)
    events = trace_events(trace)
    start, end, _ = forward_window(events, forward_range(events, range_name, index))
    lo, hi = start - margin_us, end + margin_us

    def keep(e: dict) -> bool:
        if e.get("ph") == "M" or "ts" not in e:
            return True
        ts, dur = float(e["ts"]), float(e.get("dur", 0))
        return ts <= hi and ts + dur >= lo and not (e.get("cat") == "cpu_op" and dur < min_cpu_us)

    trimmed = {**trace, "traceEvents": [e for e in trace["traceEvents"] if keep(e)]}
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(dst, "wt") as f:
        json.dump(trimmed, f, separators=(",", ":"))
    return dst
