"""A trace's analysis as a few lines of text: which traces a path holds, which range to
analyse, and the summary (wall time, GPU busy and idle, bubbles and their top causes, syncs).

The ``trace`` command of the command line (``mamba-edu trace PATH``) prints these summaries;
they read like the title of the timeline figure of :mod:`mamba_edu.profiling.plots`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from mamba_edu.profiling.bubbles import (
    OP_CATEGORIES,
    TraceAnalysis,
    analyze_trace,
    load_trace,
    trace_events,
)
from mamba_edu.profiling.trace_files import MAX_TRACE_BYTES, TraceError
from mamba_edu.profiling.traces import FORWARD_RANGE

TRACE_SUFFIXES = (".json", ".json.gz")
STEP_PREFIX = "ProfilerStep#"


def trace_files(path: Path) -> list[Path]:
    """``path`` itself, or the traces in the folder ``path`` (sorted by name)."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    return [path]


def label_of(path: Path) -> str:
    """``naive`` for ``naive.pt.trace.json.gz``, ``sync_free+graph`` for ``sync_free_graph…``,
    ``precomputed+breakable`` for ``precomputed_breakable…`` (and the other capture modes, the
    per-batch ``piecewise`` of older recorded runs included)."""
    name = path.name.split(".")[0]
    for mode in ("graph", "gdn_inside", "breakable", "piecewise"):
        if name.endswith("_" + mode):
            return name[: -len(mode) - 1] + "+" + mode
    return name


def pick_range(trace: dict, wanted: str | None) -> str:
    """The CPU range to analyse: ``wanted`` if given; else ``prefill_forward`` when the trace has
    one, else its profiler step (``ProfilerStep#N``, in any torch.profiler trace with a schedule).
    Raises :class:`TraceError` (a ``ValueError``) naming the ranges there are."""
    names = {e.name for e in trace_events(trace) if e.cat in OP_CATEGORIES}
    if wanted is not None:
        if wanted in names:
            return wanted
    elif FORWARD_RANGE in names:
        return FORWARD_RANGE
    elif steps := sorted(n for n in names if n.startswith(STEP_PREFIX)):
        return steps[-1]
    annotations = sorted({e.name for e in trace_events(trace) if e.cat == "user_annotation"})
    shown = ", ".join(annotations[:12]) + (" …" if len(annotations) > 12 else "")
    what = f"no CPU range named {wanted!r}" if wanted is not None else (
        f"no {FORWARD_RANGE!r} range and no {STEP_PREFIX}N step")
    raise TraceError(f"{what} in the trace; its record_function ranges: {shown or 'none'} "
                     "(pick one with --range NAME)")


def analyze_file(path: Path, range_name: str | None = None, *, index: int = -1,
                 threshold_us: float = 5.0, max_bytes: int = MAX_TRACE_BYTES) -> TraceAnalysis:
    """Read, check and analyse one trace file (the ``trace`` command's work per file).

    The range is :func:`pick_range`'s; the label :func:`label_of`'s. Whatever is wrong with the
    file (unreadable, not a regular file, too large, not JSON, a malformed event, no such range or
    occurrence) raises :class:`TraceError` with a one-line message, and nothing else does.
    """
    try:
        trace = load_trace(path, max_bytes=max_bytes)
        rng = pick_range(trace, range_name)
        return analyze_trace(trace, rng, index=index, threshold_us=threshold_us,
                             label=label_of(Path(path)))
    except RecursionError:
        raise TraceError("is nested too deeply to analyse") from None
    except MemoryError:
        raise TraceError("does not fit in memory") from None


def causes(a: TraceAnalysis, top: int) -> list[tuple[str, int, float]]:
    """The ``top`` bubble causes by total idle time: ``(cause, count, µs)``."""
    by: dict[str, list[float]] = defaultdict(list)
    for b in a.bubbles:
        by[b.cause].append(b.duration)
    ranked = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:top]
    return [(cause, len(ds), sum(ds)) for cause, ds in ranked]


def report(a: TraceAnalysis, path: Path, top: int) -> str:
    """A few lines that read like the figure's title, plus the top bubble causes."""
    lines = [f"{path}: range {a.range_name!r}"]
    if not a.has_gpu:
        lines.append(f"  wall {a.wall_us / 1e3:.2f} ms; CPU-only trace: no GPU lane, so no "
                     f"bubbles (host waits found: {a.n_syncs})")
        return "\n".join(lines)
    lines.append(f"  wall {a.wall_us / 1e3:.2f} ms, GPU busy {a.gpu_busy_us / 1e3:.2f} ms, "
                 f"idle {a.idle_us / 1e3:.2f} ms = {100 * a.idle_fraction:.1f} % of the wall time")
    lines.append(f"  {len(a.bubbles)} bubbles of at least {a.threshold_us:g} µs "
                 f"({a.bubble_us / 1e3:.2f} ms); {a.n_syncs} host waits (syncs), "
                 f"{a.n_dtoh} device-to-host copies")
    if top and a.bubbles:
        lines.append("  largest causes (CPU op → CUDA call open when the GPU went idle):")
        for cause, n, us in causes(a, top):
            lines.append(f"    {us / 1e3:9.2f} ms in {n:5d} bubbles  {cause}")
    return "\n".join(lines)
