"""Find the GPU bubbles of one forward in a Chrome/Perfetto trace, and the syncs behind them.

A trace written by ``torch.profiler`` is a JSON object whose ``traceEvents`` list holds
*complete* events (``"ph": "X"``, start ``ts`` and duration ``dur`` in microseconds). Their
category says where they ran: ``cpu_op`` / ``user_annotation`` on a CPU thread, ``cuda_runtime``
/ ``cuda_driver`` for calls into CUDA, ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` on a GPU
stream. A GPU event and the runtime call that launched it share ``args["correlation"]``.

The analysis of one forward (a ``record_function`` range, e.g. ``prefill_forward``):

* its **window** starts with the range and ends when both the range and the last GPU work it
  launched have finished, so the wall time is the synchronized time of the forward;
* **GPU busy** is the union of kernel/memcpy/memset intervals over all streams (two kernels
  overlapping on two streams count once);
* a **bubble** is a gap of at least ``threshold_us`` on that union inside the window, blamed on
  the CPU op that was open on the forward's thread when the GPU went idle;
* **syncs** are the host calls that wait for the GPU (``cudaStreamSynchronize`` and friends) and
  the device-to-host copies (``Memcpy DtoH``) they usually wait for.

Pure Python on purpose: it runs on any trace, including GPU traces read on a laptop.
"""

from __future__ import annotations

import bisect
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from mamba_edu.probes import FORWARD_RANGE

GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
OP_CATEGORIES = frozenset({"cpu_op", "user_annotation"})
HOST_WAITS = frozenset(
    {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}
)
DTOH_PREFIX = "Memcpy DtoH"

Interval = tuple[float, float]


@dataclass(frozen=True)
class Event:
    """One complete (``"ph": "X"``) trace event; times in microseconds of the trace clock."""

    name: str
    cat: str
    start: float
    end: float
    pid: object = 0
    tid: object = 0
    correlation: int | None = None

    @property
    def thread(self) -> tuple[object, object]:
        return (self.pid, self.tid)


@dataclass(frozen=True)
class Bubble:
    """An idle stretch of the GPU inside the forward.

    ``stack`` lists the CPU events open on the forward's thread when the GPU went idle, outermost
    first; ``op`` is the innermost operator or range among them and ``runtime`` the innermost CUDA
    call (e.g. ``aten::nonzero`` and ``cudaStreamSynchronize``), either ``None`` if there is none.
    """

    start: float
    end: float
    stack: tuple[str, ...] = ()
    op: str | None = None
    runtime: str | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def cause(self) -> str:
        """``"aten::nonzero → cudaStreamSynchronize"``, or what part of it is known."""
        return " → ".join(n for n in (self.op, self.runtime) if n) or "?"


@dataclass(frozen=True)
class TraceSync:
    """A host call that waits for the GPU (``kind="wait"``) or a device-to-host copy (``"dtoh"``).

    ``op`` is the innermost CPU operator open when the host issued it.
    """

    name: str
    kind: str
    start: float
    end: float
    op: str | None = None


@dataclass
class TraceAnalysis:
    """Bubbles, busy time and syncs of one forward; times in µs on the trace clock."""

    label: str
    range_name: str
    start: float
    end: float
    threshold_us: float
    gpu_busy: list[Interval] = field(default_factory=list)  # merged, clipped to the window
    cpu_busy: list[Interval] = field(default_factory=list)  # merged operators of the thread
    bubbles: list[Bubble] = field(default_factory=list)
    syncs: list[TraceSync] = field(default_factory=list)

    @property
    def has_gpu(self) -> bool:
        """Whether the forward ran anything on a GPU (a CPU-only trace has no GPU lane)."""
        return bool(self.gpu_busy)

    @property
    def wall_us(self) -> float:
        return self.end - self.start

    @property
    def gpu_busy_us(self) -> float:
        return sum(e - s for s, e in self.gpu_busy)

    @property
    def idle_us(self) -> float:
        return self.wall_us - self.gpu_busy_us

    @property
    def bubble_us(self) -> float:
        """Idle time in gaps of at least ``threshold_us`` (``idle_us`` counts every gap)."""
        return sum(b.duration for b in self.bubbles)

    @property
    def idle_fraction(self) -> float:
        return self.idle_us / self.wall_us if self.wall_us > 0 else 0.0

    @property
    def n_syncs(self) -> int:
        """Host calls that waited for the GPU."""
        return sum(s.kind == "wait" for s in self.syncs)

    @property
    def n_dtoh(self) -> int:
        return sum(s.kind == "dtoh" for s in self.syncs)

    def summary(self) -> dict:
        """The headline numbers as a JSON-ready dict (milliseconds)."""
        return {
            "label": self.label,
            "wall_ms": self.wall_us / 1e3,
            "gpu_busy_ms": self.gpu_busy_us / 1e3,
            "idle_ms": self.idle_us / 1e3,
            "idle_fraction": self.idle_fraction,
            "bubbles": len(self.bubbles),
            "syncs": self.n_syncs,
            "dtoh_copies": self.n_dtoh,
        }


def load_trace(source: str | Path | dict) -> dict:
    """Read a Chrome trace (``.json`` or ``.json.gz``); a dict is returned unchanged."""
    if isinstance(source, dict):
        return source
    path = Path(source)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def trace_events(trace: dict) -> list[Event]:
    """The complete events of a trace, sorted by start (outer before inner on ties)."""
    events = []
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or "dur" not in e:
            continue
        start = float(e["ts"])
        events.append(
            Event(
                name=e.get("name", ""),
                cat=e.get("cat", ""),
                start=start,
                end=start + float(e["dur"]),
                pid=e.get("pid", 0),
                tid=e.get("tid", 0),
                correlation=(e.get("args") or {}).get("correlation"),
            )
        )
    events.sort(key=lambda ev: (ev.start, -ev.end))
    return events


def merge_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """Union of intervals as a sorted list of disjoint ``(start, end)`` pairs."""
    merged: list[list[float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def find_gaps(busy: Sequence[Interval], start: float, end: float,
              threshold: float) -> list[Interval]:
    """Non-empty gaps of at least ``threshold`` between ``start`` and ``end`` in the merged
    ``busy`` intervals, the stretches before the first and after the last one included."""
    edges = [start, *(t for iv in busy for t in iv), end]
    gaps = zip(edges[0::2], edges[1::2])  # (end of one busy stretch, start of the next)
    return [(a, b) for a, b in gaps if b - a >= threshold and b > a]


def forward_range(events: Sequence[Event], range_name: str, index: int = -1) -> Event:
    """The ``index``-th CPU occurrence of a ``record_function`` range (the last by default)."""
    matches = [e for e in events if e.name == range_name and e.cat in OP_CATEGORIES]
    if not matches:
        raise ValueError(f"no CPU range named {range_name!r} in the trace")
    return matches[index]


def forward_window(events: Sequence[Event], fwd: Event) -> tuple[float, float, list[Event]]:
    """The window of a forward and the GPU events that belong to it.

    A GPU event belongs to the forward if a runtime call inside the range launched it, or if it
    runs while the range is open (for traces without correlation ids).
    """
    launched = {
        e.correlation
        for e in events
        if e.cat in RUNTIME_CATEGORIES and e.thread == fwd.thread and fwd.start <= e.start < fwd.end
    }
    gpu = [
        e
        for e in events
        if e.cat in GPU_CATEGORIES
        and ((e.correlation is not None and e.correlation in launched)
             or (e.start < fwd.end and e.end > fwd.start))
    ]
    end = max([fwd.end, *(e.end for e in gpu)])
    return fwd.start, end, gpu


def open_stacks(events: Sequence[Event], times: Sequence[float]) -> list[list[Event]]:
    """For each time, the events (sorted by start, of one thread) open then, outermost first.

    One sweep over the events: a stack of open events, popped once they have ended.
    """
    order = sorted(range(len(times)), key=times.__getitem__)
    starts = [e.start for e in events]
    stacks: list[list[Event]] = [[] for _ in times]
    stack: list[Event] = []
    pushed = 0
    for i in order:
        t = times[i]
        upto = bisect.bisect_right(starts, t)
        for e in events[pushed:upto]:
            while stack and stack[-1].end <= e.start:
                stack.pop()
            stack.append(e)
        pushed = max(pushed, upto)
        stacks[i] = [e for e in stack if e.end > t]  # also drops badly nested leftovers
    return stacks


def _innermost(stack: Sequence[Event], categories: frozenset[str]) -> str | None:
    return next((e.name for e in reversed(stack) if e.cat in categories), None)


def analyze_trace(
    source: str | Path | dict,
    range_name: str = FORWARD_RANGE,
    *,
    index: int = -1,
    threshold_us: float = 5.0,
    label: str | None = None,
) -> TraceAnalysis:
    """Analyse one forward of a trace (file path or loaded dict); see the module docstring."""
    events = trace_events(load_trace(source))
    fwd = forward_range(events, range_name, index)
    start, end, gpu = forward_window(events, fwd)
    thread = [e for e in events if e.thread == fwd.thread and start <= e.start < end]

    busy = merge_intervals((max(e.start, start), min(e.end, end)) for e in gpu)
    gaps = find_gaps(busy, start, end, threshold_us)
    bubbles = [
        Bubble(a, b, tuple(e.name for e in stack), _innermost(stack, OP_CATEGORIES),
               _innermost(stack, RUNTIME_CATEGORIES))
        for (a, b), stack in zip(gaps, open_stacks(thread, [a for a, _ in gaps]))
    ]

    # A DtoH copy is blamed on the op that launched it, a host wait on the op that called it.
    # Waits count inside the range only: the caller's synchronize after the forward is not one.
    launched_at = {e.correlation: e.start for e in thread
                   if e.cat in RUNTIME_CATEGORIES and e.correlation is not None}
    found = [(e, "wait", e.start) for e in thread
             if e.cat in RUNTIME_CATEGORIES and e.name in HOST_WAITS and e.start < fwd.end]
    found += [(e, "dtoh", launched_at.get(e.correlation, e.start)) for e in gpu
              if e.cat == "gpu_memcpy" and e.name.startswith(DTOH_PREFIX)]
    stacks = open_stacks(thread, [t for _, _, t in found])
    syncs = sorted(
        (TraceSync(e.name, kind, e.start, e.end, _innermost(stack, OP_CATEGORIES))
         for (e, kind, _), stack in zip(found, stacks)),
        key=lambda s: s.start,
    )

    return TraceAnalysis(
        label=label or range_name,
        range_name=range_name,
        start=start,
        end=end,
        threshold_us=threshold_us,
        gpu_busy=busy,
        cpu_busy=merge_intervals((e.start, e.end) for e in thread if e.cat == "cpu_op"),
        bubbles=bubbles,
        syncs=syncs,
    )
