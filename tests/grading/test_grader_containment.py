"""Grading contains what a notebook starts (issue: a process started with setsid outlived grading
and rewrote later verdicts and reports) and gives it no path back to the checkout."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")  # the notebook tests need it; a bare GPU machine lacks it

pytestmark = pytest.mark.extra

ROOT = Path(__file__).resolve().parents[2]


def alive_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry))
    return found


def test_kill_descendants_reaches_a_setsid_grandchild():
    """The mechanism alone: a child that double-forks a setsid'd sleeper, then exits."""
    marker = f"{time.time():.6f}"
    code = ("import os, subprocess; "
            f"subprocess.Popen(['sleep', '300', '{marker}'], start_new_session=True); os._exit(0)")
    probe = subprocess.run([sys.executable, "-c",
                            "from mamba_edu.grading.containment import become_subreaper, kill_descendants\n"
                            "import subprocess, sys, time\n"
                            "assert become_subreaper()\n"
                            f"subprocess.run([sys.executable, '-c', {code!r}])\n"
                            "time.sleep(0.5)\n"
                            "print(kill_descendants())\n"], capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert int(probe.stdout.strip()) >= 1 and not alive_with(marker)


def test_nothing_a_notebook_starts_outlives_its_grading(tmp_path):
    marker = f"mamba-edu-containment-{uuid.uuid4().hex}"
    nb = nbformat.read(ROOT / "notebooks" / "00_start_here.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(
        "import json, os, subprocess, sys\n"
        f"subprocess.Popen(['setsid', 'sleep', '600', '{marker}'])\n"
        f"subprocess.Popen([sys.executable, '-c', 'import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n"
        f"    time.sleep(600)  # {marker}'])\n"))
    folder = tmp_path / "submission"
    folder.mkdir()
    nbformat.write(nb, folder / "00_start_here.ipynb")
    result = subprocess.run([sys.executable, "-m", "mamba_edu", "grade", str(folder), "--json", "--timeout", "120"],
                            capture_output=True, text=True, timeout=900)
    assert result.stdout.strip().startswith("{"), result.stderr[-2000:]
    time.sleep(1)
    assert not alive_with(marker), "a process the notebook started outlived its grading"
