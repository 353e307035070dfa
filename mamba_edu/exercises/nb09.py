"""Checks of notebook 09 (profiling the bubbles).

1. ``my_gpu_lane`` — the GPU lane of one forward: the union of kernel/copy intervals over all
   streams, clipped to the forward's window, and the idle gaps (bubbles) inside it.
2. ``my_trace_syncs`` — count, in a recorded trace, the host waits of one forward and the
   device-to-host copies it launched.
3. ``my_worst_wait`` — read a zoomed stretch of a forward (two GDN layers): which host wait left
   the GPU idle longest after it returned (the CPU op that waited) and for how long.

4. ``my_stretch_waits`` — predict-then-measure: how many host waits a stretch of ``n`` GDN
   layers in the middle of a recorded forward holds, per strategy; the check counts them in the
   H200 traces, on stretches it picks (a count: tolerance 0).

Exercises 1–3 are compared with :mod:`mamba_edu.profiling.bubbles`, on hand-made inputs with the traps
(overlapping streams, a gap exactly at the threshold, intervals outside the window, a sync after
the forward, another host thread) and, when the repository's ``data/`` is there, on the traces
recorded on the H200 (exercise 3: on stretches the check picks, not the one the notebook prints).
"""

from __future__ import annotations

import copy
import functools
import numbers
import random

from mamba_edu._runtime import data_dir
from mamba_edu.exercises.core import check_seed, checker, exercise
from mamba_edu.exercises.nb06 import is_count
from mamba_edu.profiling.bubbles import (
    GPU_CATEGORIES,
    analyze_trace,
    find_gaps,
    forward_range,
    forward_window,
    load_trace,
    merge_intervals,
    trace_events,
)

NOTEBOOK = "09_profiling_the_bubbles"
check = checker(NOTEBOOK)

#: Committed H200 traces the checks use when ``data/`` is present (a wheel has no ``data/``).
TRACE_CASES = ("launch_bound_1x512", "gpu_bound_8x1024")
TRACE_STRATEGIES = ("naive", "precomputed", "sync_free")


def _trace(case: str, strategy: str):
    path = data_dir() / "runs" / case / f"{strategy}.pt.trace.json.gz"
    return path if path.exists() else None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


def _same_intervals(got, want) -> bool:
    got = [tuple(iv) for iv in got]
    return len(got) == len(want) and all(
        len(g) == 2 and _close(g[0], w[0]) and _close(g[1], w[1]) for g, w in zip(got, want))


def _expected_lane(intervals, start, end, threshold):
    clipped = [(max(s, start), min(e, end)) for s, e in intervals]
    busy = merge_intervals((s, e) for s, e in clipped if s <= e)  # outside the window: nothing
    return busy, find_gaps(busy, start, end, threshold)


def _compare_lane(fn, intervals, start, end, threshold, what: str) -> None:
    busy, gaps = fn(list(intervals), start, end, threshold)
    busy, gaps = list(busy), list(gaps)
    want_busy, want_gaps = _expected_lane(intervals, start, end, threshold)
    total, want_total = sum(e - s for s, e in busy), sum(e - s for s, e in want_busy)
    if not _close(total, want_total):
        raise AssertionError(
            f"{what}: busy time {total:.3f} µs, expected {want_total:.3f} µs (the union over "
            f"streams, clipped to the window: overlapping kernels count once)")
    if not _same_intervals(busy, want_busy):
        raise AssertionError(f"{what}: busy intervals {busy[:4]}…, expected sorted disjoint "
                             f"intervals {want_busy[:4]}…")
    if not _same_intervals(gaps, want_gaps):
        raise AssertionError(
            f"{what}: {len(gaps)} gaps, expected {len(want_gaps)}: {want_gaps[:4]}… (gaps of at "
            f"least the threshold, before the first and after the last busy interval included)")


def _synthetic_lanes():
    """Hand-made lanes with the traps, then seeded random ones on three streams."""
    yield "hand-made lane", [(5, 30), (20, 40), (40, 42), (47, 50), (70, 90), (75, 80), (105, 120)], 0, 120, 5
    yield "lane starting before the window", [(-10, 3), (8, 9), (30, 60), (10, 12)], 0, 80, 5
    yield ("lane with kernels outside the window", [(0, 4), (130, 140), (12, 30), (-20, -5), (95, 130),
                                                    (110, 125), (40, 41)], 10, 100, 5)
    gen = random.Random(check_seed(9))
    for n in range(3):
        intervals = []
        for _stream in range(3):
            t = gen.uniform(0, 20)
            for _ in range(12):
                t += gen.uniform(0, 25)
                d = gen.uniform(0.5, 15)
                intervals.append((round(t, 3), round(t + d, 3)))
                t += d
        gen.shuffle(intervals)
        end = max(e for _, e in intervals) + gen.uniform(0, 10)
        yield f"random 3-stream lane {n + 1}", intervals, 0.0, end, 2.0


@exercise(NOTEBOOK, 1, "GPU busy time and bubbles of a forward", "my_gpu_lane",
          forbidden=("mamba_edu.profiling.bubbles",))
def check_gpu_lane(fn) -> str:
    """Compare ``fn(intervals, start, end, threshold) -> (busy, gaps)`` with the package."""
    for what, intervals, start, end, threshold in _synthetic_lanes():
        _compare_lane(fn, intervals, start, end, threshold, what)
    used = []
    for case in TRACE_CASES:
        path = _trace(case, "naive")
        if path is None:
            continue
        events = trace_events(load_trace(path))
        start, end, gpu = forward_window(events, forward_range(events, "prefill_forward"))
        intervals = [(e.start, e.end) for e in gpu if e.cat in GPU_CATEGORIES]
        random.Random(check_seed(0)).shuffle(intervals)  # a trace lists streams one after the other
        threshold = analyze_trace(path, "prefill_forward").threshold_us
        busy, gaps = fn(list(intervals), start, end, threshold)
        a = analyze_trace(path, "prefill_forward")
        total = sum(e - s for s, e in busy)
        if not _close(total, a.gpu_busy_us):
            raise AssertionError(f"H200 trace {case}/naive: busy {total / 1e3:.3f} ms, "
                                 f"analyze_trace says {a.gpu_busy_us / 1e3:.3f} ms")
        if not _same_intervals(gaps, [(b.start, b.end) for b in a.bubbles]):
            raise AssertionError(f"H200 trace {case}/naive: {len(gaps)} bubbles, "
                                 f"analyze_trace finds {len(a.bubbles)}")
        used.append(case)
    where = f" and on the H200 traces of {', '.join(used)}" if used else ""
    return f"union and gaps match mamba_edu.profiling.bubbles on synthetic lanes{where}"


def _event(name: str, cat: str, ts: float, dur: float, tid: int = 1, corr: int | None = None) -> dict:
    """One complete ("X") event of a hand-made trace; thread 7 is the GPU stream (pid 0)."""
    event = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1 if tid != 7 else 0,
             "tid": tid}
    if corr is not None:
        event["args"] = {"correlation": corr}
    return event


def _synthetic_trace() -> tuple[dict, int, int]:
    """A small trace with one forward and the traps around it: (trace, host waits, DtoH copies)."""
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        _event("cudaMemcpyAsync", "cuda_runtime", 2, 3, corr=1),            # the batch upload, before
        _event("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 4, 2, tid=7, corr=1),
        _event("prefill_forward", "user_annotation", 10, 200),
        _event("aten::nonzero", "cpu_op", 20, 40),
        _event("cudaLaunchKernel", "cuda_runtime", 21, 4, corr=2),
        _event("nonzero_kernel", "kernel", 26, 6, tid=7, corr=2),
        _event("cudaMemcpyAsync", "cuda_runtime", 30, 3, corr=3),            # not a wait by itself
        _event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 33, 2, tid=7, corr=3),
        _event("cudaStreamSynchronize", "cuda_runtime", 34, 20),             # wait 1
        _event("aten::item", "cpu_op", 80, 30),
        _event("cudaMemcpyAsync", "cuda_runtime", 82, 3, corr=4),
        _event("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 86, 2, tid=7, corr=4),
        _event("cudaStreamSynchronize", "cuda_runtime", 85, 10),             # wait 2
        _event("cudaMemcpy", "cuda_runtime", 120, 15, corr=5),               # wait 3: synchronous copy
        _event("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 125, 3, tid=7, corr=5),
        _event("cudaMemcpyAsync", "cuda_runtime", 150, 3, corr=6),           # an upload inside
        _event("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 160, 2, tid=7, corr=6),
        _event("cudaLaunchKernel", "cuda_runtime", 170, 4, corr=7),
        _event("gemm", "kernel", 175, 60, tid=7, corr=7),                    # outlives the range
        _event("cudaMemcpyAsync", "cuda_runtime", 200, 3, corr=9),           # launched inside, copies after
        _event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 215, 2, tid=7, corr=9),
        _event("cudaStreamSynchronize", "cuda_runtime", 100, 15, tid=2),    # another host thread's wait
        _event("cudaMemcpyAsync", "cuda_runtime", 140, 3, tid=2, corr=10),  # another thread's copy, later
        _event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 262, 2, tid=7, corr=10),
        _event("cudaDeviceSynchronize", "cuda_runtime", 212, 30),            # the caller's, after
        _event("cudaMemcpyAsync", "cuda_runtime", 250, 3, corr=8),           # logits to the host, after
        _event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 254, 2, tid=7, corr=8),
        _event("cudaStreamSynchronize", "cuda_runtime", 253, 5),
    ]
    return {"traceEvents": events}, 3, 4


def _second_forward_trace() -> tuple[dict, int, int]:
    """Two forwards, and the exercise reads the last: the first (on another thread) has its own
    wait and copy. In the second, every kind of wait (``cudaEventSynchronize`` exactly at the
    range's start, ``cudaDeviceSynchronize``, a synchronous ``cudaMemcpy`` in the ``cuda_driver``
    category), a wait exactly at the range's end (not the forward's), a copy launched just before
    the end and one launched exactly at it; the forward's GPU range (``gpu_user_annotation``, same
    name) starts later and ends later: it is not a host range. (trace, host waits, DtoH copies)."""
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        _event("prefill_forward", "user_annotation", 10, 90, tid=3),           # the first forward
        _event("cudaStreamSynchronize", "cuda_runtime", 20, 10, tid=3),
        _event("cudaMemcpyAsync", "cuda_runtime", 40, 3, tid=3, corr=1),
        _event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 44, 2, tid=7, corr=1),
        _event("prefill_forward", "user_annotation", 200, 200),                # the last one
        _event("cudaEventSynchronize", "cuda_runtime", 200, 12),               # wait 1, at the start
        _event("cudaLaunchKernel", "cuda_runtime", 220, 4, corr=2),
        _event("gdn_kernel", "kernel", 225, 20, tid=7, corr=2),
        _event("cudaDeviceSynchronize", "cuda_runtime", 250, 8),               # wait 2
        _event("cudaMemcpy", "cuda_driver", 300, 9, corr=3),                   # wait 3, copy 1
        _event("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 303, 2, tid=7, corr=3),
        _event("cudaStreamSynchronize", "cuda_runtime", 320, 6),               # wait 4
        _event("cudaMemcpyAsync", "cuda_runtime", 399.5, 0.4, corr=4),         # copy 2: launched inside
        _event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 405, 2, tid=7, corr=4),
        _event("cudaStreamSynchronize", "cuda_runtime", 400, 5),               # at the end: after it
        _event("cudaMemcpyAsync", "cuda_runtime", 400, 1, corr=5),             # launched at the end
        _event("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", 402, 2, tid=7, corr=5),
        {**_event("prefill_forward", "gpu_user_annotation", 240, 170, tid=7), "pid": 0},  # the GPU's
    ]
    return {"traceEvents": events}, 4, 2


@exercise(NOTEBOOK, 2, "count a forward's syncs in a trace", "my_trace_syncs",
          forbidden=("mamba_edu.profiling.bubbles", "mamba_edu.profiling.traces", "mamba_edu.profiling.trace_files"))
def check_trace_syncs(fn) -> str:
    """Compare ``fn(trace, range_name) -> (waits, dtoh)`` with :func:`analyze_trace`, asked after
    the answer, on a trace of its own (the answer's may have been changed)."""
    for what, make in (("hand-made trace", _synthetic_trace),
                       ("hand-made trace with two forwards", _second_forward_trace)):
        got = tuple(fn(make()[0], "prefill_forward"))
        trace, waits, dtoh = make()
        a = analyze_trace(trace, "prefill_forward")
        assert (a.n_syncs, a.n_dtoh) == (waits, dtoh), f"the {what} disagrees with the package"
        if got != (waits, dtoh):
            raise AssertionError(
                f"{what}: got (waits, dtoh) = {got}, expected {(waits, dtoh)} (count the host waits "
                f"(all four kinds, cuda_runtime or cuda_driver) of the forward's thread that start "
                f"inside the last host range (user_annotation) of that name, from its start included to "
                f"its end excluded, "
                f"and the DtoH copies that thread launched inside it, wherever they run; the caller's "
                f"synchronize after the forward, another thread's calls and the copies launched after "
                f"it are not the forward's; cudaMemcpyAsync alone does not wait)")
    used = 0
    for case in TRACE_CASES:
        for strategy in TRACE_STRATEGIES:
            path = _trace(case, strategy)
            if path is None:
                continue
            got = tuple(fn(load_trace(path), "prefill_forward"))
            a = analyze_trace(path, "prefill_forward")
            if got != (a.n_syncs, a.n_dtoh):
                raise AssertionError(f"H200 trace {case}/{strategy}: got (waits, dtoh) = {got}, "
                                     f"analyze_trace counts {(a.n_syncs, a.n_dtoh)}")
            used += 1
    where = f" and on {used} H200 traces" if used else ""
    return f"waits and DtoH copies match analyze_trace on a hand-made trace{where}"


def _idle_after(busy, t: float) -> float:
    """GPU idle from host time ``t`` until the next GPU work starts (0 if the GPU is busy at ``t``
    or nothing follows); ``busy`` is the merged GPU lane."""
    for s, e in busy:
        if s <= t < e:
            return 0.0
        if s > t:
            return s - t
    return 0.0


def _worst_wait(trace, t0: float, t1: float):
    """``(op, idle_us, start)`` of the forward's host wait starting in ``[t0, t1)`` that left the
    GPU idle longest after it returned (the earliest on a tie), or ``(None, 0.0, None)``."""
    events = trace_events(trace)
    busy = merge_intervals((e.start, e.end) for e in events if e.cat in GPU_CATEGORIES)
    best = (None, 0.0, None)
    for s in analyze_trace(trace, "prefill_forward").syncs:
        if s.kind == "wait" and t0 <= s.start < t1:
            idle = _idle_after(busy, s.end)
            if best[2] is None or idle > best[1]:
                best = (s.op, idle, s.start)
    return best


def _zoom_trace() -> dict:
    """A hand-made forward with the traps of exercise 3 (times in µs): the longest wait is not the
    costliest; a wait ends while another stream still runs (no idle); another thread's wait is
    followed by the longest idle; the waiting op sits inside a range and an aten op."""
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        _event("prefill_forward", "user_annotation", 0, 1000),
        _event("layer00.gdn", "user_annotation", 5, 300),
        _event("cudaLaunchKernel", "cuda_runtime", 6, 3, corr=1),
        _event("conv_kernel", "kernel", 10, 150, tid=7, corr=1),
        _event("track.conv", "user_annotation", 20, 200),
        _event("aten::item", "cpu_op", 25, 160),
        _event("aten::_local_scalar_dense", "cpu_op", 26, 158),
        _event("cudaMemcpyAsync", "cuda_runtime", 27, 3, corr=2),
        _event("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 160, 1, tid=7, corr=2),
        _event("cudaStreamSynchronize", "cuda_runtime", 30, 132),           # the longest wait: 132 µs
        _event("cudaLaunchKernel", "cuda_runtime", 168, 3, corr=3),
        _event("copy_kernel", "kernel", 172, 8, tid=7, corr=3),             # idle after it: 172 - 162 = 10
        _event("aten::nonzero", "cpu_op", 200, 60),
        _event("cudaStreamSynchronize", "cuda_runtime", 202, 20),           # ends at 222 ...
        _event("cudaLaunchKernel", "cuda_runtime", 300, 3, corr=4),
        _event("gdn_kernel", "kernel", 303, 100, tid=7, corr=4),             # ... idle 222 -> 303 = 81
        _event("side_kernel", "kernel", 400, 200, tid=8),                   # a second stream
        _event("layer01.gdn", "user_annotation", 410, 400),
        _event("aten::_local_scalar_dense", "cpu_op", 450, 50),
        _event("cudaStreamSynchronize", "cuda_runtime", 452, 40),           # ends at 492, side_kernel runs: 0
        _event("cudaLaunchKernel", "cuda_runtime", 700, 3, corr=5),
        _event("late_kernel", "kernel", 705, 10, tid=7, corr=5),
        _event("cudaStreamSynchronize", "cuda_runtime", 230, 10, tid=2),    # another thread: idle 303 - 240
        _event("cudaStreamSynchronize", "cuda_runtime", 620, 5, tid=2),     # another thread: idle 705 - 625
    ]
    return {"traceEvents": events}


def _second_zoom_trace() -> dict:
    """Two forwards, and the exercise reads the last (the first ran on thread 3, which waits again
    later). The last forward's waits, one of each kind (``cudaMemcpy`` in the ``cuda_driver``
    category): a tie of 45 µs idle (the earliest wins), a wait that ends exactly when a kernel
    ends (the GPU idles after it) and one that ends exactly when a kernel starts (no idle).
    :data:`SECOND_ZOOM_STRETCHES` puts waits exactly on a stretch's edges."""
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
        _event("prefill_forward", "user_annotation", 0, 100, tid=3),           # the first forward
        _event("prefill_forward", "user_annotation", 190, 410),                 # the last one
        _event("k1", "kernel", 180, 40, tid=7),                                 # ends at 220 ...
        _event("aten::item", "cpu_op", 198, 42),
        _event("cudaEventSynchronize", "cuda_runtime", 200, 20),                # ... as this wait: idle 30
        _event("k2", "kernel", 250, 20, tid=7),
        _event("aten::nonzero", "cpu_op", 298, 30),
        _event("cudaMemcpy", "cuda_driver", 300, 20),                           # idle 365 - 320 = 45
        _event("aten::first_forward_op", "cpu_op", 320, 20, tid=3),
        _event("cudaStreamSynchronize", "cuda_runtime", 330, 5, tid=3),         # thread 3: idle 30
        _event("k3", "kernel", 365, 15, tid=7),
        _event("aten::_local_scalar_dense", "cpu_op", 398, 14),
        _event("cudaStreamSynchronize", "cuda_runtime", 400, 10),               # k4 starts as it ends: 0
        _event("k4", "kernel", 410, 20, tid=7),
        _event("aten::is_nonzero", "cpu_op", 448, 24),
        _event("cudaDeviceSynchronize", "cuda_runtime", 450, 20),               # idle 515 - 470 = 45: a tie
        _event("k5", "kernel", 515, 15, tid=7),
    ]
    return {"traceEvents": events}


#: Stretches of :func:`_second_zoom_trace`: (t0, t1, what the stretch tests).
SECOND_ZOOM_STRETCHES = ((200, 500, "a tie, every wait kind"), (200, 260, "a wait at the stretch's start"),
                         (400, 450, "a wait at the stretch's end, a kernel starting as a wait ends"))


#: Stretches of the H200 traces exercise 3 reads: (case, strategy, first GDN layer index). A window
#: runs from the start of that GDN layer to the start of the GDN layer two after it (layer index -1:
#: from the forward's start to the first GDN layer).
ZOOMS = (("gpu_bound_8x1024", "naive", 3), ("gpu_bound_8x1024", "naive", 20), ("gpu_bound_8x1024", "naive", 31),
         ("launch_bound_1x512", "naive", 7), ("launch_bound_1x512", "naive", 40),
         ("gpu_bound_8x1024", "precomputed", -1), ("launch_bound_1x512", "precomputed", -1))


def _zoom_window(trace, first: int):
    events = trace_events(trace)
    fwd = forward_range(events, "prefill_forward")
    gdn = [e for e in events if e.cat == "user_annotation" and e.name.endswith(".gdn") and fwd.start <= e.start < fwd.end]
    if first < 0:
        return fwd.start, gdn[0].start, f"from the forward's start to {gdn[0].name}"
    return gdn[first].start, gdn[first + 2].start, f"{gdn[first].name} to {gdn[first + 2].name}"


def _compare_wait(fn, trace, t0, t1, what: str) -> None:
    """Ask ``fn`` about a deep copy of ``trace`` first, then work out the expected wait on ``trace``."""
    got = fn(copy.deepcopy(trace), t0, t1)
    op, idle, start = _worst_wait(trace, t0, t1)
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise AssertionError("return a tuple (op, idle_us)")
    got_op, got_idle = got
    if got_op != op:
        raise AssertionError(f"{what}: the wait that cost the GPU most was called from {op!r}; you name "
                             f"{got_op!r} (the innermost CPU op open when the wait began, on the forward's thread)")
    if isinstance(got_idle, bool) or not isinstance(got_idle, numbers.Real) or abs(float(got_idle) - idle) > 1e-3:
        raise AssertionError(f"{what}: the GPU idled {idle:.3f} µs after that wait returned; you say {got_idle!r} "
                             "(from the wait's end to the next GPU work on any stream, 0 if some stream "
                             "is still busy then)")


@exercise(NOTEBOOK, 3, "which wait cost the GPU most", "my_worst_wait",
          forbidden=("mamba_edu.profiling.bubbles", "mamba_edu.profiling.traces", "mamba_edu.profiling.trace_files"))
def check_worst_wait(fn) -> str:
    """Compare ``fn(trace, t0, t1) -> (op, idle_us)`` with the bubble analysis, on a hand-made
    forward and on stretches of the H200 traces that the notebook does not print."""
    trace = _zoom_trace()
    for t0, t1, what in ((0, 1000, "hand-made forward, whole"), (0, 300, "hand-made forward, layer00.gdn"),
                         (300, 1000, "hand-made forward, from 300 µs on")):
        _compare_wait(fn, trace, t0, t1, what)
    second = _second_zoom_trace()
    for t0, t1, what in SECOND_ZOOM_STRETCHES:
        _compare_wait(fn, second, t0, t1, f"hand-made trace with two forwards, [{t0}, {t1}) µs: {what}")
    used = 0
    for case, strategy, first in ZOOMS:
        path = _trace(case, strategy)
        if path is None:
            continue
        loaded = load_trace(path)
        t0, t1, where = _zoom_window(loaded, first)
        _compare_wait(fn, loaded, t0, t1, f"H200 trace {case}/{strategy}, {where}")
        used += 1
    where = f" and {used} stretches of H200 traces" if used else ""
    return f"the costliest wait and the GPU idle after it match the bubble analysis on a hand-made forward{where}"


# ---------------------------------------------------------------------------------------------
# Exercise 4: predict, then measure
# ---------------------------------------------------------------------------------------------

#: The strategies and stretch lengths (in GDN layers) exercise 4's check measures.
STRETCH_STRATEGIES = ("naive", "precomputed", "sync_free", "fused")
STRETCH_LAYERS = (1, 2, 5, 12)


@functools.lru_cache(maxsize=8)
def _gdn_starts_and_waits(case: str, strategy: str) -> tuple[list[float], list[float]]:
    """The start of every GDN layer's range and of every host wait of the forward in ``case/strategy``."""
    path = _trace(case, strategy)
    if path is None:
        raise AssertionError(f"the H200 trace {case}/{strategy} is not there (data/runs): this prediction is "
                             "measured on the recorded traces, which an installed wheel does not have")
    loaded = load_trace(path)
    events = trace_events(loaded)
    fwd = forward_range(events, "prefill_forward")
    gdn = [e.start for e in events if e.cat == "user_annotation" and e.name.endswith(".gdn")
           and fwd.start <= e.start < fwd.end]
    return gdn, [s.start for s in analyze_trace(loaded, "prefill_forward").syncs if s.kind == "wait"]


def measured_stretch_waits(case: str, strategy: str, first: int, n: int) -> int:
    """Host waits of the forward's thread that start in ``[start of GDN layer first, start of GDN
    layer first + n)`` of the H200 trace ``case/strategy``."""
    gdn, waits = _gdn_starts_and_waits(case, strategy)
    return sum(gdn[first] <= t < gdn[first + n] for t in waits)


@exercise(NOTEBOOK, 4, "predict the waits in a stretch of layers", "my_stretch_waits",
          forbidden=("mamba_edu.profiling", "mamba_edu.benchmarks"))
def check_stretch_waits(fn) -> str:
    """``fn(strategy, n)`` must equal the waits counted in stretches of ``n`` GDN layers of both
    H200 cases (starting layers drawn per grading run), exactly."""
    rng = random.Random(check_seed(4))
    for strategy in STRETCH_STRATEGIES:
        for n in STRETCH_LAYERS:
            said = fn(strategy, n)
            if not is_count(said):
                raise AssertionError(f"the prediction for {strategy}, {n} GDN layers is {said!r:.60}; expected "
                                     "a whole number of waits (an int)")
            for case, n_gdn in (("gpu_bound_8x1024", 36), ("launch_bound_1x512", 45)):
                first = rng.randrange(0, n_gdn - n)
                got = measured_stretch_waits(case, strategy, first, n)
                if said != got:
                    raise AssertionError(
                        f"{strategy}, {n} GDN layer{'s' * (n != 1)} (H200 trace {case}, from GDN layer {first} to "
                        f"the start of GDN layer {first + n}): you predicted {said} host waits, the trace holds "
                        f"{got} (tolerance 0)")
    return (f"your prediction equals the host waits counted in stretches of {', '.join(map(str, STRETCH_LAYERS))} "
            f"GDN layers of both H200 cases, for {', '.join(STRETCH_STRATEGIES)} (tolerance 0)")
