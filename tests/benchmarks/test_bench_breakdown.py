"""The per-kernel breakdown's parsing, on stand-ins for what CUPTI and Nsight Compute write."""

import csv
import io

import pytest

from mamba_edu.benchmarks import breakdown as bd


def _raw_csv(rows):
    out = io.StringIO()
    writer = csv.writer(out)
    header = ["ID", "Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum",
              "dram__bytes_write.sum", "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
              "dram__throughput.avg.pct_of_peak_sustained_elapsed", "launch__grid_size"]
    writer.writerow(header)
    writer.writerow(["", "", "nsecond", "byte", "byte", "", "%", ""])
    for i, (name, ns, rd, wr, ops, pct, grid) in enumerate(rows):
        writer.writerow([i, name, f"{ns:,}", rd, wr, ops, pct, grid])
    return "==PROF== a line ncu prints first\n" + out.getvalue()


def test_counters_sum_launches_per_call_and_rates_from_ncu_alone():
    text = _raw_csv([("scan", 2000, 3e6, 1e6, 4e9, "50.5", 64),
                     ("out", 1000, 1e6, 1e6, 0, "20", 512),
                     ("scan", 2000, 3e6, 1e6, 4e9, "60.5", 64)])
    kernels = bd.summarize_counters(bd.parse_ncu_raw(text), calls=2)
    assert [k["name"] for k in kernels] == ["scan", "out"]
    scan = kernels[0]
    assert scan["launches_per_call"] == 1
    assert scan["us"] == pytest.approx(2.0)               # thousands separator read
    assert scan["dram_mb"] == pytest.approx(4.0)
    assert scan["dram_tb_s"] == pytest.approx(4e6 / 2000e-9 / 1e12)
    assert scan["tensor_tops"] == pytest.approx(4e9 / 2000e-9 / 1e12)
    assert scan["dram_pct"] == 60.5 and scan["programs"] == 64   # the largest over launches
    assert kernels[1]["launches_per_call"] == 0.5


def test_no_kernel_rows_is_an_empty_list_not_a_crash():
    assert bd.parse_ncu_raw("==PROF== No kernels were profiled.\n") == []


def test_trace_kernels_per_call_in_launch_order_with_their_launch_figures():
    events = [
        {"cat": "kernel", "name": "b", "dur": 30, "args": {"grid": [4, 2, 1], "block": [128, 1, 1],
                                                          "registers per thread": 96}},
        {"cat": "kernel", "name": "a", "dur": 10, "args": {"grid": [132, 1, 1]}},
        {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "dur": 5},
        {"cat": "kernel", "name": "b", "dur": 30, "args": {"grid": [4, 2, 1]}},
        {"cat": "kernel", "name": "a", "dur": 10, "args": {"grid": [132, 1, 1]}},
    ]
    kernels = bd.summarize_trace(events, calls=2)
    assert [k["name"] for k in kernels] == ["b", "a"]
    assert kernels[0]["us"] == 30 and kernels[0]["launches"] == 1
    assert kernels[0]["programs"] == 8 and kernels[0]["registers"] == 96
    assert kernels[0]["share"] == pytest.approx(0.75)


def test_metrics_the_chip_does_not_list_are_left_out():
    listed = bd.parse_query_metrics("Device GH100\nMetric Name   Metric Type  Description\n"
                                    "gpu__time_duration  Counter  time\n"
                                    "dram__bytes_read  Counter  bytes\n")
    names = bd.metric_names(listed)
    assert names == ["gpu__time_duration.sum", "dram__bytes_read.sum"]
    assert len(bd.metric_names(None)) == len(bd.NCU_METRICS)


def test_an_unknown_arm_is_refused_before_anything_runs(capsys):
    """The package's breakdown knows the references' arms; a lab arm needs the lab's entry point
    (which passes its builders on to every child process)."""
    from mamba_edu.benchmarks import breakdown
    from mamba_edu.lab.bench_lab_arms import LAB_ARMS
    with pytest.raises(SystemExit) as stop:
        breakdown.main(["--arms", "ours,lab_scan_builds_wu"])
    assert stop.value.code == 2 and "unknown arms ['lab_scan_builds_wu']" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        breakdown.main(["--arms", "nope"], extra_arms=LAB_ARMS, module="mamba_edu.lab.bench_lab_breakdown")
    assert stop.value.code == 2 and "lab_scan_builds_wu" in capsys.readouterr().err
