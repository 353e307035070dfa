"""``python -m mamba_edu bench`` end to end on the CPU (tiny preset), and its case definitions."""

import csv
import json
import os
import subprocess
import sys

import pytest
import torch

from mamba_edu.benchmarks.ttft import (Result, format_table, headline_cases, make_figures, select_cases,
                                        sweep_cases)
from mamba_edu.profiling.bubbles import analyze_trace
from mamba_edu.benchmarks.timing import Prefills
from mamba_edu.serving import STRATEGIES

engine_module = pytest.importorskip("mamba_edu.engine", reason="the engine is not there yet")

ON_GPU = torch.cuda.is_available()
TINY_GDN_LAYERS = 3


def run_bench(out, *args):
    env = {**os.environ, "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, "-m", "mamba_edu", "bench", "--out", str(out), *args],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "USDT:" not in done.stderr and "Traceback" not in done.stderr
    return done.stdout, json.loads((out / "results.json").read_text())


def test_headline_cases_match_the_design():
    shapes = {c.name: (c.preset, len(c.lengths), set(c.lengths), c.tracked) for c in headline_cases()}
    assert shapes == {
        "gpu_bound_8x1024": ("qwen3-next", 8, {1024}, 8),
        "launch_bound_1x512": ("qwen3.5-tp8", 1, {512}, 1),
        "launch_bound_16x256": ("qwen3.5-tp8", 16, {256}, 16),
        "launch_bound_8x1024": ("qwen3.5-tp8", 8, {1024}, 8),
    }


def test_sweeps_cover_tokens_and_tracked_fraction():
    sweeps = sweep_cases(quick=False)
    tokens = [c for c in sweeps if c.group == "tokens"]
    assert [sum(c.lengths) for c in tokens] == [512, 1024, 2048, 4096, 8192, 16384]
    tracked = [c for c in sweeps if c.group == "tracked"]
    assert [c.tracked for c in tracked] == [0, 4, 8]
    assert {sum(c.lengths) for c in tracked} <= set(range(8 * 1023, 8 * 1024 + 1))
    assert [c.name for c in select_cases("tracked,launch_bound_1x512", quick=True)] == [
        "launch_bound_1x512", "tracked_0", "tracked_0.5", "tracked_1"]
    with pytest.raises(SystemExit, match="unknown --cases"):
        select_cases("nope", quick=True)


def test_table_marks_failures():
    ok = Result("c", "headline", 0, "tiny", "1x512", 1, 512, 1, "naive", "eager", 3, 1.5, 1.2, 9)
    bad = Result("c", "headline", 0, "tiny", "1x512", 1, 512, 1, "fused", "graph", error="boom")
    table = format_table([ok, bad]).splitlines()
    assert table[1].split()[:4] == ["c", "naive", "1.50", "-"]
    assert "fused+graph" in table[2] and "FAILED boom" in table[2]


def test_prefills_give_every_slot_back():
    """Every forward starts from fresh slots with no prefix hit, and no slot leaks."""
    from mamba_edu.model import build_model

    engine = engine_module.Engine(build_model("tiny", device="cpu"), "naive", max_requests=2)
    free = engine.pool.n_free
    prefills = Prefills(engine, (64, 100), seed=0)
    for _ in range(6):  # more batches than the pool holds at once
        batch = prefills.next()
        assert batch.prefix_lens == [0, 0]
        prefills.forward(batch)
    prefills.close()
    assert not engine.running
    assert engine.pool.n_free + engine.cache.evictable_slots() == free


@pytest.mark.skipif(ON_GPU, reason="the CPU run; on a GPU use scripts/gpu_bench.sh")
def test_bench_on_cpu_end_to_end(tmp_path):
    out = tmp_path / "bench"
    stdout, results = run_bench(out, "--cases", "launch_bound_1x512", "--quick", "--device", "cpu",
                                "--preset", "tiny", "--repeats", "1", "--warmup", "0")
    assert "bubbles and CUDA graphs need a GPU" in stdout
    rows = {(r["case"], r["strategy"]): r for r in results["results"]}
    assert len(rows) == 4 and all(r["error"] is None for r in rows.values())

    # Syncs per forward are exact even on a CPU (the sniffer).
    syncs = {s: rows["launch_bound_1x512", s]["syncs"] for s in STRATEGIES}
    assert syncs["naive"] >= 2 * TINY_GDN_LAYERS
    # precomputed = SGLang after PR #20522: 11 per forward whatever the depth (as in the README)
    assert syncs["precomputed"] == 11 < syncs["naive"]
    assert syncs["sync_free"] == syncs["fused"] == 0
    # On a CPU the strategies cannot differ in time: no speedup, and no speedup column.
    assert all(r["speedup"] is None for r in rows.values())
    assert "speedup" not in stdout.split("results, figures")[0].splitlines()[-5]
    assert all(r["ttft_ms"] > 0 and r["gpu_busy_ms"] is None for r in rows.values())

    with open(out / "results.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    figures = ["timeline_launch_bound_1x512.png", "bars_launch_bound_1x512.png"]
    assert all((out / name).stat().st_size > 1000 for name in figures)

    traces = sorted((out / "runs" / "launch_bound_1x512").glob("*.pt.trace.json.gz"))
    assert [t.name.split(".")[0] for t in traces] == ["fused", "naive", "precomputed", "sync_free"]
    assert sum(t.stat().st_size for t in traces) < 2_000_000  # trimmed: one forward each
    assert analyze_trace(traces[1]).wall_us > 0

    replot, _ = run_bench(out, "--replot")  # the figures again, from results.json and the traces
    assert "launch_bound_1x512" in replot


def test_sweep_figures_from_results(tmp_path):
    rows = [Result(f"{group}_{x}", group, x, "qwen3-next", "8x1024", 8, 8192, 8, s, "eager",
                   ttft_ms=1.0 + x + i, gpu_busy_ms=1.0, idle_fraction=0.1)
            for group, xs in (("tokens", (512, 1024)), ("tracked", (0.0, 1.0)))
            for x in xs for i, s in enumerate(STRATEGIES)]
    written = make_figures(rows, tmp_path)
    assert [p.name for p in written] == ["sweep_tokens.png", "sweep_tracked.png"]
    assert all(p.stat().st_size > 1000 for p in written)


def test_format_table_shows_speedup_only_where_a_row_has_one():
    row = Result("c", "headline", 0.0, "tiny", "1x8", 1, 8, 1, "naive", "eager", ttft_ms=2.0)
    assert "speedup" not in format_table([row])
    row.speedup = 1.0
    assert "speedup" in format_table([row])


def test_benchmarks_write_under_out_and_say_when_they_replace_data(capsys):
    """Every benchmark's --out defaults under out/; a run into data/ says, in one line, that it
    replaces the committed record; elsewhere it says nothing."""
    from mamba_edu._runtime import data_dir
    from mamba_edu.benchmarks.common import OUT, say_where
    from mamba_edu.benchmarks.ttft import build_parser

    assert build_parser().parse_args([]).out == OUT / "bench" and OUT.parts == ("out",)
    say_where(OUT / "bench")
    assert capsys.readouterr().out == ""
    say_where(data_dir() / "bench" / "buckets")
    said = capsys.readouterr().out
    assert said.count("\n") == 1 and "replaces the committed record" in said


def test_ttft_and_ttft_tp_share_the_harness_without_importing_each_other():
    """ttft_tp takes the harness from common, never from ttft (no import circle)."""
    import ast
    from pathlib import Path

    import mamba_edu.benchmarks as pkg

    folder = Path(pkg.__file__).parent
    for name, other in (("ttft_tp", "ttft"), ("common", "ttft"), ("common", "ttft_tp")):
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert f"mamba_edu.benchmarks.{other}" not in imported, (name, other)
