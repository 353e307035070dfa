"""Draw what :mod:`mamba_edu.profiling.bubbles` found: timelines, and bars per strategy.

* :func:`plot_timeline` — one forward as two lanes: the CPU thread (operators, with the host
  waits in black) and the GPU (busy in blue, bubbles shaded red, device-to-host copies marked).
  The time before the first kernel is hatched grey, not a bubble: under a profiler it is mostly
  the profiler's own start-up.
* :func:`plot_timelines` — one row per strategy on a shared time axis: the before/after figure.
* :func:`plot_strategy_bars` — TTFT next to GPU busy time, and syncs per forward, per strategy.
* :func:`plot_sweep` — one line per strategy through a sweep (TTFT against total tokens…).

Every function returns the ``Figure`` and also saves it when given a ``path``. Times are drawn in
milliseconds from the start of each forward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from mamba_edu.profiling.bubbles import TraceAnalysis

GPU_COLOR, CPU_COLOR, BUBBLE_COLOR, SYNC_COLOR = "tab:blue", "tab:gray", "tab:red", "black"
LEAD_COLOR = "lightgray"
_CPU_LANE, _GPU_LANE = (0.0, 1.0), (1.5, 1.0)  # (bottom, height) of each lane


def _save(fig: Figure, path: str | Path | None) -> Figure:
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig


def _bars(intervals, t0: float) -> list[tuple[float, float]]:
    """``(start, end)`` in µs → matplotlib ``broken_barh`` ``(x, width)`` in ms from ``t0``."""
    return [((s - t0) / 1e3, (e - s) / 1e3) for s, e in intervals]


def _describe(a: TraceAnalysis) -> str:
    if not a.has_gpu:
        return f"{a.label}: {a.wall_us / 1e3:.2f} ms, CPU-only trace (no GPU lane, so no bubbles)"
    bubbles = sum(b.start >= a.start + a.lead_us for b in a.bubbles)
    return (f"{a.label}: {a.wall_us / 1e3:.2f} ms, GPU busy {a.gpu_busy_us / 1e3:.2f} ms, "
            f"idle {100 * a.idle_after_lead_fraction:.0f}% after the first kernel, "
            f"{bubbles} bubbles, {a.n_syncs} syncs")


def draw_lanes(ax: Axes, a: TraceAnalysis) -> None:
    """Draw the CPU and GPU lanes of one analysis onto ``ax``."""
    t0 = a.start
    ax.broken_barh(_bars(a.cpu_busy, t0), _CPU_LANE, color=CPU_COLOR, alpha=0.6)
    waits = [(s.start, s.end) for s in a.syncs if s.kind == "wait"]
    ax.broken_barh(_bars(waits, t0), _CPU_LANE, color=SYNC_COLOR)
    ax.broken_barh(_bars(a.gpu_busy, t0), _GPU_LANE, color=GPU_COLOR)
    first = t0 + a.lead_us
    ax.broken_barh(_bars([(t0, first)], t0), _GPU_LANE, color=LEAD_COLOR, hatch="//", alpha=0.5)
    bubbles = [(b.start, b.end) for b in a.bubbles if b.start >= first] if a.has_gpu else []
    ax.broken_barh(_bars(bubbles, t0), _GPU_LANE, color=BUBBLE_COLOR, alpha=0.35)
    dtoh = [(s.start - t0) / 1e3 for s in a.syncs if s.kind == "dtoh"]
    top = _GPU_LANE[0] + _GPU_LANE[1]
    ax.plot(dtoh, [top + 0.15] * len(dtoh), "v", color=SYNC_COLOR, markersize=4)
    ax.set_yticks([_CPU_LANE[0] + 0.5, _GPU_LANE[0] + 0.5], ["CPU", "GPU"])
    ax.set_ylim(-0.3, top + 0.5)
    ax.set_title(_describe(a), fontsize=9, loc="left")


def plot_timeline(a: TraceAnalysis, path: str | Path | None = None) -> Figure:
    """The two-lane timeline of one forward."""
    fig, ax = plt.subplots(figsize=(11, 2.2))
    draw_lanes(ax, a)
    ax.set_xlim(0, a.wall_us / 1e3)
    ax.set_xlabel("time since the forward started (ms)")
    _legend(fig)
    return _save(fig, path)


def plot_timelines(
    analyses: Sequence[TraceAnalysis], path: str | Path | None = None, title: str | None = None
) -> Figure:
    """One row per analysis, all on the time axis of the longest forward."""
    fig, axes = plt.subplots(len(analyses), 1, figsize=(11, 1.6 * len(analyses) + 0.8),
                             sharex=True, squeeze=False)
    for ax, a in zip(axes[:, 0], analyses):
        draw_lanes(ax, a)
    axes[0, 0].set_xlim(0, max(a.wall_us for a in analyses) / 1e3)
    axes[-1, 0].set_xlabel("time since the forward started (ms)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    _legend(fig)
    return _save(fig, path)


def _legend(fig: Figure) -> None:
    """One legend under the axes, so it never hides a lane."""
    handles = [Patch(color=CPU_COLOR, alpha=0.6, label="CPU op"),
               Patch(color=SYNC_COLOR, label="host waits (sync)"),
               Patch(color=GPU_COLOR, label="GPU busy"),
               Patch(color=BUBBLE_COLOR, alpha=0.35, label="bubble"),
               Patch(facecolor=LEAD_COLOR, hatch="//", alpha=0.5,
                     label="before the first kernel (profiler start-up included)"),
               Line2D([], [], marker="v", color=SYNC_COLOR, ls="", label="Memcpy DtoH")]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncols=3,
               fontsize=8, frameon=False)


def plot_strategy_bars(
    strategies: Sequence[str],
    ttft_ms: Sequence[float],
    gpu_busy_ms: Sequence[float | None],
    syncs: Sequence[int],
    path: str | Path | None = None,
    title: str | None = None,
) -> Figure:
    """TTFT beside GPU busy time (left) and syncs per forward (right), one group per strategy.

    A missing busy time (``None``, e.g. measured on a CPU) leaves that bar out.
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4),
                                      gridspec_kw={"width_ratios": [3, 1.2]})
    x = range(len(strategies))
    left.bar([i - 0.2 for i in x], ttft_ms, 0.4, label="TTFT (median)", color="tab:orange")
    busy = [(i + 0.2, b) for i, b in zip(x, gpu_busy_ms) if b is not None]
    left.bar([i for i, _ in busy], [b for _, b in busy], 0.4, label="GPU busy", color=GPU_COLOR)
    for i, t in zip(x, ttft_ms):
        left.annotate(f"{t:.3g}", (i - 0.2, t), ha="center", va="bottom", fontsize=8)
    left.set_xticks(list(x), strategies, rotation=15)
    left.set_ylabel("ms")
    left.legend(fontsize=8)
    right.bar(list(x), syncs, color=SYNC_COLOR)
    for i, n in zip(x, syncs):
        right.annotate(str(n), (i, n), ha="center", va="bottom", fontsize=8)
    right.set_xticks(list(x), strategies, rotation=30, fontsize=8)
    right.set_ylabel("syncs per forward")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_sweep(
    series: Mapping[str, Mapping[float, float]],
    xlabel: str,
    ylabel: str,
    path: str | Path | None = None,
    title: str | None = None,
    log_x: bool = False,
) -> Figure:
    """One line per label through its ``{x: y}`` points, e.g. TTFT against total tokens."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for label, points in series.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], "o-", label=label)
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)
