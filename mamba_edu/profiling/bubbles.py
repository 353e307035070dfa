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
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from mamba_edu.probes import FORWARD_RANGE
from mamba_edu.profiling.trace_files import (
    MAX_TRACE_BYTES,
    TraceError,
    check_event,
    check_trace,
    read_trace_file,
)

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
    def lead_us(self) -> float:
        """From the range's start to its first GPU work. It is host work before the first launch,
        and under a profiler mostly the profiler's own start-up (the first launch it records is
        slow, a graph launch by milliseconds), so a timeline does not draw it as a bubble."""
        return self.gpu_busy[0][0] - self.start if self.gpu_busy else 0.0

    @property
    def idle_after_lead_fraction(self) -> float:
        """Idle share of the time from the first GPU work to the end of the forward."""
        span = self.wall_us - self.lead_us
        return (self.idle_us - self.lead_us) / span if self.has_gpu and span > 0 else 0.0

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


def load_trace(source: str | Path | dict | list, *, max_bytes: int = MAX_TRACE_BYTES) -> dict:
    """Read a Chrome trace (``.json`` or ``.json.gz``, object or array format) and check every
    event (:mod:`mamba_edu.profiling.trace_files`); a valid dict is returned unchanged, an array
    of events as ``{"traceEvents": array}``. Raises :class:`TraceError` (a ``ValueError``) with
    a one-line message for any file or object that is not a readable trace."""
    if isinstance(source, (dict, list)):
        return check_trace(source)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"load_trace reads a path, a dict or a list, not {type(source).__name__}")
    return read_trace_file(source, max_bytes)


def trace_events(trace: dict | list) -> list[Event]:
    """The complete events of a trace, sorted by start (outer before inner on ties).

    Every event is checked on the way (:func:`~mamba_edu.profiling.trace_files.check_event`):
    a malformed one raises :class:`TraceError` naming its index and field.
    """
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    elif not isinstance(trace, dict):
        raise TraceError(f"a trace is a dict or a list, not {type(trace).__name__}")
    raw = trace.get("traceEvents", [])
    if not isinstance(raw, list):
        raise TraceError("'traceEvents' is not a list of events", field="traceEvents")
    events = []
    for i, e in enumerate(raw):
        fields = check_event(i, e)
        if fields is None:
            continue
        name, cat, start, end, pid, tid, correlation = fields
        events.append(Event(name=name, cat=cat, start=start, end=end, pid=pid, tid=tid,
                            correlation=correlation))
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
        raise TraceError(f"no CPU range named {range_name!r} in the trace")
    if not -len(matches) <= index < len(matches):
        raise NoSuchOccurrence(f"no occurrence {index} of the range {range_name!r}: the trace has "
                               f"{len(matches)} (index 0 to {len(matches) - 1}, or -1 for the "
                               "last)")
    return matches[index]


class NoSuchOccurrence(TraceError, IndexError):
    """The trace has the range, but fewer occurrences than the index asks for."""


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


#: At most this many open events are kept in a bubble's ``stack`` (the innermost ones): a real
#: call stack is a few dozen deep, and a cap keeps a trace of thousands of badly nested events
#: from costing time and memory quadratic in their number.
MAX_STACK_DEPTH = 64


class _OpenAt:
    """Which events of one thread (sorted by start, outer before inner on ties) are open at a
    time ``t``: those with ``start <= t < end``, in that order.

    A segment tree of the largest ``end`` over each index range answers "the last event before
    index ``r`` that is still open at ``t``" in O(log n), so ``k`` open events cost O(k log n)
    whatever the nesting; one tree per category group finds the innermost of that group directly.
    """

    def __init__(self, events: Sequence[Event]):
        self.events = events
        self.starts = [e.start for e in events]
        self.size = 1 << max(len(events) - 1, 0).bit_length()
        self.trees = {None: self._tree(lambda e: True),
                      "op": self._tree(lambda e: e.cat in OP_CATEGORIES),
                      "runtime": self._tree(lambda e: e.cat in RUNTIME_CATEGORIES)}

    def _tree(self, keep) -> list[float]:
        tree = [-math.inf] * (2 * self.size)
        for i, e in enumerate(self.events):
            if keep(e):
                tree[self.size + i] = e.end
        for node in range(self.size - 1, 0, -1):
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
        return tree

    def _last_open(self, tree: list[float], r: int, t: float) -> int:
        """The largest index ``i < r`` whose event ends after ``t``, or -1."""
        if r <= 0:
            return -1
        # Walk up from leaf r-1, looking at the left siblings, then down into the first hit.
        node = self.size + r - 1
        if tree[node] > t:
            return r - 1
        while node > 1:
            if node & 1 and tree[node - 1] > t:  # a right child: its left sibling lies before
                node -= 1
                while node < self.size:
                    node = 2 * node + 1 if tree[2 * node + 1] > t else 2 * node
                return node - self.size
            node >>= 1
        return -1

    def stack(self, t: float, depth: int = MAX_STACK_DEPTH) -> list[Event]:
        """The (innermost ``depth``) events open at ``t``, outermost first."""
        tree, found = self.trees[None], []
        r = bisect.bisect_right(self.starts, t)
        while len(found) < depth and (r := self._last_open(tree, r, t)) >= 0:
            found.append(self.events[r])
        return found[::-1]

    def innermost(self, t: float, group: str) -> str | None:
        """The name of the innermost open event of a group (``"op"`` or ``"runtime"``)."""
        i = self._last_open(self.trees[group], bisect.bisect_right(self.starts, t), t)
        return self.events[i].name if i >= 0 else None


def open_stacks(events: Sequence[Event], times: Sequence[float],
                depth: int = MAX_STACK_DEPTH) -> list[list[Event]]:
    """For each time, the events (sorted by start, of one thread) open then, outermost first;
    at most the innermost ``depth`` of them. O((n + k) log n) for ``k`` events reported."""
    index = _OpenAt(events)
    return [index.stack(t, depth) for t in times]


def analyze_trace(
    source: str | Path | dict,
    range_name: str = FORWARD_RANGE,
    *,
    index: int = -1,
    threshold_us: float = 5.0,
    label: str | None = None,
) -> TraceAnalysis:
    """Analyse one forward of a trace (file path, loaded dict or array of events); see the
    module docstring. A trace that cannot be analysed raises :class:`TraceError`."""
    if not isinstance(range_name, str):
        raise TypeError(f"range_name must be a string, got {type(range_name).__name__}")
    if type(index) is not int:
        raise TypeError(f"index must be an int, got {type(index).__name__}")
    if (type(threshold_us) not in (int, float) or not math.isfinite(threshold_us)
            or threshold_us < 0):
        raise ValueError(f"threshold_us must be a finite number >= 0, got {threshold_us!r}")
    events = trace_events(source if isinstance(source, dict) else load_trace(source))
    fwd = forward_range(events, range_name, index)
    start, end, gpu = forward_window(events, fwd)
    thread = [e for e in events if e.thread == fwd.thread and start <= e.start < end]

    busy = merge_intervals((max(e.start, start), min(e.end, end)) for e in gpu)
    gaps = find_gaps(busy, start, end, threshold_us)
    open_at = _OpenAt(thread)
    bubbles = [
        Bubble(a, b, tuple(e.name for e in open_at.stack(a)), open_at.innermost(a, "op"),
               open_at.innermost(a, "runtime"))
        for a, b in gaps
    ]

    # A DtoH copy is blamed on the op that launched it, a host wait on the op that called it.
    # Waits count inside the range only: the caller's synchronize after the forward is not one.
    launched_at = {e.correlation: e.start for e in thread
                   if e.cat in RUNTIME_CATEGORIES and e.correlation is not None}
    found = [(e, "wait", e.start) for e in thread
             if e.cat in RUNTIME_CATEGORIES and e.name in HOST_WAITS and e.start < fwd.end]
    found += [(e, "dtoh", launched_at.get(e.correlation, e.start)) for e in gpu
              if e.cat == "gpu_memcpy" and e.name.startswith(DTOH_PREFIX)]
    syncs = sorted(
        (TraceSync(e.name, kind, e.start, e.end, open_at.innermost(t, "op"))
         for e, kind, t in found),
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
