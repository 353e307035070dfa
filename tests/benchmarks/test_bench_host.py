"""bench-host (mamba_edu/benchmarks/host.py): the emulated CUDA eager path runs on a CPU, counts
something, stamps its JSON, and writes under data/ only when told to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-m", "mamba_edu.benchmarks.host", "--preset", "tiny",
                           "--strategies", "fused", "--runs", "1", "--warmup", "0", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    cwd = tmp_path_factory.mktemp("bench_host")
    out = cwd / "host.json"
    proc = _run(cwd, "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def test_counts_are_positive(result):
    fused = result["results"]["fused"]
    assert fused["launches"] > 0 and fused["launches_by_kernel"]
    assert fused["torch_ops"] > 0 and fused["gpu_ops"] >= fused["launches"]
    assert fused["py_calls"] > 0 and fused["py_calls_per_gpu_op"] > 0
    assert fused["host_ms"]["median"] > 0
    assert fused["syncs"] == 0  # fused never reads device data on the host


def test_json_is_stamped(result):
    meta = result["meta"]
    for field in ("commit", "date", "device", "torch", "triton", "python", "clock_log", "method"):
        assert field in meta
    assert meta["date"] and meta["torch"] and "emulated" in meta["method"]


def test_default_out_is_not_data(tmp_path):
    from mamba_edu.benchmarks.host import DEFAULT_OUT, out_path

    assert not Path(DEFAULT_OUT).parts[0] == "data"
    assert out_path(None) == Path(DEFAULT_OUT)
    proc = _run(tmp_path, "--no-calls")  # no --out: the default, relative to the working dir
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / DEFAULT_OUT).is_file()
    assert not (tmp_path / "data").exists()
