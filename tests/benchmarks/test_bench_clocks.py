"""GPU clock logs matched to benchmark rows: a synthetic log with known values, and the H200 one."""

from pathlib import Path

import pytest

from mamba_edu.benchmarks.clocks import clocks_per_row, read_clock_log
from mamba_edu.benchmarks.ttft import Result, load_results

DATA = Path(__file__).resolve().parents[2] / "data" / "bench"
HEADER = "timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu\n"


def _row(case, strategy, mode, started):
    return Result(case, "headline", 0.0, "p", "1x1", 1, 1, 1, strategy, mode, started_utc=started)


def test_samples_are_split_between_rows(tmp_path):
    log = tmp_path / "gpu_clocks.csv"
    lines = [f"2026/12/02 10:00:0{s}.000, {mhz} MHz, 3201 MHz, {w} W, 50\n"
             for s, mhz, w in ((0, 1980, 400.5), (1, 1900, 650.0), (2, 1500, 699.0), (3, 1700, 690.0))]
    log.write_text(HEADER + "".join(lines) + "garbage line\n")
    samples = read_clock_log(log)
    assert len(samples) == 4
    rows = [_row("a", "sync_free", "eager", "2026-12-02T10:00:00"),
            _row("a", "sync_free", "graph", "2026-12-02T10:00:02"),
            _row("b", "naive", "eager", "2026-12-02T10:00:03")]
    eager, graph = clocks_per_row(rows, samples, "a")
    assert (eager.label, eager.samples, eager.sm_mean_mhz, eager.sm_min_mhz, eager.power_max_w) == \
        ("sync_free", 2, 1940.0, 1900.0, 650.0)
    assert (graph.label, graph.samples, graph.sm_min_mhz, graph.power_max_w) == \
        ("sync_free+graph", 1, 1500.0, 699.0)
    assert clocks_per_row(rows, samples, "missing") == []


@pytest.mark.skipif(not (DATA / "gpu_clocks.csv").exists(), reason="no H200 clock log committed")
def test_committed_h200_log_covers_the_headline_rows():
    rows = load_results(DATA)
    samples = read_clock_log(DATA / "gpu_clocks.csv")
    per_row = clocks_per_row(rows, samples, "gpu_bound_8x1024")
    assert {r.label for r in per_row} >= {"naive", "sync_free", "sync_free+graph"}
    assert all(0 < r.sm_min_mhz <= r.sm_mean_mhz < 3000 and r.power_max_w > 0 for r in per_row)
