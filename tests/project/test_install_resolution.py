"""The pinned set resolves where learners install it: plain PyPI, not this machine's index.

- Linux x86_64 (GPU or not): ``pip install --isolated --dry-run -r requirements-pinned.txt``,
  the command a learner's pip runs (``--isolated`` ignores every pip config file and PIP_*
  variable, so a local index that serves ``torch+cpu`` cannot hide a conflict). It gets PyPI's
  CUDA torch, the triton it requires and the CUDA stack of constraints-cuda.txt.
- macOS (Apple silicon, 14+) and Windows x86_64: pip evaluates environment markers for the
  machine it runs on, so these use ``uv pip compile --python-platform`` (uv comes with
  requirements-ci.txt; skipped, saying so, without it).

Marked ``network``: skipped, with the reason, when PyPI cannot be reached.
"""

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PINNED = REPO / "requirements-pinned.txt"
PYPI = "https://pypi.org/simple"


def pypi_reachable() -> bool:
    try:
        with socket.create_connection(("pypi.org", 443), timeout=5):
            return True
    except OSError:
        return False


pytestmark = [
    pytest.mark.network,
    pytest.mark.extra,
    pytest.mark.skipif(not PINNED.exists(), reason="no requirements-pinned.txt: not a source checkout"),
    pytest.mark.skipif(not pypi_reachable(), reason="PyPI (pypi.org:443) cannot be reached: no network"),
]


def pins(path: Path) -> dict[str, set[str]]:
    """name -> the pinned versions (more than one where the lock splits by Python version)."""
    out: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith(("#", "-")):
            req = Requirement(line)
            out.setdefault(canonicalize_name(req.name), set()).add(str(next(iter(req.specifier)).version))
    return out


def clean_env() -> dict[str, str]:
    """No pip or uv settings of this machine (extra indexes, constraints)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}


@pytest.mark.skipif(not (sys.platform == "linux" and platform.machine() == "x86_64"),
                    reason="pip resolves for the machine it runs on: this one is not Linux x86_64")
def test_pinned_set_resolves_on_plain_pypi_for_linux(tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed",
         "--quiet", "--report", str(report), "-r", str(PINNED)],
        capture_output=True, text=True, env=clean_env(), timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:]
    got = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
           for i in json.loads(report.read_text())["install"]}
    assert got["torch"] == "2.13.0"  # PyPI's CUDA build, not a local +cpu one
    assert {got["triton"]} == pins(PINNED)["triton"]
    cuda = pins(REPO / "constraints-cuda.txt")
    assert {got["nvidia-cublas"]} == cuda["nvidia-cublas"]
    lock = pins(PINNED) | cuda
    unpinned = {name: v for name, v in got.items() if v not in lock.get(name, set())}
    assert unpinned == {}, f"installed but not as pinned: {unpinned}"


def uv_command() -> list[str] | None:
    if shutil.which("uv"):
        return ["uv"]
    import importlib.util

    return [sys.executable, "-m", "uv"] if importlib.util.find_spec("uv") else None


@pytest.mark.parametrize("target, has_triton", [("aarch64-apple-darwin", False),
                                                ("x86_64-pc-windows-msvc", False),
                                                ("x86_64-manylinux_2_28", True)])
def test_pinned_set_resolves_on_plain_pypi_per_platform(tmp_path, target, has_triton):
    uv = uv_command()
    if uv is None:
        pytest.skip("uv is not installed (pip install -r requirements-ci.txt brings it)")
    out = tmp_path / "resolved.txt"
    env = clean_env() | {"MACOSX_DEPLOYMENT_TARGET": "14.0"}  # torch 2.13's macOS wheels: 14+
    done = subprocess.run(
        [*uv, "pip", "compile", str(PINNED), "--python-platform", target, "--python-version",
         "3.11", "--index-url", PYPI, "--no-header", "--no-annotate", "--quiet", "-o", str(out)],
        capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-4000:]
    got = pins(out)
    assert got["torch"] == {"2.13.0"}
    assert ("triton" in got) == has_triton
    lock = pins(PINNED) | pins(REPO / "constraints-cuda.txt")
    assert {name: v for name, v in got.items() if not v <= lock.get(name, set())} == {}
