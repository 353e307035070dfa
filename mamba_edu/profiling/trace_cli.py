"""``mamba-edu trace PATH``: the bubble summary of a trace and its PNG timeline, offline.

PATH is a Chrome/Perfetto trace written by torch.profiler (``.json`` or ``.json.gz``, e.g. a
committed ``data/runs/<case>/<strategy>.pt.trace.json.gz``), or a folder of them: then every
trace in it becomes one row of the figure, on one time axis. The numbers are those of
:func:`mamba_edu.profiling.analyze_trace` (wall time of the forward, GPU busy, idle fraction,
bubbles, syncs); the figure is :func:`mamba_edu.profiling.plots.plot_timelines`. Nothing here
needs a GPU or a network: it is what to use where TensorBoard's profiler page cannot load its
charts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

from mamba_edu._cli import (HelpFormatter, check_out_dir, non_negative_int, plain, positive_float,
                            prog_name, say)
from mamba_edu.profiling.bubbles import (OP_CATEGORIES, TraceAnalysis, analyze_trace, load_trace,
                                         trace_events)
from mamba_edu.profiling.traces import FORWARD_RANGE

TRACE_SUFFIXES = (".json", ".json.gz")
STEP_PREFIX = "ProfilerStep#"


def trace_files(path: Path) -> list[Path]:
    """``path`` itself, or the traces in the folder ``path`` (sorted by name)."""
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    return [path]


def label_of(path: Path) -> str:
    """``naive`` for ``naive.pt.trace.json.gz``, ``sync_free+graph`` for ``sync_free_graph…``."""
    name = path.name.split(".")[0]
    return name[: -len("_graph")] + "+graph" if name.endswith("_graph") else name


def pick_range(trace: dict, wanted: str | None) -> str:
    """The CPU range to analyse: ``wanted`` if given; else ``prefill_forward`` when the trace has
    one, else its profiler step (``ProfilerStep#N``, in any torch.profiler trace with a schedule).
    Raises ``ValueError`` naming the ranges there are."""
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
    what = f"no CPU range named {wanted!r}" if wanted else (
        f"no {FORWARD_RANGE!r} range and no {STEP_PREFIX}N step")
    raise ValueError(f"{what} in the trace; its record_function ranges: {shown or 'none'} "
                     "(pick one with --range NAME)")


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


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("path", type=Path,
                   help="a trace (.json or .json.gz) or a folder of them, e.g. "
                        "data/runs/launch_bound_1x512")
    p.add_argument("--range", dest="range_name", default=None, metavar="NAME",
                   help=f"the record_function range of one forward; default: {FORWARD_RANGE} if "
                        f"present, else the trace's {STEP_PREFIX}N step")
    p.add_argument("--index", type=int, default=-1,
                   help="which occurrence of the range (-1 = the last)")
    p.add_argument("--threshold-us", type=positive_float, default=5.0,
                   help="shortest GPU gap counted as a bubble (idle time counts every gap)")
    p.add_argument("--top", type=non_negative_int, default=5, help="bubble causes to list")
    p.add_argument("--out", type=Path, default=None,
                   help="the PNG to write; default: out/trace/<name of PATH>.png")
    p.add_argument("--no-plot", dest="plot", action="store_false", help="print the summary only")
    p.add_argument("--json", action="store_true",
                   help="print the summaries as JSON (one object per trace) instead of text")
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    if not args.path.exists():
        p.error(f"{args.path}: no such file or folder")
    args.files = trace_files(args.path)
    if not args.files:
        p.error(f"{args.path}: no trace files (*.json, *.json.gz) in this folder")
    if args.out is None:
        args.out = Path("out/trace") / f"{args.path.name.split('.')[0] or 'trace'}.png"
    elif args.out.suffix.lower() != ".png":
        p.error(f"--out {args.out}: the figure is a PNG, give a path ending in .png")
    if args.plot:
        check_out_dir(p, args.out.parent)
    return args


def run(args: argparse.Namespace) -> int:
    """Analyse every trace, print the summaries, draw the figure. Returns 0, or 2 when a trace
    cannot be read or has no range to analyse (the message says why)."""
    analyses = []
    for path in args.files:
        try:
            trace = load_trace(path)
            rng = pick_range(trace, args.range_name)
            a = analyze_trace(trace, rng, index=args.index, threshold_us=args.threshold_us,
                              label=label_of(path))
        except (OSError, ValueError, IndexError, EOFError, json.JSONDecodeError) as err:
            why = f"no occurrence {args.index} of the range" if isinstance(err, IndexError) else err
            print(f"{prog_name()} trace: {path}: {why}", file=sys.stderr)
            return 2
        analyses.append((path, a))
        if args.json:
            say(json.dumps({"path": str(path), "range": a.range_name, **a.summary()}))
        else:
            say(report(a, path, args.top))
    if args.plot:
        os.environ.setdefault("MPLBACKEND", "Agg")  # no display needed
        import matplotlib.pyplot as plt

        from mamba_edu.profiling.plots import plot_timelines

        title = f"{args.path.name}: one forward per trace" if len(analyses) > 1 else None
        plt.close(plot_timelines([a for _, a in analyses], args.out, title=title))
        if not args.json:
            say(f"timeline: {args.out}")
    if not args.json:
        say("The same file opens at https://ui.perfetto.dev when online (nothing is uploaded).")
    return 0


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog or f"{prog_name()} trace", description=plain(__doc__),
                                formatter_class=HelpFormatter)
    return add_arguments(p)


def main(argv=None) -> int:
    p = build_parser()
    return run(check_args(p, p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
