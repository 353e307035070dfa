"""Notebook 09's checks reject plausible wrong answers (stubs: test_exercise_stubs.py).

Every answer is judged through the grader's own path (:func:`exercise_judge.judge_answer`), so the
judge makes the forbidden functions absent (the package's own bubble analysis) as in ``mamba_edu grade``.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from exercise_judge import judge_answer

from mamba_edu.profiling.bubbles import analyze_trace, find_gaps

from mamba_edu.exercises.core import FAIL, PASS
from mamba_edu.exercises.nb09 import NOTEBOOK

NB = NOTEBOOK
WAITS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}
GPU = ("kernel", "gpu_memcpy", "gpu_memset")


# --- exercise 1: the GPU lane --------------------------------------------------------------------

def merged(intervals, touching=True):
    out = []
    for s, e in sorted(intervals):
        if out and (s <= out[-1][1] if touching else s < out[-1][1]):
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def lane(clip=True, union=True, keep=lambda d, th: d >= th, ends=True, drop_empty=True, touching=True,
         gaps_from=merged):
    """A GPU-lane answer with one mistake switched on."""
    def my_gpu_lane(intervals, start, end, threshold):
        ivs = [(max(s, start), min(e, end)) if clip else (s, e) for s, e in intervals]
        if drop_empty:
            ivs = [(s, e) for s, e in ivs if s <= e]
        busy = merged(ivs, touching) if union else sorted(ivs)  # no union: overlaps counted twice
        edges = [start] + [t for iv in gaps_from(ivs) for t in iv] + [end]
        gaps = [(a, b) for a, b in zip(edges[0::2], edges[1::2]) if keep(b - a, threshold) and b > a]
        if not ends:
            gaps = [g for g in gaps if g[0] != start and g[1] != end]
        return busy, gaps
    return my_gpu_lane


def lane_by_the_package(intervals, start, end, threshold):
    from mamba_edu.profiling.bubbles import find_gaps, merge_intervals
    busy = merge_intervals((max(s, start), min(e, end)) for s, e in intervals if min(e, end) >= max(s, start))
    return busy, find_gaps(busy, start, end, threshold)


def lane_sorted_by_end(intervals, start, end, threshold):
    """Merges the intervals in the order of their ends: a nested short kernel comes first."""
    busy = []
    for s, e in sorted(((max(s, start), min(e, end)) for s, e in intervals), key=lambda iv: iv[1]):
        if s > e:
            continue
        if busy and s <= busy[-1][1]:
            busy[-1] = (busy[-1][0], max(busy[-1][1], e))
        else:
            busy.append((s, e))
    edges = [start] + [t for iv in busy for t in iv] + [end]
    return busy, [(a, b) for a, b in zip(edges[0::2], edges[1::2]) if b - a >= threshold and b > a]


def lane_inside_only(intervals, start, end, threshold):
    """Keeps only the intervals wholly inside the window instead of clipping them."""
    return lane()([(s, e) for s, e in intervals if start <= s and e <= end], start, end, threshold)


def lane_in_a_thread(intervals, start, end, threshold):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lane_by_the_package, intervals, start, end, threshold).result()


gaps_of = find_gaps  # the package's function under another name


def lane_renamed(intervals, start, end, threshold):
    busy = merged([(max(s, start), min(e, end)) for s, e in intervals if min(e, end) >= max(s, start)])
    return busy, gaps_of(busy, start, end, threshold)


WRONG_1 = {
    "intervals merged in the order of their ends": lane_sorted_by_end,
    "intervals that cross the window's edge dropped, not clipped": lane_inside_only,
    "the forbidden calls in a worker thread": lane_in_a_thread,
    "find_gaps renamed": lane_renamed,
    "durations summed without the union": lane(union=False),
    "busy time outside the forward's window": lane(clip=False),
    "a gap exactly at the threshold dropped": lane(keep=lambda d, th: d > th),
    "idle time before the first and after the last kernel ignored": lane(ends=False),
    "intervals outside the window kept as negative stretches": lane(drop_empty=False),
    "touching intervals kept apart (s < end, not s <= end)": lane(touching=False),
    "gaps read between the sorted intervals, not their union": lane(gaps_from=sorted),
    "the forbidden call: merge_intervals / find_gaps": lane_by_the_package,
}


def test_gpu_lane_accepts_the_right_answer():
    verdict = judge_answer(NB, 1, lane())
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_1))
def test_gpu_lane_rejects(mistake):
    verdict = judge_answer(NB, 1, WRONG_1[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_gpu_lane_messages():
    assert "union" in judge_answer(NB, 1, lane(union=False)).message
    assert "kernels outside the window" in judge_answer(NB, 1, lane(drop_empty=False)).message


# --- exercise 2: a forward's syncs in a trace ------------------------------------------------------

def syncs(all_waits=False, async_copies=False, all_dtoh=False, window_dtoh=False, any_thread=False,
          which=-1, waits=WAITS, categories=("cuda_runtime", "cuda_driver"),
          inside=lambda t0, ts, t1: t0 <= ts < t1, range_categories=("user_annotation",)):
    """A sync-counting answer with one mistake switched on (``range_categories=None``: the range
    found by its name whatever its category)."""
    def my_trace_syncs(trace, range_name="prefill_forward"):
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        fwd = [e for e in events if e["name"] == range_name
               and (range_categories is None or e.get("cat") in range_categories)][which]
        t0, t1 = fwd["ts"], fwd["ts"] + fwd["dur"]
        thread = (fwd["pid"], fwd["tid"])
        runtime = [e for e in events if e.get("cat") in categories]
        mine = [e for e in runtime if (any_thread or (e["pid"], e["tid"]) == thread) and inside(t0, e["ts"], t1)]
        names = waits | {"cudaMemcpyAsync"} if async_copies else waits
        n_waits = sum(e["name"] in names for e in (runtime if all_waits else mine))
        launched = {(e.get("args") or {}).get("correlation") for e in mine}
        if window_dtoh:       # the copies that run inside the range, whoever launched them
            dtoh = sum(e.get("cat") == "gpu_memcpy" and e["name"].startswith("Memcpy DtoH") and t0 <= e["ts"] < t1
                       for e in events)
        else:
            dtoh = sum(e.get("cat") == "gpu_memcpy" and e["name"].startswith("Memcpy DtoH")
                       and (all_dtoh or (e.get("args") or {}).get("correlation") in launched)
                       for e in events)
        return n_waits, dtoh
    return my_trace_syncs


def syncs_by_the_package(trace, range_name="prefill_forward"):
    from mamba_edu.profiling.bubbles import analyze_trace
    a = analyze_trace(trace, range_name)
    return a.n_syncs, a.n_dtoh


def syncs_in_a_thread(trace, range_name="prefill_forward"):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(syncs_by_the_package, trace, range_name).result()


WRONG_2 = {
    "the forbidden call in a worker thread": syncs_in_a_thread,
    "the caller's synchronize after the forward counted": syncs(all_waits=True),
    "every cudaMemcpyAsync counted as a wait": syncs(async_copies=True),
    "copies launched after the forward counted": syncs(all_dtoh=True),
    "DtoH counted by time window, no thread filter": syncs(window_dtoh=True),
    "another host thread's waits and copies counted": syncs(any_thread=True),
    "the first range of that name, not the last": syncs(which=0),
    "only cudaStreamSynchronize counted as a wait": syncs(waits={"cudaStreamSynchronize"}),
    "cuda_runtime only, the cuda_driver calls missed": syncs(categories=("cuda_runtime",)),
    "a call exactly at the range's start left out": syncs(inside=lambda t0, ts, t1: t0 < ts < t1),
    "a call exactly at the range's end counted": syncs(inside=lambda t0, ts, t1: t0 <= ts <= t1),
    "the forbidden call: analyze_trace": syncs_by_the_package,
    "the range found by name, the GPU's annotation taken": syncs(range_categories=None),
}


def test_trace_syncs_accepts_the_right_answer():
    verdict = judge_answer(NB, 2, syncs())
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_2))
def test_trace_syncs_rejects(mistake):
    verdict = judge_answer(NB, 2, WRONG_2[mistake])
    assert verdict.status == FAIL, verdict.line()


# --- exercise 3: which wait cost the GPU most ----------------------------------------------------------

def worst_wait(longest=False, own_duration=False, runtime_name=False, outermost=False, any_thread=False,
               always_next=False, until_launch=False, which=-1, kinds=WAITS, later_on_tie=False,
               running=lambda s, t, e: s <= t < e, in_stretch=lambda t0, ts, t1: t0 <= ts < t1):
    """A reading of a zoomed stretch with one mistake switched on."""
    def my_worst_wait(trace, t0, t1):
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        fwd = [e for e in events if e["name"] == "prefill_forward" and e.get("cat") in ("user_annotation", "cpu_op")][which]
        mine = (fwd.get("pid"), fwd.get("tid"))
        thread = [e for e in events if any_thread or (e.get("pid"), e.get("tid")) == mine]
        gpu = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in GPU]
        launches = [e["ts"] for e in thread if e["name"] == "cudaLaunchKernel"]
        cpu = [e for e in events if (e.get("pid"), e.get("tid")) == mine and e.get("cat") in ("cpu_op", "user_annotation")]
        waits = sorted((e for e in thread if e.get("cat") in ("cuda_runtime", "cuda_driver")
                        and e["name"] in kinds and in_stretch(t0, e["ts"], t1)), key=lambda e: e["ts"])
        best, best_score = (None, 0.0), None
        for w in waits:
            t = w["ts"] + w["dur"]
            nxt = [ts for ts in launches if ts > t] if until_launch else [s for s, e in gpu if s > t]
            busy = not always_next and any(running(s, t, e) for s, e in gpu)
            idle = w["dur"] if own_duration else (0.0 if busy or not nxt else min(nxt) - t)
            open_ops = [e for e in cpu if e["ts"] <= w["ts"] < e["ts"] + e["dur"]]
            pick = min if outermost else max
            op = w["name"] if runtime_name else (pick(open_ops, key=lambda e: (e["ts"], -e["dur"]))["name"]
                                                 if open_ops else None)
            score = w["dur"] if longest else idle
            if best_score is None or score > best_score or (later_on_tie and score == best_score):
                best, best_score = (op, idle), score
        return best
    return my_worst_wait


def worst_wait_by_the_package(trace, t0, t1):
    from mamba_edu.profiling.bubbles import analyze_trace
    a = analyze_trace(trace, "prefill_forward")
    best = (None, 0.0)
    for s in a.syncs:
        if s.kind == "wait" and t0 <= s.start < t1:
            idle = next((b[0] - s.end for b in a.gpu_busy if b[0] > s.end), 0.0)
            if idle > best[1]:
                best = (s.op, idle)
    return best


analyze = analyze_trace  # the package's function under another name


def worst_wait_renamed(trace, t0, t1):
    a = analyze(trace, "prefill_forward")
    best = (None, 0.0)
    for s in a.syncs:
        if s.kind == "wait" and t0 <= s.start < t1:
            idle = next((b[0] - s.end for b in a.gpu_busy if b[0] > s.end), 0.0)
            if idle > best[1]:
                best = (s.op, idle)
    return best


WRONG_3 = {
    "analyze_trace renamed": worst_wait_renamed,
    "the longest wait, not the costliest": worst_wait(longest=True),
    "the wait's own duration as the GPU's idle": worst_wait(own_duration=True),
    "the CUDA call (cudaStreamSynchronize) named, not the op": worst_wait(runtime_name=True),
    "the outermost range named, not the innermost op": worst_wait(outermost=True),
    "another host thread's waits counted": worst_wait(any_thread=True),
    "a stream still busy when the wait ends ignored": worst_wait(always_next=True),
    "idle until the host's next launch, not the GPU's next work": worst_wait(until_launch=True),
    "the first forward range, not the last": worst_wait(which=0),
    "only cudaStreamSynchronize taken as a wait": worst_wait(kinds={"cudaStreamSynchronize"}),
    "the later wait on a tie": worst_wait(later_on_tie=True),
    "a kernel ending exactly as the wait ends counted as running": worst_wait(running=lambda s, t, e: s <= t <= e),
    "a kernel starting exactly as the wait ends not counted as running": worst_wait(running=lambda s, t, e: s < t < e),
    "a wait exactly at the stretch's start left out": worst_wait(in_stretch=lambda t0, ts, t1: t0 < ts < t1),
    "a wait exactly at the stretch's end taken": worst_wait(in_stretch=lambda t0, ts, t1: t0 <= ts <= t1),
    "the forbidden call: analyze_trace": worst_wait_by_the_package,
}


@pytest.mark.parametrize("kind", [float, np.int64, np.float64, np.float32],
                         ids=["float", "numpy int64", "numpy float64", "numpy float32"])
def test_worst_wait_accepts_the_right_answer(kind):
    """The idle time as the learner's arithmetic leaves it (numpy on integer timestamps: np.int64)."""
    def answer(trace, t0, t1):
        op, idle = worst_wait()(trace, t0, t1)
        return op, kind(idle) if float(idle).is_integer() or kind is not np.int64 else idle
    verdict = judge_answer(NB, 3, answer)
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_3))
def test_worst_wait_rejects(mistake):
    verdict = judge_answer(NB, 3, WRONG_3[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_worst_wait_messages():
    assert "aten::nonzero" in judge_answer(NB, 3, worst_wait(longest=True)).message
    assert "mamba_edu.profiling.bubbles" in judge_answer(NB, 3, worst_wait_by_the_package).message


# --- exercise 4: predict the waits in a stretch of layers --------------------------------------------

def stretch_waits(strategy, n):
    return 3 * n if strategy == "naive" else 0    # any + nonzero + any in every GDN layer


WRONG_4 = {
    "two waits per GDN layer (the two any())": lambda strategy, n: 2 * n if strategy == "naive" else 0,
    "one wait per GDN layer": lambda strategy, n: n if strategy == "naive" else 0,
    "the per-forward waits counted in the stretch": lambda strategy, n: 9 + 3 * n if strategy == "naive" else 0,
    "a fencepost: n + 1 layers": lambda strategy, n: 3 * (n + 1) if strategy == "naive" else 0,
    "precomputed still waits in every layer": lambda strategy, n: 3 * n if strategy in ("naive", "precomputed") else 0,
    "precomputed's once-per-forward waits put in the stretch": lambda strategy, n: {"naive": 3 * n, "precomputed": 11}.get(strategy, 0),
    "sync_free's tracking counted as one wait per layer": lambda strategy, n: {"naive": 3 * n, "sync_free": n}.get(strategy, 0),
    "the same count whatever the strategy": lambda strategy, n: 3 * n,
    "a float": lambda strategy, n: float(stretch_waits(strategy, n)),
    "the waits of the forward, not the stretch": lambda strategy, n: {"naive": 117, "precomputed": 11}.get(strategy, 0),
}


@pytest.mark.parametrize("kind", [int, np.int64], ids=["int", "numpy int64"])
def test_stretch_waits_accepts_the_right_answer(kind):
    verdict = judge_answer(NB, 4, lambda strategy, n: kind(stretch_waits(strategy, n)))
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_4))
def test_stretch_waits_rejects(mistake):
    verdict = judge_answer(NB, 4, WRONG_4[mistake])
    assert verdict.status == FAIL, verdict.line()
