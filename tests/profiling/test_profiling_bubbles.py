"""Bubble analysis on hand-made traces whose gaps, busy time and syncs are known exactly."""

import gzip
import json

import pytest

from mamba_edu.profiling.bubbles import analyze_trace, find_gaps, load_trace, merge_intervals
from mamba_edu.profiling.plots import plot_strategy_bars, plot_timeline, plot_timelines

MAIN, OTHER = (1, 1), (1, 2)  # (pid, tid) of the forward's thread and of another thread


def ev(name, cat, ts, dur, thread=MAIN, corr=None, **args):
    if corr is not None:
        args["correlation"] = corr
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur,
            "pid": thread[0], "tid": thread[1], "args": args}


def naive_layer_trace(offset=0.0):
    """One forward of 0–100 µs on the CPU whose GPU work ends at 120 µs (times in µs).

    GPU: K1 [5,30] on stream 7 and K2 [20,40] on stream 8 overlap; the DtoH copy [40,42] that
    ``aten::nonzero`` waits for in ``cudaStreamSynchronize`` [24,58]; K3 [70,90]; K4 [105,120],
    launched at 95, inside the range, so it belongs to the forward; the caller then waits for it
    in its own ``cudaDeviceSynchronize``, which is not a sync of the forward. Union: [5,42]
    [70,90] [105,120] = 72 µs busy, gaps [0,5] [42,70] [90,105] = 48 µs idle.
    """
    o = offset
    gpu = dict(thread=(0, 7))
    events = [
        ev("prefill_forward", "user_annotation", o + 0, 100),
        ev("prefill_forward", "gpu_user_annotation", o + 0, 120, thread=(0, 7)),
        ev("aten::mm", "cpu_op", o + 0, 10),
        ev("cudaLaunchKernel", "cuda_runtime", o + 2, 2, corr=o + 1),
        ev("K1", "kernel", o + 5, 25, corr=o + 1, stream=7, **gpu),
        ev("aten::mm", "cpu_op", o + 10, 10),
        ev("cudaLaunchKernel", "cuda_runtime", o + 12, 2, corr=o + 2),
        ev("K2", "kernel", o + 20, 20, corr=o + 2, stream=8, thread=(0, 8)),
        ev("aten::nonzero", "cpu_op", o + 20, 40),
        ev("cudaMemcpyAsync", "cuda_runtime", o + 22, 2, corr=o + 3),
        ev("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", o + 40, 2, corr=o + 3, **gpu),
        ev("cudaStreamSynchronize", "cuda_runtime", o + 24, 34),
        ev("aten::add", "cpu_op", o + 60, 10),
        ev("cudaLaunchKernel", "cuda_runtime", o + 62, 2, corr=o + 4),
        ev("K3", "kernel", o + 70, 20, corr=o + 4, **gpu),
        ev("aten::mul", "cpu_op", o + 93, 6),
        ev("cudaLaunchKernel", "cuda_runtime", o + 95, 2, corr=o + 5),
        ev("K4", "kernel", o + 105, 15, corr=o + 5, **gpu),
        ev("cudaDeviceSynchronize", "cuda_runtime", o + 30, 10, thread=OTHER),  # not ours
        ev("cudaDeviceSynchronize", "cuda_runtime", o + 100, 21),  # the caller's, after the range
    ]
    return {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {}}, *events]}


def test_merge_and_gaps():
    assert merge_intervals([(5, 30), (20, 40), (40, 42), (70, 90)]) == [(5, 42), (70, 90)]
    assert find_gaps([(5, 42), (70, 90)], 0, 100, 5) == [(0, 5), (42, 70), (90, 100)]
    assert find_gaps([(5, 42), (70, 90)], 0, 100, 11) == [(42, 70)]
    assert find_gaps([], 0, 10, 1) == [(0, 10)]


def test_exact_busy_idle_and_bubbles():
    a = analyze_trace(naive_layer_trace(), "prefill_forward", threshold_us=5)
    assert (a.start, a.end) == (0, 120)  # extended to the last GPU event the range launched
    assert a.gpu_busy == [(5, 42), (70, 90), (105, 120)]  # overlap on two streams counted once
    assert a.gpu_busy_us == 72 and a.idle_us == 48
    assert a.idle_fraction == pytest.approx(48 / 120)
    assert [(b.start, b.end) for b in a.bubbles] == [(0, 5), (42, 70), (90, 105)]
    assert a.bubble_us == 48

    wider = analyze_trace(naive_layer_trace(), threshold_us=10)
    assert [b.duration for b in wider.bubbles] == [28, 15]
    assert wider.bubble_us == 43 and wider.idle_us == 48  # idle counts every gap


def test_bubbles_are_blamed_on_the_innermost_cpu_op():
    a = analyze_trace(naive_layer_trace())
    first, sync, tail = a.bubbles
    assert sync.cause == "aten::nonzero → cudaStreamSynchronize"
    assert sync.stack == ("prefill_forward", "aten::nonzero", "cudaStreamSynchronize")
    assert first.op == "aten::mm" and first.runtime is None
    assert tail.cause == "prefill_forward"  # plain Python between ops


def test_syncs_of_the_forward_only():
    a = analyze_trace(naive_layer_trace())
    assert [(s.name, s.kind, s.op) for s in a.syncs] == [
        ("cudaStreamSynchronize", "wait", "aten::nonzero"),
        ("Memcpy DtoH (Device -> Pinned)", "dtoh", "aten::nonzero"),
    ]
    assert (a.n_syncs, a.n_dtoh) == (1, 1)
    assert a.summary()["syncs"] == 1


def test_picks_one_forward_among_several():
    trace = naive_layer_trace()
    trace["traceEvents"] += naive_layer_trace(offset=1000)["traceEvents"][1:]
    first, last = analyze_trace(trace, index=0), analyze_trace(trace)
    assert (first.start, first.end) == (0, 120)
    assert (last.start, last.end) == (1000, 1120)
    assert last.gpu_busy_us == first.gpu_busy_us == 72


def test_trace_without_correlation_ids_uses_overlap():
    trace = naive_layer_trace()
    for e in trace["traceEvents"]:
        e.get("args", {}).pop("correlation", None)
    a = analyze_trace(trace)
    assert a.end == 100 and a.gpu_busy == [(5, 42), (70, 90)]  # K4 starts after the range


def test_missing_range_is_a_clear_error():
    with pytest.raises(ValueError, match="no CPU range named 'decode'"):
        analyze_trace(naive_layer_trace(), "decode")


def test_loads_plain_and_gzipped(tmp_path):
    trace = naive_layer_trace()
    (tmp_path / "t.json").write_text(json.dumps(trace))
    with gzip.open(tmp_path / "t.json.gz", "wt") as f:
        json.dump(trace, f)
    assert load_trace(tmp_path / "t.json") == load_trace(tmp_path / "t.json.gz") == trace
    assert analyze_trace(tmp_path / "t.json.gz").gpu_busy_us == 72


def test_figures_are_written(tmp_path):
    before = analyze_trace(naive_layer_trace(), label="naive")
    after = analyze_trace(naive_layer_trace(), label="sync_free")
    paths = [tmp_path / "one.png", tmp_path / "rows.png", tmp_path / "bars.png"]
    plot_timeline(before, paths[0])
    fig = plot_timelines([before, after], paths[1], title="before / after")
    assert len(fig.axes) == 2
    plot_strategy_bars(["naive", "sync_free"], [0.12, 0.08], [0.072, None], [1, 0], paths[2])
    assert all(p.stat().st_size > 1000 for p in paths)
