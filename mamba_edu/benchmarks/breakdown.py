"""Where a GDN prefill's time goes, kernel by kernel: ours against FlashQLA at one shape each.

``python -m mamba_edu.benchmarks.breakdown --out DIR [--cases ...] [--arms ours,flashqla]``

Two instruments, each in a process of its own per arm and shape, and never mixed in one number:

- **replay** (``torch.profiler``, CUPTI): ``REPLAYS`` replays of the arm's CUDA graph (the graph of
  :mod:`~mamba_edu.benchmarks.references`: one call on each of its input copies). Per kernel: its
  time per call, launches per call, launch grid and block, registers per thread, shared memory,
  and CUPTI's occupancy estimate. ``programs`` against the SM count says how much of the GPU a
  kernel can fill.
- **counters** (Nsight Compute, clocks left alone, L2 flushed before each kernel): one eager call.
  Per kernel: ncu's duration, DRAM bytes read and written, tensor-core and FP32 operations,
  local-memory (register spill) instructions, and ncu's own percentages of the DRAM and
  tensor-pipe peaks. Achieved rates divide ncu's bytes and operations by ncu's duration only.

Arms are :data:`references.ARMS` builders; ``--arms`` takes any of them (an entry point of its
own may add more: :func:`main`'s ``extra_arms``). The result is
``DIR/breakdown.json`` plus each ncu report's raw CSV (``DIR/ncu_<arm>_<case>.csv``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path

REPLAYS = 20
MODULE = "mamba_edu.benchmarks.breakdown"  # children run it with -m (this file is __main__ there)
# Nsight Compute metrics (base name, roll-up); those the chip does not list are left out.
NCU_METRICS = [
    ("gpu__time_duration", "sum"), ("dram__bytes_read", "sum"), ("dram__bytes_write", "sum"),
    ("dram__throughput", "avg.pct_of_peak_sustained_elapsed"),
    ("sm__throughput", "avg.pct_of_peak_sustained_elapsed"),
    ("sm__ops_path_tensor_src_bf16_dst_fp32", "sum"),
    ("sm__ops_path_tensor_src_tf32_dst_fp32", "sum"),
    ("sm__pipe_tensor_op_gmma_cycles_active", "avg.pct_of_peak_sustained_elapsed"),
    ("sm__pipe_tensor_op_hmma_cycles_active", "avg.pct_of_peak_sustained_elapsed"),
    ("smsp__sass_thread_inst_executed_op_ffma_pred_on", "sum"),
    ("smsp__sass_thread_inst_executed_op_fadd_pred_on", "sum"),
    ("smsp__sass_thread_inst_executed_op_fmul_pred_on", "sum"),
    ("smsp__sass_inst_executed_op_local_ld", "sum"), ("smsp__sass_inst_executed_op_local_st", "sum"),
    ("launch__grid_size", ""), ("launch__block_size", ""), ("launch__registers_per_thread", ""),
    ("launch__waves_per_multiprocessor", ""),
    ("sm__warps_active", "avg.pct_of_peak_sustained_active"),
]


CORE_METRICS = ["gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum"]


def metric_names(available: set[str] | None) -> list[str]:
    """The ``--metrics`` list: every :data:`NCU_METRICS` entry whose base name ``available``
    holds (all of them when the chip's list could not be read)."""
    return [f"{base}.{roll}" if roll else base for base, roll in NCU_METRICS
            if available is None or base in available]


def parse_query_metrics(text: str) -> set[str]:
    """Base metric names from ``ncu --query-metrics`` output (the first word of each row)."""
    return {line.split()[0] for line in text.splitlines()
            if line.strip() and "__" in line.split()[0]}


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_ncu_raw(text: str) -> list[dict]:
    """Rows of ``ncu --import … --csv --page raw --print-units base``: a header, a units row, then
    one row per profiled kernel. Returns ``[{"name", metric: value, ...}]`` in launch order."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if start is None:
        return []
    header = rows[start]
    kernels = []
    for row in rows[start + 2:]:
        if len(row) != len(header):
            continue
        cells = dict(zip(header, row))
        entry = {"name": cells["Kernel Name"]}
        for key, value in cells.items():
            if "__" in key and (number := _number(value)) is not None:
                entry[key] = number
        kernels.append(entry)
    return kernels


def summarize_counters(kernels: list[dict], calls: int = 1) -> list[dict]:
    """Per kernel name (launch order): launches per call and, summed over its launches per call,
    ncu's duration (µs), DRAM bytes and operations; the achieved rates from those alone; the
    largest of ncu's percentages and launch figures over its launches."""
    by_name: OrderedDict[str, dict] = OrderedDict()
    for k in kernels:
        e = by_name.setdefault(k["name"], {"name": k["name"], "launches": 0})
        e["launches"] += 1
        for key, value in k.items():
            if key == "name":
                continue
            if key.endswith(".sum"):
                e[key] = e.get(key, 0.0) + value
            else:
                e[key] = max(e.get(key, value), value)
    out = []
    for e in by_name.values():
        per = {k: v / calls for k, v in e.items() if k.endswith(".sum")}
        ns = per.get("gpu__time_duration.sum")
        row = {"name": e["name"], "launches_per_call": e["launches"] / calls}
        if ns:
            dram = per.get("dram__bytes_read.sum", 0) + per.get("dram__bytes_write.sum", 0)
            tensor = (per.get("sm__ops_path_tensor_src_bf16_dst_fp32.sum", 0)
                      + per.get("sm__ops_path_tensor_src_tf32_dst_fp32.sum", 0))
            fp32 = (2 * per.get("smsp__sass_thread_inst_executed_op_ffma_pred_on.sum", 0)
                    + per.get("smsp__sass_thread_inst_executed_op_fadd_pred_on.sum", 0)
                    + per.get("smsp__sass_thread_inst_executed_op_fmul_pred_on.sum", 0))
            row.update(us=ns / 1e3, dram_mb=dram / 1e6, dram_tb_s=dram / ns / 1e3,
                       tensor_ops_g=tensor / 1e9, tensor_tops=tensor / ns / 1e3,
                       fp32_flop_g=fp32 / 1e9,
                       local_ld_st=per.get("smsp__sass_inst_executed_op_local_ld.sum", 0)
                       + per.get("smsp__sass_inst_executed_op_local_st.sum", 0))
        for key, short in (("dram__throughput.avg.pct_of_peak_sustained_elapsed", "dram_pct"),
                           ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm_pct"),
                           ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
                            "gmma_pct"),
                           ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
                            "hmma_pct"),
                           ("launch__grid_size", "programs"), ("launch__block_size", "threads"),
                           ("launch__registers_per_thread", "registers"),
                           ("launch__waves_per_multiprocessor", "waves"),
                           ("sm__warps_active.avg.pct_of_peak_sustained_active", "occupancy_pct")):
            if key in e:
                row[short] = e[key]
        out.append(row)
    return out


def summarize_trace(events: list[dict], calls: int) -> list[dict]:
    """Kernel events of a Chrome trace (``cat == "kernel"``) over ``calls`` calls: per kernel
    name, in order of first launch, its time per call (µs), launches per call, and the launch
    figures CUPTI records (grid, block, registers, shared memory, occupancy estimate)."""
    by_name: OrderedDict[str, dict] = OrderedDict()
    for ev in events:
        if ev.get("cat") != "kernel":
            continue
        args = ev.get("args", {})
        e = by_name.setdefault(ev["name"], {"name": ev["name"], "us": 0.0, "launches": 0})
        e["us"] += float(ev.get("dur", 0))
        e["launches"] += 1
        grid = args.get("grid")
        if grid:
            e["programs"] = max(e.get("programs", 0), grid[0] * grid[1] * grid[2])
            e["grid"] = grid
        for key, short in (("block", "block"), ("registers per thread", "registers"),
                           ("shared memory", "shared_memory"),
                           ("est. achieved occupancy %", "occupancy_est_pct")):
            if key in args:
                e[short] = args[key]
    total = sum(e["us"] for e in by_name.values()) or 1.0
    return [dict(e, us=e["us"] / calls, launches=e["launches"] / calls,
                 share=e["us"] / total) for e in by_name.values()]


def _build(arm: str, case_name: str, arms: dict):
    from mamba_edu.benchmarks import references
    shape = next(c for c in references.CASES if references.case_name(*c) == case_name)
    case = references._Case(*shape)
    call, _, info = arms[arm](case)
    return references, case, call, info


def _kernel_events(fn) -> list[dict]:
    """The Chrome-trace events of ``fn()`` under ``torch.profiler`` (CUDA activity only)."""
    import torch
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        prof.export_chrome_trace(str(trace))
        return json.loads(trace.read_text())["traceEvents"]


def run_replay(arm: str, case_name: str, arms: dict) -> dict:
    """The **replay** instrument, in this process: per-kernel figures over graph replays (over
    eager calls, marked so, should CUPTI report no kernel inside the replays)."""
    import torch
    references, case, call, info = _build(arm, case_name, arms)
    calls = REPLAYS * references.ROTATE
    with torch.inference_mode():
        graph = references._Graph(call)
        kernels = summarize_trace(_kernel_events(
            lambda: [graph.graph.replay() for _ in range(REPLAYS)]), calls)
        source = "graph replay"
        if not kernels:
            kernels = summarize_trace(_kernel_events(
                lambda: [call(i % references.ROTATE) for i in range(calls)]), calls)
            source = "eager calls (no kernel reported inside graph replays)"
    return dict(info, kernels=kernels, source=source, calls=calls,
                sm_count=torch.cuda.get_device_properties(0).multi_processor_count)


def run_counted_call(arm: str, case_name: str, arms: dict) -> None:
    """The **counters** target: warm up (compile, autotune), then one call of input copy 0
    between ``cudaProfilerStart`` and ``cudaProfilerStop`` (ncu runs with
    ``--profile-from-start off``)."""
    import torch
    _, _, call, _ = _build(arm, case_name, arms)
    with torch.inference_mode():
        for _ in range(3):
            call(0)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        call(0)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def _ncu(arm: str, case_name: str, out: Path, metrics: list[str], timeout: int, module: str) -> dict:
    tag = f"{arm}_{case_name.replace(' ', '_')}"
    report = out / f"ncu_{tag}"
    command = ["ncu", "--profile-from-start", "off", "--clock-control", "none",
               "--target-processes", "all", "--metrics", ",".join(metrics), "-f", "-o", str(report),
               sys.executable, "-m", module, "--counted-call", arm, "--cases", case_name]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    (out / f"ncu_{tag}.log").write_text(done.stdout[-20000:] + done.stderr[-20000:])
    if done.returncode != 0:
        if len(metrics) > len(CORE_METRICS):  # a name the chip refuses: the three that matter
            return dict(_ncu(arm, case_name, out, CORE_METRICS, timeout, module), fallback=True)
        return {"error": f"ncu exited {done.returncode}: " + (done.stdout + done.stderr).strip()[-300:]}
    raw = subprocess.run(["ncu", "--import", f"{report}.ncu-rep", "--csv", "--page", "raw",
                          "--print-units", "base"], capture_output=True, text=True, timeout=300)
    (out / f"ncu_{tag}.csv").write_text(raw.stdout)
    return {"kernels": summarize_counters(parse_ncu_raw(raw.stdout))}


def _replay_subprocess(arm: str, case_name: str, timeout: int, module: str) -> dict:
    done = subprocess.run([sys.executable, "-m", module, "--replay", arm, "--cases", case_name],
                          capture_output=True, text=True, timeout=timeout)
    for line in done.stdout.splitlines():
        if line.startswith("@@replay "):
            return json.loads(line[len("@@replay "):])
    return {"error": f"exited {done.returncode}: " + done.stderr.strip()[-300:]}


def main(argv=None, extra_arms: dict | None = None, module: str = MODULE) -> int:
    """The command line; ``extra_arms`` adds arms (name → builder, like :data:`references.ARMS`'s)
    and ``module`` is what the children run with ``-m`` (the entry point that passes them)."""
    from mamba_edu.benchmarks import references
    from mamba_edu.benchmarks.common import OUT, commit_hash, package_versions, say_where
    table = references.ARMS | (extra_arms or {})
    parser = argparse.ArgumentParser(prog=f"python -m {module}",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT / "breakdown")
    parser.add_argument("--arms", default="ours,flashqla")
    parser.add_argument("--cases", default="qwen3-next 1x8192,qwen3-next 1x32768,"
                        "qwen3-next 8x1024,qwen3-next 8x4096")
    parser.add_argument("--timeout-s", type=int, default=240, help="per process")
    parser.add_argument("--clock-log", default=None,
                        help="where the nvidia-smi clock log of this run is kept (recorded as is)")
    parser.add_argument("--replay", default=None, help=argparse.SUPPRESS)        # child
    parser.add_argument("--counted-call", default=None, help=argparse.SUPPRESS)  # child under ncu
    args = parser.parse_args(argv)
    if unknown := [a for a in (args.replay or args.counted_call or args.arms).split(",") if a not in table]:
        parser.error(f"unknown arms {unknown}; choose from {', '.join(table)}")
    if args.replay:
        print("@@replay " + json.dumps(run_replay(args.replay, args.cases, table)), flush=True)
        return 0
    if args.counted_call:
        run_counted_call(args.counted_call, args.cases, table)
        return 0
    import torch
    say_where(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    query = subprocess.run(["ncu", "--query-metrics"], capture_output=True, text=True)
    available = parse_query_metrics(query.stdout) if query.returncode == 0 else None
    metrics = metric_names(available)
    from datetime import datetime, timezone
    result = dict(meta=dict(commit=commit_hash(), device=torch.cuda.get_device_name(),
                            date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            torch=torch.__version__, triton=package_versions()["triton"],
                            clock_log=args.clock_log,
                            versions=package_versions(), replays=REPLAYS, metrics=metrics,
                            sm_count=torch.cuda.get_device_properties(0).multi_processor_count),
                  rows=[])
    for case_name in args.cases.split(","):
        for arm in args.arms.split(","):
            row = {"case": case_name, "arm": arm}
            for key, run in (("replay", lambda: _replay_subprocess(arm, case_name, args.timeout_s, module)),
                             ("counters", lambda: _ncu(arm, case_name, args.out, metrics,
                                                       args.timeout_s, module))):
                try:
                    row[key] = run()
                except subprocess.TimeoutExpired:
                    row[key] = {"error": f"over {args.timeout_s} s"}
            result["rows"].append(row)
            (args.out / "breakdown.json").write_text(json.dumps(result, indent=1))
            print(json.dumps({"case": case_name, "arm": arm,
                              "replay_us": [round(k["us"], 1) for k in row["replay"].get("kernels", [])],
                              "ncu_us": [round(k.get("us", 0), 1)
                                         for k in row["counters"].get("kernels", [])]}), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
