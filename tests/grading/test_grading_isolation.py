"""Isolation between students and from the instructor: what one notebook's judge cannot reach.

The class tests grade two students of notebook 00 (the fastest to run): the first student's
notebook writes a ``.pth`` into Python's site folder, appends to a package file and overwrites the
second student's notebook; the second's grade must not move, and the first gets 0 with the reason.
They run the grader from a copy of the package, so that a failure cannot damage this checkout.
"""

import io
import json
import os
import queue
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")

from mamba_edu.grading import grader
from mamba_edu.grading.containment import JudgeLimits, landlock_abi
from mamba_edu.grading.judge import Pristine

ROOT = Path(__file__).resolve().parents[2]
SOLUTION_00 = ROOT / "notebooks" / "solutions" / "00_start_here.ipynb"
needs_landlock = pytest.mark.skipif(landlock_abi() == 0, reason="this kernel has no Landlock")


def _notebook(path: Path, *cells: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path)


def _grade_class(tmp_path: Path, attack: list[str], confined: bool) -> list[dict]:
    """Grade ``aaron`` (the ``attack`` cells) then ``bob`` (the solution of notebook 00) with the
    grader of a package copy; each notebook's status, reason and exercises."""
    shutil.copytree(ROOT / "mamba_edu", tmp_path / "site" / "mamba_edu", ignore=shutil.ignore_patterns("__pycache__"))
    _notebook(tmp_path / "cls" / "aaron" / "00_start_here.ipynb", *attack)
    (tmp_path / "cls" / "bob").mkdir()
    shutil.copy(SOLUTION_00, tmp_path / "cls" / "bob" / "00_start_here.ipynb")
    code = ("import json, sys\nfrom pathlib import Path\nimport mamba_edu.grading.grader as g\n"
            f"g.CONFINED = g.CONFINED and {confined}\n"
            "r = g.grade_paths([Path('cls/aaron/00_start_here.ipynb'), Path('cls/bob/00_start_here.ipynb')], 300)\n"
            "print(json.dumps([{'status': x.status, 'reason': x.reason, 'passed': x.passed, 'total': x.total}"
            " for x in r]))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@needs_landlock
@pytest.mark.solutions
def test_one_student_cannot_touch_the_environment_the_package_or_another_student(tmp_path):
    pth = Path(site.getsitepackages()[0]) / "zz_mamba_edu_isolation_test.pth"
    victim = tmp_path / "cls" / "bob" / "00_start_here.ipynb"
    package_file = tmp_path / "site" / "mamba_edu" / "gdn" / "gating.py"
    attack = [f"open({str(pth)!r}, 'w').write('import os\\n')",
              f"open({str(package_file)!r}, 'a').write('\\nraise SystemExit\\n')",
              f"open({str(victim)!r}, 'w').write('{{}}')",
              f"print(open({str(victim)!r}).read())"]
    try:
        aaron, bob = _grade_class(tmp_path, attack, confined=True)
    finally:
        pth.unlink(missing_ok=True)
    assert aaron["status"] == "zero" and f"tried to write {pth}" in aaron["reason"], aaron
    assert bob == {"status": "graded", "reason": "", "passed": 2, "total": 2}, bob
    assert victim.read_bytes() == SOLUTION_00.read_bytes()
    assert "raise SystemExit" not in package_file.read_text()


@pytest.mark.solutions
def test_unconfined_a_change_made_past_the_audit_hook_zeroes_its_notebook_and_stops_the_run(tmp_path):
    """No Landlock: a write through a shell escapes the judge's audit hook, but not the grader's
    look at the environment after the notebook: 0 for it, and no later grade is trusted."""
    package_file = tmp_path / "site" / "mamba_edu" / "gdn" / "gating.py"
    attack = [f"import subprocess\nsubprocess.run(['sh', '-c', 'echo >> {package_file}'])"]
    aaron, bob = _grade_class(tmp_path, attack, confined=False)
    assert aaron["status"] == "zero" and f"changed {package_file}" in aaron["reason"], aaron
    assert bob["status"] == "zero" and "earlier in this run" in bob["reason"], bob


@needs_landlock
def test_a_confined_process_reads_and_writes_only_its_folders(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    probe = ("import os, sys\n"
             "def t(f):\n    try:\n        f(); return 'ok'\n    except OSError as e:\n        return type(e).__name__\n"
             "print(t(lambda: open(sys.argv[1] + '/x', 'w').write('1')),"
             " t(lambda: open(sys.prefix + '/zz_isolation_probe', 'w')),"
             " t(lambda: open(sys.argv[2]).read()),"
             " t(lambda: open(f'/proc/{sys.argv[3]}/fd/1', 'w')),"
             " t(lambda: open(f'/proc/{sys.argv[3]}/mem', 'rb')))\n")
    readable, _ = grader.judge_folders(own, tmp_path / "package")
    command = JudgeLimits().launcher(readable, [str(own)]) + [sys.executable, "-I", "-c", probe, str(own),
                                                                str(ROOT / "README.md"), str(os.getpid())]
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.stdout.split() == ["ok", "PermissionError", "PermissionError", "PermissionError", "PermissionError"], \
        (run.stdout, run.stderr)
    assert not Path(sys.prefix, "zz_isolation_probe").exists()


def test_the_audit_hook_refuses_a_write_outside_and_flags_inspection(tmp_path):
    code = ("import os, sys\nfrom mamba_edu.grading.judge import Watch\nsaid = []\n"
            "sys.addaudithook(Watch([os.getcwd()], lambda **m: said.append(m)))\n"
            "open('inside.txt', 'w').write('fine')\n"
            f"try:\n    open({str(tmp_path / 'outside.txt')!r}, 'w')\nexcept PermissionError:\n    pass\n"
            "exec(compile('sys._getframe(0)', '<ipython-input-3-x>', 'exec'))\n"
            "exec(compile('import logging\\nlogging.currentframe()', '<ipython-input-4-x>', 'exec'))\n"
            "exec(compile('from unittest import mock\\nmock.Mock(side_effect=sys._current_frames)()',"
            " '<ipython-input-5-x>', 'exec'))\n"
            f"sys.path.insert(0, {str(tmp_path / 'lib')!r})\n"  # a library's profiler: not the notebook's
            "exec(compile('import profiling_lib\\nprofiling_lib.start()', '<ipython-input-6-x>', 'exec'))\n"
            "print(repr(said))\n")
    (tmp_path / "cwd").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "profiling_lib.py").write_text("import sys\n\ndef start():\n    sys.setprofile(None)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path / "cwd",
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    said = eval(run.stdout)  # noqa: S307 - our own repr of dicts of strings
    assert said[0] == {"refused": f"tried to write {tmp_path / 'outside.txt'}, outside its folder"}
    for event, cell in (("sys._getframe", "cell 3"), ("sys._getframe", "cell 4 line 2"),  # logging's getter
                        ("sys._current_frames", "cell 5 line 2")):  # through a Mock's side_effect
        assert any(f"frame or memory inspection ({event})" in m.get("review", "") and cell in m["review"]
                   for m in said), said
    assert not any("cell 6" in m.get("review", "") for m in said), said  # torch.profiler(with_stack=True) does this
    assert (tmp_path / "cwd" / "inside.txt").exists() and not (tmp_path / "outside.txt").exists()


def test_what_the_cells_replace_in_the_package_is_put_back_and_named():
    from mamba_edu.exercises import core
    from mamba_edu.gdn import gating

    pristine = Pristine()
    judge, code = core.judge, gating.l2norm.__code__
    core.judge = lambda *a: "PASS"
    gating.l2norm.__code__ = (lambda x: x).__code__
    core.len = lambda x: 0  # a global that would shadow a builtin in the checks
    changed = pristine.restore()
    assert core.judge is judge and gating.l2norm.__code__ is code and not hasattr(core, "len")
    assert {"mamba_edu.exercises.core.judge", "mamba_edu.exercises.core.len (added)"} <= set(changed), changed
    assert any("l2norm (its code)" in name for name in changed), changed


def test_what_the_cells_replace_in_torch_is_put_back_and_named():
    """A cell that zeroes torch's norm (through a name of its own) or Tensor's subtraction would make
    every relative error 0; the library's own lazy wrappers (dynamo's of manual_seed) are left alone."""
    import functools
    import math

    import torch

    pristine = Pristine()
    norm, sub, seed, isclose = torch.linalg.vector_norm, torch.Tensor.__sub__, torch.manual_seed, math.isclose
    torch.manual_seed = torch._disable_dynamo(seed)  # what dynamo does to it when first imported
    import copy
    import pickle
    copy.copy(torch.ones(2)), pickle.dumps(torch.ones(2))  # caches Python adds to the class
    try:
        assert pristine.restore() == []
    finally:
        torch.manual_seed = seed
    linalg = torch.linalg
    linalg.vector_norm = lambda *a, **k: torch.zeros(())
    torch.Tensor.__sub__ = lambda a, b: a
    torch.manual_seed = functools.wraps(seed)(lambda s: seed(s))  # a cell's wrapper: its code is the cell's
    math.isclose = lambda *a, **k: True  # a module without a file
    try:
        changed = pristine.restore()
    finally:
        linalg.vector_norm, torch.manual_seed, math.isclose = norm, seed, isclose
        vars(torch.Tensor).get("__sub__") and delattr(torch.Tensor, "__sub__")
    assert {"torch.linalg.vector_norm", "torch.Tensor.__sub__ (added)", "torch.manual_seed",
            "math.isclose"} <= set(changed), changed
    assert torch.linalg.vector_norm is norm and torch.Tensor.__sub__ is sub and math.isclose is isclose


def test_an_answer_that_patches_what_the_check_compares_with_fails_and_is_undone():
    """Patched while the answer runs (after the cells' patches were put back): undone after each
    call, before the check compares, and the exercise fails."""
    import torch

    from mamba_edu.exercises import core, nb01
    from mamba_edu.grading.judge import judge_exercise

    norm, check_module = torch.linalg.vector_norm, vars(nb01).copy()

    def patches_torch(x):
        torch.linalg.vector_norm = lambda *a, **k: torch.zeros(())
        return x.float()

    def patches_the_check(x):
        for name, value in vars(nb01).items():  # every helper of the check, through a loop
            if callable(value) and not isinstance(value, type):
                setattr(nb01, name, lambda *a, **k: 0.0)
        return x.float()

    exercise = core.REGISTRY[nb01.NOTEBOOK][1]
    for answer, replaced in ((patches_torch, "torch.linalg.vector_norm"), (patches_the_check, "mamba_edu.exercises.nb01")):
        verdict = judge_exercise(exercise, {exercise.names[0]: answer})
        assert verdict.status == core.FAIL and f"the answer replaced {replaced}" in verdict.message, verdict
    assert torch.linalg.vector_norm is norm and vars(nb01) == check_module


def test_the_report_pipe_is_bounded():
    """One endless line (here 1 MiB without a newline) stops the reading at MAX_LINE bytes."""
    lines = queue.Queue()
    grader._read_lines(io.BufferedReader(io.BytesIO(b"x" * 2**20)), lines)
    assert lines.get_nowait() == b"" and lines.empty()
    lines = queue.Queue()
    grader._read_lines(io.BufferedReader(io.BytesIO(b"ok\n" * (grader.MAX_LINES + 5))), lines)
    assert lines.qsize() == grader.MAX_LINES + 1 and list(lines.queue)[-1] == b""


def test_the_judge_is_an_isolated_python_without_the_seed(monkeypatch, tmp_path):
    from mamba_edu.exercises.core import SEED_VARIABLE

    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret")
    monkeypatch.setenv(SEED_VARIABLE, "12345")
    monkeypatch.setenv("PYTHONPATH", "/somewhere/writable")
    monkeypatch.setenv("PATH", "/usr/bin")
    env = grader.judge_environment(tmp_path / "private")
    assert env["PATH"] == "/usr/bin" and "GITHUB_TOKEN" not in env and SEED_VARIABLE not in env and "PYTHONPATH" not in env
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path / "private")
    command = grader.judge_command(tmp_path / "package")
    assert command[1:3] == ["-I", "-B"] and command[-1] == str(tmp_path / "package")
