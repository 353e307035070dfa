"""``torchrun --nproc-per-node 2 -m mamba_edu bench --tp 2 --device cpu``: the TTFT bench on 2 gloo
ranks (tiny preset, one case), and its refusals.

The run goes through torchrun in a subprocess of its own process group, killed whole after
:data:`TIMEOUT` seconds: a hung rank cannot hang the test. On the CPU there are no CUDA graphs,
so the piecewise and graph rows must be written as skipped with the reason; the NCCL path and the
graph replays with the collectives inside are not exercised here (they need GPUs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mamba_edu.benchmarks.ttft import modes
from mamba_edu.serving import STRATEGIES
from _helpers import run_main

TIMEOUT = 80  # seconds for the whole torchrun (measured: about 10 s on 2 shared cores)
CASE = "launch_bound_1x512"


def torchrun() -> list[str]:
    """The venv's ``torchrun`` next to this Python, else ``python -m torch.distributed.run``."""
    script = Path(sys.executable).with_name("torchrun")
    return [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]


def run_torchrun(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(TRITON_INTERPRET="1", MPLBACKEND="Agg")
    cmd = [*torchrun(), "--standalone", "--nproc-per-node", "2", "-m", "mamba_edu", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # its own group: the ranks go with it
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun ran past {TIMEOUT} s:\n{out}\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    """One 2-rank run: (stdout, results.json, the output folder)."""
    out = tmp_path_factory.mktemp("bench_tp2")
    done = run_torchrun("bench", "--tp", "2", "--device", "cpu", "--cases", CASE, "--quick",
                        "--repeats", "2", "--warmup", "1", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    return done.stdout, json.loads((out / "results.json").read_text()), out


@pytest.mark.extra  # several processes
def test_rows_for_both_ranks_and_every_strategy(tp2):
    _, results, out = tp2
    rows = results["results"]
    assert {(r["rank"], r["world"]) for r in rows} == {(0, 2), (1, 2)}
    for rank in (0, 1):
        labels = {(r["strategy"], r["mode"]) for r in rows if r["rank"] == rank}
        assert labels == {(s, m) for s in STRATEGIES for m in modes(s, True)}, rank
    eager = [r for r in rows if r["mode"] == "eager"]
    assert len(eager) == 2 * len(STRATEGIES)
    for r in eager:
        assert r["error"] is None and r["skipped"] is None, r
        assert r["ttft_ms"] > 0 and r["host_ms"] > 0 and r["repeats"] == 2 and r["preset"] == "tiny"
    # the per-rank traces (profiled forward) in runs/rank<r>/<case>/, one per strategy
    for rank in (0, 1):
        traces = sorted(p.name for p in (out / "runs" / f"rank{rank}" / CASE).glob("*.pt.trace.json.gz"))
        assert traces == sorted(f"{s}.pt.trace.json.gz" for s in STRATEGIES)
    assert (out / "results.csv").read_text().count("\n") == len(rows) + 1


@pytest.mark.extra  # several processes
def test_syncs_per_rank_equal_the_one_rank_counts(tp2):
    """The collectives add no sync and every rank plans alike: each rank counts, per strategy,
    what the full model counts on one device (naive per layer, precomputed 11, none without)."""
    _, results, _ = tp2
    eager = [r for r in results["results"] if r["mode"] == "eager"]
    for r in eager:
        assert r["syncs"] == r["syncs_1_rank"], (r["strategy"], r["rank"])
    by = {r["strategy"]: r["syncs"] for r in eager if r["rank"] == 1}
    assert by["naive"] > by["precomputed"] == 11 and by["sync_free"] == by["fused"] == 0


@pytest.mark.extra  # several processes
def test_graph_rows_are_skipped_on_cpu_with_the_reason(tp2):
    _, results, _ = tp2
    graphs = [r for r in results["results"] if r["mode"] != "eager"]
    assert {r["mode"] for r in graphs} == {"breakable", "gdn_inside", "graph"}
    for r in graphs:
        assert "CUDA graphs need a GPU" in r["skipped"] and "gloo" in r["skipped"], r
        assert r["ttft_ms"] is None and r["syncs"] is None and r["error"] is None


@pytest.mark.extra  # several processes
def test_meta_and_the_table_from_rank_zero_only(tp2):
    stdout, results, _ = tp2
    for key in ("commit", "date", "device", "torch", "triton", "devices"):
        assert key in results, key
    assert results["world"] == 2 and results["backend"] == "gloo" and results["devices"] == ["cpu", "cpu"]
    assert results["torch"] == torch.__version__
    assert stdout.count("bench --tp 2: 2 ranks (gloo on cpu)") == 1  # rank 1 prints nothing
    assert stdout.count("case ") == 1
    for strategy in STRATEGIES:
        lines = [ln.split() for ln in stdout.splitlines() if ln.startswith(CASE) and ln.split()[1] == strategy]
        assert [ln[2] for ln in lines] == ["0", "1"], strategy  # a line per rank
    assert "skipped*" in stdout and "* CUDA graphs need a GPU" in stdout
    assert "every rank counts what the 1-rank model counts" in stdout


def test_tp_without_torchrun_is_refused_in_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    code, out, err = run_main(capsys, "bench", "--tp", "2", "--device", "cpu", "--out", str(tmp_path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "WORLD_SIZE is not set" in err and "torchrun --nproc-per-node 2" in err


def test_tp_not_splitting_the_heads_is_refused(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    code, out, err = run_main(capsys, "bench", "--tp", "3", "--device", "cpu", "--out", str(tmp_path))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--tp 3 does not fit preset 'tiny'" in err and "GDN value heads (4) do not split into 3" in err


@pytest.mark.parametrize("tp, world, says", [
    ("2", "4", "needs 2 processes but torchrun started WORLD_SIZE=4"),
    ("1", "2", "torchrun started WORLD_SIZE=2 processes but --tp is 1")])
def test_tp_other_than_torchruns_processes_is_refused(capsys, monkeypatch, tmp_path, tp, world, says):
    monkeypatch.setenv("WORLD_SIZE", world)
    code, _, err = run_main(capsys, "bench", "--tp", tp, "--device", "cpu", "--out", str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and says in err, err



def test_a_rank_counting_other_syncs_fails_the_run(capsys):
    """exit 1 and a FAIL line when one rank's count differs from the 1-rank one."""
    from mamba_edu.benchmarks.ttft import headline_cases
    from mamba_edu.benchmarks.ttft_tp import TPResult, format_tp_table, verdict

    case = headline_cases()[1]
    rows = [TPResult.of(case, "tiny", "naive", "eager", ttft_ms=1.0, syncs=18, syncs_1_rank=18, rank=0),
            TPResult.of(case, "tiny", "naive", "eager", ttft_ms=1.0, syncs=19, syncs_1_rank=18, rank=1)]
    assert verdict(rows) == 1 and "FAIL: 1 row(s) count other syncs" in capsys.readouterr().out
    assert "SYNCS DIFFER" in format_tp_table(rows).splitlines()[2]
    assert verdict(rows[:1]) == 0
