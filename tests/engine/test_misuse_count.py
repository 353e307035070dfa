"""The misuse table is reproducible: every bad input of tests/engine/test_misuse.py is a clear error."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_bad_input_is_a_clear_error():
    run = subprocess.run([sys.executable, "-m", "pytest", "tests/engine/test_misuse.py", "-q",
                          "-p", "scripts.count_misuse", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:]
    row = re.search(r"\| bad inputs \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|", run.stdout)
    assert row, run.stdout[-2000:]
    clear, vague, silent, crash, total = map(int, row.groups())
    assert (vague, silent, crash) == (0, 0, 0) and clear == total >= 130, row.group(0)
