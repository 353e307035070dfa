"""``make test``: pytest over the unit tests and nbval over the learner notebooks, in two processes.

The tests are single-threaded (``OMP_NUM_THREADS=1``: tiny tensors gain nothing from more threads,
and on a loaded machine they oversubscribe the cores), so one process uses one core. This script
splits the test files and the learner notebooks into two halves of about equal expected time and
runs one pytest process per half, side by side, each printing to its own log; then it prints
both logs and exits with the worse status (pytest's 5, "nothing collected", counts as success).

The expected time of a file is its measured time in ``tests/durations.json`` (seconds per file,
from a run on a 2-core machine; ``--record`` measures the run and rewrites it), else an estimate
from its size.

    python scripts/run_tests.py [--jobs N] [--record] [pytest arguments ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Seconds per unit, from a run on 2 cores: a test file by its size, a notebook by its code cells.
SECONDS_PER_TEST_KB = 0.25
SECONDS_PER_NOTEBOOK_CELL = 0.4
DURATIONS = ROOT / "tests" / "durations.json"


def measured() -> dict[str, float]:
    """Seconds per file (path relative to the root) of the last ``--record``; empty without it."""
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


def weight(path: Path, durations: dict[str, float] | None = None) -> float:
    rel = path.relative_to(ROOT).as_posix()
    if durations and rel in durations:
        return durations[rel]
    if path.suffix == ".ipynb":
        return SECONDS_PER_NOTEBOOK_CELL * path.read_text().count('"cell_type": "code"')
    return SECONDS_PER_TEST_KB * path.stat().st_size / 1024


def split(paths: list[Path], jobs: int, durations: dict[str, float] | None = None) -> list[list[Path]]:
    """Greedy: the heaviest path first, each into the lightest group so far."""
    groups: list[list[Path]] = [[] for _ in range(jobs)]
    loads = [0.0] * jobs
    for path in sorted(paths, key=lambda p: weight(p, durations), reverse=True):
        i = loads.index(min(loads))
        groups[i].append(path)
        loads[i] += weight(path, durations)
    return [sorted(g) for g in groups if g]


def file_seconds(junit_xml: Path) -> dict[str, float]:
    """Seconds per file from a pytest JUnit report (``tests.test_x`` → ``tests/test_x.py``,
    ``notebooks.NN_name.ipynb`` → ``notebooks/NN_name.ipynb``)."""
    out: dict[str, float] = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        module = case.get("classname", "")
        rel = (module.replace(".", "/", 1) if module.endswith(".ipynb")
               else module.replace(".", "/") + ".py")
        out[rel] = out.get(rel, 0.0) + float(case.get("time", 0))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="pytest processes side by side")
    parser.add_argument("--record", action="store_true",
                        help=f"measure each file's time and rewrite {DURATIONS.relative_to(ROOT)}")
    args, pytest_args = parser.parse_known_args(argv)
    paths = sorted((ROOT / "tests").glob("**/test_*.py")) + sorted((ROOT / "notebooks").glob("*.ipynb"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--nbval-lax",
            "--nbval-current-env", "-m", "not extra", *pytest_args]
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for i, group in enumerate(split(paths, max(1, args.jobs), measured())):
            log = open(Path(tmp) / f"part{i}.log", "w+")
            report = [f"--junitxml={Path(tmp) / f'part{i}.xml'}"] if args.record else []
            runs.append((log, subprocess.Popen([*base, *report, *map(str, group)], cwd=ROOT, env=env,
                                               stdout=log, stderr=subprocess.STDOUT)))
        codes = []
        for i, (log, proc) in enumerate(runs):
            codes.append(proc.wait())
            log.seek(0)
            print(f"===== part {i + 1} of {len(runs)} =====")
            print(log.read(), end="", flush=True)
            log.close()
        if args.record:
            seconds: dict[str, float] = {}
            for i in range(len(runs)):
                seconds |= file_seconds(Path(tmp) / f"part{i}.xml")
            DURATIONS.write_text(json.dumps({k: round(v, 1) for k, v in sorted(seconds.items())},
                                            indent=0) + "\n")
    failed = [c for c in codes if c not in (0, 5)]
    return failed[0] if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
