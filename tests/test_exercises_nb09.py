"""Notebook 09's checks reject the plausible wrong answers and call a stub "not done"."""

import pytest

from mamba_edu.exercises.core import FAIL, NOT_DONE, PASS, judge, lookup
from mamba_edu.exercises.nb09 import NOTEBOOK

WAITS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}


def stub(*args):
    raise NotImplementedError("hint: …")


def merged(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def gaps_of(busy, start, end, keep):
    edges = [start] + [t for iv in busy for t in iv] + [end]
    return [(a, b) for a, b in zip(edges[0::2], edges[1::2]) if keep(b - a) and b > a]


def lane(clip=True, union=True, keep=lambda d, th: d >= th, ends=True):
    """A GPU-lane answer with one mistake switched on."""
    def fn(intervals, start, end, threshold):
        ivs = [(max(s, start), min(e, end)) if clip else (s, e) for s, e in intervals]
        busy = merged(ivs) if union else sorted(ivs)  # no union: overlaps counted twice
        gaps = gaps_of(merged(ivs), start, end, lambda d: keep(d, threshold))
        if not ends:
            gaps = [g for g in gaps if g[0] != start and g[1] != end]
        return busy, gaps
    return fn


def syncs(all_waits=False, async_copies=False, all_dtoh=False):
    """A sync-counting answer with one mistake switched on."""
    def fn(trace, range_name="prefill_forward"):
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        fwd = [e for e in events if e["name"] == range_name][-1]
        t0, t1 = fwd["ts"], fwd["ts"] + fwd["dur"]
        thread = (fwd["pid"], fwd["tid"])
        runtime = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")]
        inside = [e for e in runtime if (e["pid"], e["tid"]) == thread and t0 <= e["ts"] < t1]
        names = WAITS | {"cudaMemcpyAsync"} if async_copies else WAITS
        waits = sum(e["name"] in names for e in (runtime if all_waits else inside))
        launched = {(e.get("args") or {}).get("correlation") for e in inside}
        dtoh = sum(e.get("cat") == "gpu_memcpy" and e["name"].startswith("Memcpy DtoH")
                   and (all_dtoh or (e.get("args") or {}).get("correlation") in launched)
                   for e in events)
        return waits, dtoh
    return fn


def test_reference_answers_pass():
    assert judge(lookup(NOTEBOOK, 1), lane()).status == PASS
    assert judge(lookup(NOTEBOOK, 2), syncs()).status == PASS


@pytest.mark.parametrize("wrong", [
    lane(union=False),                                  # summing durations without the union
    lane(clip=False),                                   # busy time outside the forward's window
    lane(keep=lambda d, th: d > th),                    # a gap exactly at the threshold dropped
    lane(ends=False),                                   # idle time before the first kernel ignored
])
def test_gpu_lane_rejects_wrong_answers(wrong):
    verdict = judge(lookup(NOTEBOOK, 1), wrong)
    assert verdict.status == FAIL, verdict.line()


def test_gpu_lane_names_the_union():
    assert "union" in judge(lookup(NOTEBOOK, 1), lane(union=False)).message


@pytest.mark.parametrize("wrong", [
    syncs(all_waits=True),      # the caller's synchronize after the forward counted
    syncs(async_copies=True),   # every cudaMemcpyAsync counted as a wait (uploads do not wait)
    syncs(all_dtoh=True),       # copies launched after the forward counted
])
def test_trace_syncs_rejects_wrong_answers(wrong):
    verdict = judge(lookup(NOTEBOOK, 2), wrong)
    assert verdict.status == FAIL, verdict.line()


@pytest.mark.parametrize("number", [1, 2])
def test_stub_is_not_done(number):
    assert judge(lookup(NOTEBOOK, number), stub).status == NOT_DONE
