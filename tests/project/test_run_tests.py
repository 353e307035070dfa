"""``make test``'s split (scripts/run_tests.py): measured seconds per file balance the two halves."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("run_tests", ROOT / "scripts" / "run_tests.py")
run_tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_tests)


def test_seconds_per_file_from_a_junit_report(tmp_path):
    report = tmp_path / "r.xml"
    report.write_text('<testsuites><testsuite>'
                      '<testcase classname="tests.test_a" name="x" time="1.5"/>'
                      '<testcase classname="tests.test_a" name="y" time="0.5"/>'
                      '<testcase classname="notebooks.00_start_here.ipynb" name="Cell 1" time="3"/>'
                      '</testsuite></testsuites>')
    assert run_tests.file_seconds(report) == {"tests/test_a.py": 2.0, "notebooks/00_start_here.ipynb": 3.0}


def test_measured_seconds_balance_the_halves_where_sizes_would_not():
    """By size the largest file would go alone; measured, the slow small one does."""
    paths = [ROOT / "tests" / where / f"test_{name}.py" for where, name in (("project", "cli"), ("project", "demo"), ("serving", "model"))]
    smallest = min(paths, key=lambda p: p.stat().st_size)
    assert [max(paths, key=lambda p: p.stat().st_size)] in run_tests.split(paths, 2)
    slow = {p.relative_to(ROOT).as_posix(): 100.0 if p == smallest else 1.0 for p in paths}
    assert [smallest] in run_tests.split(paths, 2, slow)


def test_every_file_make_test_runs_has_a_measured_time():
    durations = run_tests.measured()
    files = sorted((ROOT / "tests").glob("**/test_*.py")) + sorted((ROOT / "notebooks").glob("*.ipynb"))
    unmeasured = [p.name for p in files if p.relative_to(ROOT).as_posix() not in durations]
    assert len(unmeasured) <= len(files) // 4, f"rerun `python scripts/run_tests.py --record`: {unmeasured}"
