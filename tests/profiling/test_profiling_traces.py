"""Recording a real (CPU) trace, trimming it to one forward, and analysing and drawing it."""

import torch

from mamba_edu.profiling.bubbles import analyze_trace, load_trace, trace_events
from mamba_edu.profiling.plots import plot_timeline
from mamba_edu.profiling.traces import record_trace, trim_trace


def tracked_rows(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A stand-in for naive tracking: ops that would sync on a GPU."""
    rows = mask.nonzero().squeeze(1)
    return x[rows].sum() + x[mask].sum()


def record(tmp_path, active=1):
    x, mask = torch.randn(64), torch.arange(64) % 3 == 0
    calls = []

    def forward(batch):
        calls.append(batch)
        tracked_rows(x, mask)

    rec = record_trace(forward, tmp_path / "traces", "naive", setup=lambda: len(calls),
                       active=active, tensorboard_dir=tmp_path / "runs")
    return rec, calls


def count(trace, name):
    return sum(e.get("ph") == "X" and e["name"] == name for e in trace["traceEvents"])


def test_record_writes_chrome_and_tensorboard_layouts(tmp_path):
    rec, calls = record(tmp_path)
    assert calls == [0, 1, 2]  # wait + warmup + active calls, each with its own setup()
    assert rec.chrome_trace.name == "naive.json.gz" and rec.chrome_trace.stat().st_size > 0
    (tb_file,) = rec.tensorboard_run.glob("naive.*.pt.trace.json.gz")  # the plugin's file pattern
    assert load_trace(tb_file) == load_trace(rec.chrome_trace)


def test_real_cpu_trace_is_analysed(tmp_path):
    rec, _ = record(tmp_path)
    a = analyze_trace(rec.chrome_trace, rec.range_name, label="naive")
    assert a.wall_us > 0 and a.cpu_busy
    assert a.gpu_busy == [] and a.idle_fraction == 1.0  # no GPU: the whole forward is idle
    names = {e.name for e in trace_events(load_trace(rec.chrome_trace))}
    assert {"aten::nonzero", "aten::index"} <= names
    path = tmp_path / "timeline.png"
    plot_timeline(a, path)
    assert path.stat().st_size > 1000


def test_trim_keeps_one_forward(tmp_path):
    rec, _ = record(tmp_path, active=2)
    full = load_trace(rec.chrome_trace)
    out = trim_trace(full, tmp_path / "one.json.gz", index=0, margin_us=0)
    trimmed = load_trace(out)
    assert count(full, "prefill_forward") == 2 and count(trimmed, "prefill_forward") == 1
    assert count(trimmed, "aten::nonzero") == count(full, "aten::nonzero") // 2
    assert {e["name"] for e in trimmed["traceEvents"] if e.get("ph") == "M"} >= {"process_name"}
    assert trimmed["deviceProperties"] == full["deviceProperties"]
    first = analyze_trace(full, index=0)
    assert analyze_trace(trimmed).summary() == first.summary()


def test_trim_can_drop_short_cpu_ops(tmp_path):
    rec, _ = record(tmp_path)
    full = load_trace(rec.chrome_trace)
    lean = load_trace(trim_trace(full, tmp_path / "lean.json.gz", min_cpu_us=1e9))
    assert count(lean, "aten::nonzero") == 0 and count(lean, "prefill_forward") == 1


def test_profiler_marker_lines_are_dropped_from_stderr(tmp_path, capfd):
    import os

    from mamba_edu.profiling.traces import quiet_profiler_logs

    record(tmp_path)  # quiet by default
    with quiet_profiler_logs():
        os.write(2, b"USDT:2026 x.cpp:52] profiler_start\nkept: a real error\nSTAGE: done\n")
    err = capfd.readouterr().err
    assert "USDT:" not in err and "STAGE:" not in err
    assert "kept: a real error" in err
