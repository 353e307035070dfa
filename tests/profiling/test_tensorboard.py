"""TensorBoard's profiler plugin serves our runs: one recorded here, and one of data/runs.

torch-tb-profiler is deprecated upstream (docs/profiling.md), so this only checks what the course
documents: ``tensorboard --logdir <dir>`` lists the runs and their overview loads.
"""

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import pytest
import torch

from mamba_edu.profiling.traces import record_trace

pytest.importorskip("tensorboard")
pytest.importorskip("torch_tb_profiler")

COMMITTED_RUNS = Path(__file__).resolve().parents[2] / "data" / "runs"
DEADLINE_S = 50


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(base: str, route: str, **params):
    query = f"?{urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{base}/data/plugin/pytorch_profiler/{route}{query}", timeout=5) as r:
        return json.load(r)


def wait_for_runs(base: str, expected: set[str], deadline: float) -> list[str]:
    """Poll the plugin's run list until TensorBoard serves and has loaded every expected run."""
    while time.monotonic() < deadline:
        try:
            listing = get_json(base, "runs")
            if expected <= set(listing["runs"]) and not listing["loading"]:
                return listing["runs"]
        except (urllib.error.URLError, ConnectionError):
            pass  # not serving yet
        time.sleep(0.5)
    pytest.fail(f"TensorBoard did not serve the runs {sorted(expected)} within {DEADLINE_S} s")


@pytest.fixture
def logdir(tmp_path):
    """A run recorded now, next to a copy of the smallest committed run (when there is one:
    the plugin parses every trace in Python, so all of them would not fit the time bound)."""
    root = tmp_path / "runs"
    x = torch.randn(256)
    record_trace(lambda: (x > 0).nonzero(), tmp_path / "traces", "recorded", tensorboard_dir=root)
    committed = [d for d in COMMITTED_RUNS.glob("*") if any(d.glob("*.pt.trace.json*"))]
    if committed:
        smallest = min(committed, key=lambda d: sum(f.stat().st_size for f in d.iterdir()))
        shutil.copytree(smallest, root / "committed" / smallest.name)
    return root


def run_names(root: Path) -> set[str]:
    """What the plugin calls each run: its folder relative to the logdir."""
    return {p.parent.relative_to(root).as_posix() for p in root.rglob("*.pt.trace.json*")}


def test_tensorboard_serves_the_profiler_runs(logdir):
    deadline = time.monotonic() + DEADLINE_S
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
         "--port", str(port), "--load_fast", "false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        expected = run_names(logdir)
        assert "recorded" in expected
        wait_for_runs(base, expected, deadline)
        for run in sorted(expected):
            assert "Overview" in get_json(base, "views", run=run)
            worker = get_json(base, "workers", run=run, view="Overview")[0]
            span = get_json(base, "spans", run=run, worker=worker)[0]
            overview = get_json(base, "overview", run=run, worker=worker, span=span)
            assert overview["steps"]["rows"], f"empty overview for {run}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
