"""Holistic Trace Analysis (HTA, ``pip install holistictraceanalysis`` or ``.[hta]``) as a second
opinion on our idle figures, on the committed launch-bound naive trace. Skipped without HTA.

On ``data/runs/launch_bound_1x512/naive.pt.trace.json.gz`` HTA's temporal breakdown reports more
idle time than :func:`mamba_edu.profiling.analyze_trace` (notebook 09 prints both). The whole
difference has two causes, each checked here:

1. **Rounding.** HTA's parser rounds every event of a nanosecond-resolution trace inward to whole
   microseconds (start up, end down; "issue with events overlapping", pytorch PR 122425). Most
   kernels of this forward last a few µs, and each GPU event loses up to 2 µs: HTA sees over 1 ms
   less GPU work. With ``HTA_DISABLE_NS_ROUNDING=1`` its busy time is ours, and our analysis of
   the rounded trace gives its figure.
2. **The span.** HTA divides by the time from the first GPU event to the last; we divide by the
   forward's window, from the start of its ``prefill_forward`` range. The time before the first
   kernel is idle for us and outside the span for HTA.
"""

import math
import shutil

import pytest

from mamba_edu import data_dir
from mamba_edu.profiling import analyze_trace, load_trace
from mamba_edu.profiling.bubbles import GPU_CATEGORIES

pytest.importorskip(
    "hta", reason="HTA is optional: pip install -r requirements-ci.txt (.ci/run does) or .[hta]")

TRACE = data_dir() / "runs" / "launch_bound_1x512" / "naive.pt.trace.json.gz"
pytestmark = [pytest.mark.extra, pytest.mark.skipif(not TRACE.exists(), reason="data/ is not in this checkout")]


def hta_breakdown(tmp_path, monkeypatch, rounding: bool) -> dict:
    """HTA's temporal breakdown of the trace (one rank), as a dict of floats in µs and %."""
    from hta.trace_analysis import TraceAnalysis

    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "0" if rounding else "1")
    folder = tmp_path / ("rounded" if rounding else "exact")
    folder.mkdir()
    shutil.copy(TRACE, folder)  # HTA reads a folder of per-rank traces
    row = TraceAnalysis(trace_dir=str(folder)).get_temporal_breakdown(visualize=False).iloc[0]
    busy = row["compute_time(us)"] + row["non_compute_time(us)"]
    return {"idle_us": row["idle_time(us)"], "busy_us": busy, "span_us": row["kernel_time(us)"],
            "idle_pct": row["idle_time_pctg"]}


def rounded_inward(trace: dict) -> dict:
    """The trace with every GPU event rounded as HTA's parser does: start up, end down (µs)."""
    events = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES:
            start, end = math.ceil(e["ts"]), math.floor(e["ts"] + e["dur"])
            # an event shorter than the rounding becomes empty here; HTA keeps its negative
            # duration (-1 us) and adds it to its busy time: see negative_after_rounding
            e = {**e, "ts": start, "dur": max(end - start, 0)}
        events.append(e)
    return {**trace, "traceEvents": events}


def negative_after_rounding(trace: dict) -> int:
    """The durations (us, each -1) of the GPU events that rounding inward turns negative."""
    return sum(min(math.floor(e["ts"] + e["dur"]) - math.ceil(e["ts"]), 0)
               for e in trace["traceEvents"]
               if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES)


def test_hta_agrees_without_rounding_and_the_span_explains_the_rest(tmp_path, monkeypatch):
    ours = analyze_trace(TRACE)
    hta = hta_breakdown(tmp_path, monkeypatch, rounding=False)
    # Same GPU work: the union of kernels, copies and memsets over all streams.
    assert hta["busy_us"] == pytest.approx(ours.gpu_busy_us, abs=0.1)
    # HTA's span runs from the first GPU event to the last; our window starts with the range.
    first_gpu, last_gpu = ours.gpu_busy[0][0], ours.gpu_busy[-1][1]
    assert hta["span_us"] == pytest.approx(last_gpu - first_gpu, abs=0.1)
    lead = first_gpu - ours.start  # idle before the first kernel: ours only
    assert 0 < lead < 500 and last_gpu == ours.end
    assert hta["idle_us"] == pytest.approx(ours.idle_us - lead, abs=0.1)
    assert hta["idle_pct"] == pytest.approx(100 * hta["idle_us"] / hta["span_us"], abs=0.01)


def test_hta_default_rounding_reports_more_idle_time(tmp_path, monkeypatch):
    ours = analyze_trace(TRACE)
    hta = hta_breakdown(tmp_path, monkeypatch, rounding=True)
    assert hta["idle_pct"] > 100 * ours.idle_fraction
    # Our analysis of the inward-rounded trace sees HTA's GPU work exactly.
    trace = load_trace(TRACE)
    rounded = analyze_trace(rounded_inward(trace))
    assert hta["busy_us"] == pytest.approx(rounded.gpu_busy_us + negative_after_rounding(trace),
                                           abs=0.5)
    assert ours.gpu_busy_us - hta["busy_us"] > 1000  # over 1 ms of GPU work lost to rounding
    n_gpu = sum(1 for e in load_trace(TRACE)["traceEvents"] if e.get("cat") in GPU_CATEGORIES)
    lost = ours.gpu_busy_us - hta["busy_us"]
    assert n_gpu * 0.5 < lost < 2 * n_gpu  # start rounded up, end down: under 2 µs per event
