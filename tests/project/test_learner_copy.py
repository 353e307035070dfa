"""The copy a teacher hands out (docs/teaching.md: the repository without ``notebooks/solutions/``)
passes its own ``make test``: the tests that need the solutions skip, saying why.

In ``make test-extra``: it runs a whole ``make test`` (about 3 min on 2 cores) in a copy of the
tracked files, with this environment (``VENV=``) so that nothing is installed again.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.prefix)

pytestmark = [
    pytest.mark.extra,
    pytest.mark.skipif(not (ROOT / ".git").exists() or shutil.which("git") is None or shutil.which("make") is None,
                       reason="needs a git checkout, git and make"),
    pytest.mark.skipif(not (VENV / ".installed").exists(),
                       reason="needs the make-built environment (.venv/.installed): run it through make test-extra"),
]


def learner_copy(target: Path) -> Path:
    """The tracked files without notebooks/solutions/, as a teacher hands them out."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if name.startswith("notebooks/solutions/") or not (ROOT / name).is_file():
            continue
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target / name)
    return target


def test_learner_copy_passes_its_own_make_test(tmp_path):
    copy = learner_copy(tmp_path / "course")
    assert not (copy / "notebooks" / "solutions").exists() and (copy / "notebooks").is_dir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
    # -o: the copy's files are as new as the checkout's, so an edited pyproject.toml would make the
    # copy's make re-run setup, which would install the copy (a temporary folder) into the shared venv.
    done = subprocess.run(["make", "test", f"VENV={VENV}", "-o", f"{VENV}/.installed"], cwd=copy,
                          capture_output=True, text=True, timeout=1800, env=env)
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and " failed" not in done.stdout, tail
    assert "needs notebooks/solutions/" in done.stdout, tail  # the solution tests said why they skipped
