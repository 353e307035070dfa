"""Notebook 12's checks reject plausible wrong answers (stubs: test_exercise_stubs.py), the check's
reference is what a bucket uploads, and the notebook's GPU section reads
``data/bench/buckets/results.json`` or says in one line that it is not recorded yet.

Every answer is judged through the grader's own path (:func:`exercise_judge.judge_answer`), so the
judge makes the forbidden functions absent as in ``mamba_edu grade``.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from exercise_judge import judge_answer

import mamba_edu
from mamba_edu.exercises import nb12
from mamba_edu.exercises.core import FAIL, PASS
from mamba_edu.kernels.metadata import EMPTY_CHUNK, chunk_table
from mamba_edu.profiling.bubbles import merge_intervals

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NB = nb12.NOTEBOOK
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / f"{NB}.ipynb"


# --- exercise 1: the fixed-capacity plan -----------------------------------------------------------

def fixed_plan(capacity="bound", pad_slot=-1, spread=False, unused="past", zero_row_chunk=False, flat=False):
    """The bucket's padded lists; each flag makes it wrong in one plausible way."""
    def my_fixed_plan(lengths, working_slots, max_tokens, max_requests):
        rows, n = max_requests + 1, len(lengths)
        pad = max_tokens - sum(lengths)
        if spread:  # the padding tokens shared out over every padding row
            k = rows - n
            padded = list(lengths) + [pad // k + (1 if i < pad % k else 0) for i in range(k)]
        else:
            padded = list(lengths) + [pad] + [0] * (rows - n - 1)
        slots = list(working_slots) + [pad_slot] * (rows - n)
        chunk_rows = [(i, c) for i, L in enumerate(padded)
                      for c in range(max(1, (L + 63) // 64) if zero_row_chunk else (L + 63) // 64)]
        size = max_tokens // 64 + rows if capacity == "bound" else (max_tokens + 63) // 64
        spare = {"past": (rows - 1, EMPTY_CHUNK), "far past": (rows - 1, 2**30), "chunk 0": (rows - 1, 0),
                 "origin": (0, 0), "past, row 0": (0, EMPTY_CHUNK)}[unused]
        chunk_rows = (chunk_rows + [spare] * size)[:size]
        if flat:
            chunk_rows = [x for row in chunk_rows for x in row]
        return padded, slots, chunk_rows
    return my_fixed_plan


def plan_without_dummy(lengths, working_slots, max_tokens, max_requests):
    """max_requests rows, the padding tokens nowhere."""
    n = len(lengths)
    padded = list(lengths) + [0] * (max_requests - n)
    chunk_rows = [(i, c) for i, L in enumerate(padded) for c in range((L + 63) // 64)]
    size = max_tokens // 64 + max_requests
    return padded, list(working_slots) + [-1] * (max_requests - n), \
        chunk_rows + [(max_requests - 1, EMPTY_CHUNK)] * (size - len(chunk_rows))


def plan_by_the_package(lengths, working_slots, max_tokens, max_requests):
    from mamba_edu.kernels.metadata import chunk_table
    from mamba_edu.engine import Bucket
    bucket = Bucket(max_tokens, max_requests)
    padded = list(lengths) + [max_tokens - sum(lengths)] + [0] * (bucket.rows - len(lengths) - 1)
    flat = chunk_table(padded, bucket.chunk_capacity)
    return padded, list(working_slots) + [-1] * (bucket.rows - len(lengths)), list(zip(flat[0::2], flat[1::2]))


def plan_in_a_thread(lengths, working_slots, max_tokens, max_requests):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(plan_by_the_package, lengths, working_slots, max_tokens, max_requests).result()


table_of = chunk_table  # the package's function under another name


def plan_renamed(lengths, working_slots, max_tokens, max_requests):
    rows = max_requests + 1
    padded = list(lengths) + [max_tokens - sum(lengths)] + [0] * (rows - len(lengths) - 1)
    flat = table_of(padded, max_tokens // 64 + rows)
    return padded, list(working_slots) + [-1] * (rows - len(lengths)), list(zip(flat[0::2], flat[1::2]))


def plan_dummy_last(lengths, working_slots, max_tokens, max_requests):
    """The zero-length rows first, the dummy row with the padding at the very end."""
    padded, slots, _ = fixed_plan()(lengths, working_slots, max_tokens, max_requests)
    n = len(lengths)
    padded = padded[:n] + padded[n + 1:] + padded[n:n + 1]
    chunk_rows = [(i, c) for i, L in enumerate(padded) for c in range((L + 63) // 64)]
    size = max_tokens // 64 + max_requests + 1
    return padded, slots, chunk_rows + [(max_requests, EMPTY_CHUNK)] * (size - len(chunk_rows))


WRONG_1 = {
    "capacity max_tokens // 64 + max_requests (the dummy row forgotten)": lambda *a: (
        lambda p: (p[0], p[1], p[2][:-1]))(fixed_plan()(*a)),
    "the dummy row after the zero-length rows": plan_dummy_last,
    "the forbidden calls in a worker thread": plan_in_a_thread,
    "chunk_table renamed": plan_renamed,
    "capacity ceil(max_tokens / 64)": fixed_plan(capacity="ceil"),
    "padding rows in slot 0 instead of -1": fixed_plan(pad_slot=0),
    "the padding tokens spread over the zero-length rows": fixed_plan(spread=True),
    "unused chunk rows at chunk 0 of the last row": fixed_plan(unused="chunk 0"),
    "unused chunk rows at (0, 0)": fixed_plan(unused="origin"),
    "unused chunk rows past the batch, but in row 0": fixed_plan(unused="past, row 0"),
    "a zero-length row given a chunk": fixed_plan(zero_row_chunk=True),
    "a flat chunk table": fixed_plan(flat=True),
    "no dummy row: max_requests rows, the padding nowhere": plan_without_dummy,
    "the forbidden calls: chunk_table and Bucket": plan_by_the_package,
}


@pytest.mark.parametrize("unused", ["past", "far past"], ids=["EMPTY_CHUNK", "2**30"])
def test_fixed_plan_accepts_the_right_answer(unused):
    """An unused row's chunk may be any index past every batch: EMPTY_CHUNK or larger."""
    verdict = judge_answer(NB, 1, fixed_plan(unused=unused))
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_1))
def test_fixed_plan_rejects(mistake):
    verdict = judge_answer(NB, 1, WRONG_1[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_fixed_plan_messages():
    assert "ceil(max_tokens/64)" in judge_answer(NB, 1, fixed_plan(capacity="ceil")).message
    assert "−1 makes the kernels start it from zeros" in judge_answer(NB, 1, fixed_plan(pad_slot=0)).message
    assert "one dummy row" in judge_answer(NB, 1, fixed_plan(spread=True)).message
    assert "not past the batch" in judge_answer(NB, 1, fixed_plan(unused="chunk 0")).message
    assert "not the last row" in judge_answer(NB, 1, fixed_plan(unused="past, row 0")).message
    assert "rows of 0 tokens have none" in judge_answer(NB, 1, fixed_plan(zero_row_chunk=True)).message
    assert "pairs" in judge_answer(NB, 1, fixed_plan(flat=True)).message
    assert "max_requests + 1" in judge_answer(NB, 1, plan_without_dummy).message
    assert "mamba_edu.engine.bucket" in judge_answer(NB, 1, plan_by_the_package).message  # its first forbidden call


@pytest.mark.parametrize("bucket_size, lengths", [((256, 3), [65, 65, 65]), ((256, 3), [150, 40]),
                                                  ((128, 2), [128]), ((320, 3), [100, 100, 120]),
                                                  ((1000, 5), [1])])
def test_the_reference_is_what_the_bucket_uploads(bucket_size, lengths):
    """nb12.fixed_plan against StaticBucket.fill on an engine's prepared batch."""
    from mamba_edu.engine import Engine, Request
    from mamba_edu.kernels.metadata import host_values
    from mamba_edu.model import build_model
    from mamba_edu.engine import Bucket

    bucket = Bucket(*bucket_size)
    engine = Engine(build_model("tiny", device="cpu"), strategy="fused", max_requests=bucket.max_requests)
    captured = engine.capture_prefill(bucket, "gdn_inside", graphs=False)
    batch = engine.prepare_prefill([Request(f"r{i}", [1 + (i + j) % 100 for j in range(n)])
                                    for i, n in enumerate(lengths)])
    captured.static.fill(batch.forward_batch)
    padded, slots, rows = nb12.fixed_plan(lengths, batch.forward_batch.working_slots, *bucket_size)
    table = host_values(captured.static.int["chunks"])
    assert captured.static.batch.extend_lens == padded
    assert list(host_values(captured.static.int["state_indices"])) == slots
    assert list(zip(table[0::2], table[1::2])) == rows
    engine.abort_prefill(batch)


# --- exercise 2: idle time per break -----------------------------------------------------------------

GPU = ("kernel", "gpu_memcpy", "gpu_memset")


def idle(cats=GPU, union="merge", span="gpu", per="breaks", order="sorted", lane=False):
    """Idle per break from the events; each flag makes it wrong in one plausible way."""
    def my_idle_per_break(events):
        xs = [e for e in events if e.get("ph") == "X"]
        if lane:
            gpu = [(e["ts"], e["ts"] + e["dur"]) for e in xs if e.get("pid") == 1]   # the GPU's whole lane
        else:
            gpu = [(e["ts"], e["ts"] + e["dur"]) for e in xs if e.get("cat") in cats]
        ordered = sorted(gpu) if order == "sorted" else gpu
        if union == "merge":
            busy, (lo, hi) = 0.0, ordered[0]
            for s, e in ordered[1:]:
                if s <= hi:
                    hi = max(hi, e)
                else:
                    busy, (lo, hi) = busy + hi - lo, (s, e)
            busy += hi - lo
        elif union == "sum":
            busy = sum(e - s for s, e in gpu)
        else:  # "gaps": the gaps between neighbours, from each one's own end
            gaps = sum(max(0.0, b[0] - a[1]) for a, b in zip(ordered, ordered[1:]))
            busy = max(e for _, e in gpu) - min(s for s, _ in gpu) - gaps
        first = min(e["ts"] for e in xs) if span in ("all", "start") else min(s for s, _ in gpu)
        last = max(e["ts"] + e["dur"] for e in xs) if span in ("all", "end") else max(e for _, e in gpu)
        if span == "last start":  # the end of the kernel that starts last
            last = max(gpu)[1]
        pieces = sum(1 for e in xs if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaGraphLaunch")
        return (last - first - busy) / (pieces if per == "pieces" else pieces - 1)
    return my_idle_per_break


def idle_by_the_package(events):
    from mamba_edu.profiling.bubbles import merge_intervals
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") in GPU]
    busy = sum(e - s for s, e in merge_intervals(gpu))
    pieces = sum(1 for e in events if e.get("ph") == "X" and e.get("name") == "cudaGraphLaunch")
    return (max(e for _, e in gpu) - min(s for s, _ in gpu) - busy) / (pieces - 1)


def idle_in_a_thread(events):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(idle_by_the_package, events).result()


union_of = merge_intervals  # the package's function under another name


def idle_renamed(events):
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") in GPU]
    busy = sum(e - s for s, e in union_of(gpu))
    pieces = sum(1 for e in events if e.get("ph") == "X" and e.get("name") == "cudaGraphLaunch")
    return (max(e for _, e in gpu) - min(s for s, _ in gpu) - busy) / (pieces - 1)


WRONG_2 = {
    "the span ends with the kernel that starts last": idle(span="last start"),
    "milliseconds, not µs": lambda events: idle()(events) / 1e3,
    "breaks counted as every launch (cudaLaunchKernel too)": lambda events: idle()(events) * (
        sum(e.get("name") == "cudaGraphLaunch" for e in events) - 1) / (
        sum(e.get("name") in ("cudaGraphLaunch", "cudaLaunchKernel") for e in events) - 1),
    "the forbidden call in a worker thread": idle_in_a_thread,
    "merge_intervals renamed": idle_renamed,
    "the span from the trace's first event (the profiler's start)": idle(span="start"),
    "the span to the trace's last event (a host call)": idle(span="end"),
    "the span over every event": idle(span="all"),
    "durations summed, overlapping kernels twice": idle(union="sum"),
    "gaps from each interval's own end (nested kernels)": idle(union="gaps"),
    "divided by the pieces": idle(per="pieces"),
    "kernels only, copies and memsets left out": idle(cats=("kernel",)),
    "the GPU's whole lane, the forward's range included": idle(lane=True),
    "the events taken in the order given": idle(order="given"),
    "the forbidden call: merge_intervals": idle_by_the_package,
}


def test_idle_per_break_accepts_the_right_answer():
    verdict = judge_answer(NB, 2, idle())
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_2))
def test_idle_per_break_rejects(mistake):
    verdict = judge_answer(NB, 2, WRONG_2[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_idle_per_break_messages():
    assert "profiler's own start" in judge_answer(NB, 2, idle(span="start")).message
    assert "last GPU event" in judge_answer(NB, 2, idle(span="end")).message
    assert "count once" in judge_answer(NB, 2, idle(union="sum")).message
    assert "running maximum" in judge_answer(NB, 2, idle(union="gaps")).message
    assert "P − 1" in judge_answer(NB, 2, idle(per="pieces")).message
    assert "copies" in judge_answer(NB, 2, idle(cats=("kernel",))).message
    assert "gpu_user_annotation" in judge_answer(NB, 2, idle(lane=True)).message
    assert "mamba_edu.profiling.bubbles" in judge_answer(NB, 2, idle_by_the_package).message


# --- exercise 3: predict the pieces and breaks of a forward --------------------------------------------

def cut(n_layers, attn_every, mode):
    attention = n_layers // attn_every if attn_every else 0
    breaks = {"breakable": n_layers, "gdn_inside": attention, "graph": 0}[mode]
    return breaks + 1, breaks


def cut_with(**change):
    def my_cut_prediction(n_layers, attn_every, mode):
        pieces, breaks = cut(n_layers, attn_every, mode)
        return change.get("result", lambda p, b, n, a, m: (p, b))(pieces, breaks, n_layers, attn_every, mode)
    return my_cut_prediction


WRONG_3 = {
    "the eager LM-head tail counted as a piece": cut_with(result=lambda p, b, n, a, m: (p + 1, b)),
    "as many pieces as breaks": cut_with(result=lambda p, b, n, a, m: (b, b) if b else (1, 0)),
    "gdn_inside breaks at the GDN layers instead": cut_with(
        result=lambda p, b, n, a, m: (n - (n // a if a else 0) + 1, n - (n // a if a else 0)) if m == "gdn_inside" else (p, b)),
    "attention layers counted as n_layers / attn_every + 1": cut_with(
        result=lambda p, b, n, a, m: (n // a + 2, n // a + 1) if m == "gdn_inside" and a else (p, b)),
    "attn_every = 0 read as attention everywhere": cut_with(
        result=lambda p, b, n, a, m: (n + 1, n) if m == "gdn_inside" and a == 0 else (p, b)),
    "graph mode: no piece at all": cut_with(result=lambda p, b, n, a, m: (0, 0) if m == "graph" else (p, b)),
    "breakable: one break per GDN layer only": cut_with(
        result=lambda p, b, n, a, m: (n - (n // a if a else 0) + 1, n - (n // a if a else 0)) if m == "breakable" else (p, b)),
    "(breaks, pieces) in the other order": cut_with(result=lambda p, b, n, a, m: (b, p)),
    "floats": cut_with(result=lambda p, b, n, a, m: (float(p), float(b))),
    "the pieces alone": cut_with(result=lambda p, b, n, a, m: p),
}


@pytest.mark.parametrize("kind", [int, np.int64], ids=["int", "numpy int64"])
def test_cut_prediction_accepts_the_right_answer(kind):
    verdict = judge_answer(NB, 3, lambda *args: tuple(map(kind, cut(*args))))
    assert verdict.status == PASS, verdict.line()


@pytest.mark.parametrize("mistake", list(WRONG_3))
def test_cut_prediction_rejects(mistake):
    verdict = judge_answer(NB, 3, WRONG_3[mistake])
    assert verdict.status == FAIL, verdict.line()


def test_synthetic_traces_hold_the_traps():
    """Every trap the check relies on is in every trace: a start delay, a nested kernel, copies,
    the GPU range annotation, events without dur, shuffled order; and the package's analysis agrees."""
    import random

    from mamba_edu.profiling.bubbles import merge_intervals
    for seed in range(10):
        events = nb12.synthetic_trace(random.Random(seed), 2 + seed)
        want = nb12.idle_per_break(events)
        xs = [e for e in events if e["ph"] == "X"]
        gpu = [(e["ts"], e["ts"] + e["dur"]) for e in xs if e["cat"] in GPU]
        assert min(s for s, _ in gpu) - min(e["ts"] for e in xs) > 500
        assert any(e["cat"] == "gpu_memcpy" for e in xs) and any(e["cat"] == "gpu_user_annotation" for e in xs)
        assert any("dur" not in e for e in events)
        assert sum(e - s for s, e in gpu) > want["busy"]  # kernels overlap
        assert events != sorted(events, key=lambda e: e.get("ts", -1))
        assert want["pieces"] == 2 + seed
        assert max(gpu)[1] < max(e for _, e in gpu)  # the last to start is not the last to end
        busy = sum(e - s for s, e in merge_intervals(gpu))
        assert abs(busy - want["busy"]) < 1e-6


def test_the_checks_module_is_forbidden():
    def asks_the_reference(lengths, working_slots, max_tokens, max_requests):
        from mamba_edu.exercises.nb12 import fixed_plan as reference
        return reference(lengths, working_slots, max_tokens, max_requests)
    assert "mamba_edu.exercises.nb12" in judge_answer(NB, 1, asks_the_reference).message


# --- the notebook's GPU section ----------------------------------------------------------------------

def _gpu_cells() -> tuple[str, list[str]]:
    """The helper cell and the cells that read the results, from the learner notebook."""
    cells = ["".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"]
    helper = next(c for c in cells if "def load_bucket_results(" in c)
    readers = [c for c in cells if "bench is not None" in c or "load_bucket_results(BUCKET_RESULTS)" in c]
    assert len(readers) == 3
    return helper, readers


def _namespace() -> dict:
    ns = {"mamba_edu": mamba_edu, "plt": plt, "json": json, "Path": Path}
    helper, _ = _gpu_cells()
    exec(compile(helper, "<notebook 12 helper cell>", "exec"), ns)  # noqa: S102 - the notebook's own cell
    return ns


def synthetic_results(path: Path) -> None:
    """A results file in the benchmark's format (every case and arm it runs); made-up numbers:
    the whole-forward graph beats eager in the sweep up to 2048 tokens, gdn_inside everywhere."""
    from mamba_edu.benchmarks.buckets import CASES, SWEEP, triton_arms
    rows = []
    for case in CASES + SWEEP:
        for strategy, mode in triton_arms(case):
            t = case.max_tokens
            if case in SWEEP:
                ttft = {"eager": 10.0, "gdn_inside": 6.0 + t / 4096, "graph": 4.0 + t / 512}[mode]
            else:
                ttft = {"eager": 20.0, "breakable": 12.0, "gdn_inside": 8.0, "graph": 5.0}[mode]
            row = dict(case=case.name, preset=case.preset, max_tokens=t, max_requests=case.max_requests,
                       strategy=strategy, mode=mode, round_ms=[ttft * 0.98, ttft, ttft * 1.03], sm_mhz=[1980] * 3,
                       ttft_ms=ttft, spread_ms=ttft * 0.05)
            if case not in SWEEP:
                breaks = {"eager": 0, "breakable": 60, "gdn_inside": 15, "graph": 0}[mode]
                row.update(gpu_busy_ms=ttft / 2, span_ms=ttft, idle_ms=ttft / 2, breaks=breaks,
                           idle_per_break_us=ttft / 2 * 1e3 / breaks if breaks else None)
                if mode in ("gdn_inside", "graph"):
                    row["no_sync_with_refill"] = True
            rows.append(row)
    eager = {(r["case"], r["strategy"]): r["ttft_ms"] for r in rows if r["mode"] == "eager"}
    for r in rows:
        base = eager.get((r["case"], r["strategy"]))  # a second set of arms has fused eager only
        r["vs_eager_same_strategy"] = base / r["ttft_ms"] if base else None
    meta = dict(commit="0" * 40, date="2026-01-01T00:00:00+00:00", device="a test, not a GPU", torch="x",
                triton="y", rounds=3, repeats=10, warmup=8, dtype="bfloat16")
    path.write_text(json.dumps(dict(meta=meta, rows=rows)))


def test_gpu_section_without_results_prints_one_line_and_no_figure(tmp_path, capsys):
    plt.close("all")  # figures other tests of this process left open
    ns = _namespace()
    _, readers = _gpu_cells()
    ns["BUCKET_RESULTS"] = tmp_path / "results.json"
    for cell in readers:
        exec(compile(cell, "<notebook 12 GPU cell>", "exec"), ns)  # noqa: S102
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("GPU results not recorded yet"), lines
    assert ns["bench"] is None and not plt.get_fignums()


def test_gpu_section_reads_the_results(tmp_path, capsys):
    ns = _namespace()
    _, readers = _gpu_cells()
    ns["BUCKET_RESULTS"] = tmp_path / "results.json"
    synthetic_results(ns["BUCKET_RESULTS"])
    for cell in readers:
        exec(compile(cell, "<notebook 12 GPU cell>", "exec"), ns)  # noqa: S102
        plt.close("all")
    out = capsys.readouterr().out
    assert "a test, not a GPU" in out and "#35851" in out
    assert "graph     : faster than eager up to a 2048-token bucket" in out and "from 4096 tokens" in out
    assert "gdn_inside: faster than eager at every bucket of the sweep" in out
    assert ns["crossover"](ns["bench"], "graph") == (2048, 4096)
    assert ns["crossover"](ns["bench"], "gdn_inside") == (8192, None)
    assert abs(ns["padding_waste"](512) - (1 - 448 / 512)) < 1e-12
    for fig in (ns["plot_arms"](ns["bench"]), ns["plot_sweep"](ns["bench"])):
        assert fig.axes
    plt.close("all")
