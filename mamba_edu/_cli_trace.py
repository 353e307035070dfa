"""``mamba-edu trace PATH``: the bubble summary of a trace and its PNG timeline, offline.

PATH is a Chrome/Perfetto trace written by torch.profiler (``.json`` or ``.json.gz``, e.g. a
committed ``data/runs/<case>/<strategy>.pt.trace.json.gz``), a folder of them, or a folder of
such folders (``data/runs``: one per case): every trace becomes one row of the figure, on one
time axis, labelled with its folder when there are several. The numbers are those of
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
from pathlib import Path

from mamba_edu._cli import check_out_dir, non_negative_int, positive_float, prog_name, say

# mamba_edu.profiling is imported by check_args and run, not here: it imports torch, and --help
# must answer at once.


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("path", type=Path,
                   help="a trace (.json or .json.gz), a folder of them (data/runs/"
                        "launch_bound_1x512) or a folder of such folders (data/runs)")
    p.add_argument("--range", dest="range_name", default=None, metavar="NAME",
                   help="the record_function range of one forward; default: the one "
                        "record_trace opens around a forward if present, else the trace's last "
                        "profiler step")
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
    args.files = traces_under(args.path)
    if not args.files:
        p.error(f"{args.path}: no trace files (*.json, *.json.gz) in this folder or the folders in it")
    if args.out is None:
        args.out = Path("out/trace") / f"{args.path.name.split('.')[0] or 'trace'}.png"
    elif args.out.is_dir():
        p.error(f"--out {args.out}: is a folder; give the PNG's file name, e.g. "
                f"{args.out / 'timeline.png'}")
    elif args.out.exists() and not args.out.is_file():
        p.error(f"--out {args.out}: exists and is not a regular file (a pipe or a device)")
    elif args.out.suffix.lower() != ".png":
        p.error(f"--out {args.out}: the figure is a PNG, give a path ending in .png")
    if args.plot:
        check_out_dir(p, args.out.parent, given=args.out)
    return args


def traces_under(path: Path) -> list[Path]:
    """The traces of ``path`` (a file, or a folder's own traces); for a folder that holds none,
    those of the folders in it, folder by folder (a runs folder: one per case)."""
    from mamba_edu.profiling.summary import trace_files

    files = trace_files(path)
    if files or not path.is_dir():
        return files
    return [f for sub in sorted(path.iterdir()) if sub.is_dir() for f in trace_files(sub)]


#: Rows the timeline draws at most: one subplot per trace costs time that grows faster than
#: the rows (400 traces took 211 s); the summaries still cover every trace.
MAX_ROWS = 24
_CONTROL = dict.fromkeys([*range(0x20), *range(0x7F, 0xA0)])
del _CONTROL[ord("\n")], _CONTROL[ord("\t")]


def printable(text: str) -> str:
    """``text`` safe for a terminal: control characters (escape sequences) and lone surrogates
    shown as escapes instead of written raw (an op name in a trace is untrusted text)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(f"\\x{ord(c):02x}" if ord(c) in _CONTROL else c for c in text)


def run(args: argparse.Namespace) -> int:
    """Analyse every trace, print the summaries, draw the figure. Returns 0, or 2 when a trace
    cannot be read or has no range to analyse (the message says why)."""
    from mamba_edu.profiling.summary import analyze_file, report
    from mamba_edu.profiling.trace_files import TraceError

    analyses = []
    folders = {path.parent for path in args.files}
    for path in args.files:
        try:  # every per-file problem is a TraceError with a one-line message
            a = analyze_file(path, args.range_name, index=args.index,
                             threshold_us=args.threshold_us)
        except TraceError as err:
            print(printable(f"{prog_name()} trace: {path}: {err}"), file=sys.stderr)
            return 2
        if len(folders) > 1:  # naive of one case, naive of the next: say which
            a.label = f"{path.parent.name}/{a.label}"
        analyses.append((path, a))
        if args.json:
            say(json.dumps({"path": str(path), "range": a.range_name, **a.summary()}))
        else:
            say(printable(report(a, path, args.top)))
    if args.plot:
        os.environ.setdefault("MPLBACKEND", "Agg")  # no display needed
        import matplotlib.pyplot as plt

        from mamba_edu.profiling.plots import plot_timelines

        drawn = [a for _, a in analyses[:MAX_ROWS]]
        title = f"{args.path.name}: one forward per trace" if len(analyses) > 1 else None
        if len(analyses) > MAX_ROWS:
            title += f" (the first {MAX_ROWS} of {len(analyses)})"
        plt.close(plot_timelines(drawn, args.out, title=title))
        if not args.json:
            more = f", the first {MAX_ROWS} of {len(analyses)} traces" if len(analyses) > MAX_ROWS else ""
            say(f"timeline: {args.out}{more}")
    if not args.json:
        say("The same file opens at https://ui.perfetto.dev when online (nothing is uploaded).")
    return 0
