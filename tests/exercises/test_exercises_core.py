"""The exercise system: verdicts, the stub generator, the two notebook versions, the grader."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")  # the notebook tests need it; a bare GPU machine lacks it

from mamba_edu.exercises import core
from mamba_edu.exercises.stubs import has_solution, learner_notebook, strip_solutions

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = sorted((NOTEBOOKS / "solutions").glob("*.ipynb"))


# --- verdicts -------------------------------------------------------------------------------

def _exercise(check):
    return core.Exercise("00_test", 1, "a test", ("my_f",), check)


def _calls(fn):
    fn()
    return "it works"


def _stub(*args):
    raise NotImplementedError("hint: write it")


def test_judge_classifies_pass_fail_not_done_and_crashes():
    ex = _exercise(_calls)
    assert core.judge(ex, lambda: None) == core.Verdict(ex, core.PASS, "it works")
    assert core.judge(ex, _stub).status == core.NOT_DONE
    crash = core.judge(ex, lambda: 1 / 0)
    assert crash.status == core.FAIL and crash.message.startswith("ZeroDivisionError")

    def rejects(fn):
        raise AssertionError("expected 3, got 4")
    assert core.judge(_exercise(rejects), _stub) == core.Verdict(_exercise(rejects), core.FAIL, "expected 3, got 4")


def test_a_wrapped_stub_is_not_done():
    """A GPU compiler wraps the stub's NotImplementedError in its own error; that is not a fail."""
    def compiled(fn):
        try:
            fn()
        except NotImplementedError as err:
            raise RuntimeError("CompilationError at line 3: raise NotImplementedError(...)") from err
    assert core.judge(_exercise(compiled), _stub).status == core.NOT_DONE


def test_verdict_lines():
    ex = _exercise(_calls)
    assert core.Verdict(ex, core.NOT_DONE).line() == "exercise 1: not done yet"
    assert core.Verdict(ex, core.PASS, "ok").line() == "exercise 1: PASS — ok"
    assert core.Verdict(ex, core.FAIL, "off by one").line() == "exercise 1: FAIL — off by one"


def test_checker_prints_one_line_and_names_missing_exercises(capsys):
    check = core.checker("01_gated_deltanet_recurrence")
    check(3, lambda value_head, H, HV: value_head % H)  # interleaved heads
    assert capsys.readouterr().out.startswith("exercise 3: FAIL — ")
    numbers = ", ".join(map(str, sorted(core.REGISTRY["01_gated_deltanet_recurrence"])))
    with pytest.raises(KeyError, match=f"registered: \\[{numbers}\\]"):
        check(99, _stub)


def test_the_judge_names_missing_functions_and_the_first_failing_cell():
    from mamba_edu.grading.judge import judge_exercise

    exercises = core.REGISTRY["01_gated_deltanet_recurrence"]
    assert judge_exercise(exercises[1], {"my_l2norm": _stub}).status == core.NOT_DONE
    missing = judge_exercise(exercises[2], {}, "; cell 3: NameError: name 'x' is not defined")
    assert missing.status == core.FAIL and missing.message == (
        "my_gating is not defined (did its cell run?); cell 3: NameError: name 'x' is not defined")


# --- the stub generator -----------------------------------------------------------------------

def test_strip_solutions_keeps_indentation_and_hint():
    source = ("def f(x):\n    \"\"\"doc\"\"\"\n    ### BEGIN SOLUTION hint: add one\n    y = x + 1\n"
              "    return y\n    ### END SOLUTION\n\nprint(f)")
    assert strip_solutions(source) == ("def f(x):\n    \"\"\"doc\"\"\"\n"
                                       "    raise NotImplementedError('hint: add one')\n\nprint(f)")
    assert strip_solutions("### BEGIN SOLUTION\nx = 1\n### END SOLUTION") == (
        "raise NotImplementedError('replace this line with your code')")


@pytest.mark.parametrize("source", ["### BEGIN SOLUTION\nx = 1", "x = 1\n### END SOLUTION",
                                    "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION"])
def test_strip_solutions_rejects_unbalanced_markers(source):
    with pytest.raises(ValueError, match="SOLUTION"):
        strip_solutions(source)


# --- the committed notebooks ------------------------------------------------------------------

@pytest.mark.solutions
def test_every_learner_notebook_has_a_solution_notebook():
    """An appendix without exercises may have no twin (notebook 11); every other notebook has one."""
    twinless = {p.name for p in NOTEBOOKS.glob("*.ipynb")
                if not (NOTEBOOKS / "solutions" / p.name).exists()}
    assert all("appendix" in n and not core.REGISTRY.get(Path(n).stem) for n in twinless), twinless
    learner = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb") if p.name not in twinless)
    assert learner == [p.name for p in SOLUTIONS]


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_learner_notebook_is_the_stripped_solution(solution):
    """Regenerate with `make notebooks` when this fails."""
    want = learner_notebook(nbformat.read(solution, as_version=4))
    got = nbformat.read(NOTEBOOKS / solution.name, as_version=4)
    assert [c.source for c in got.cells] == [c.source for c in want.cells]
    assert not any(has_solution(c.source) for c in got.cells)
    assert "solutions" not in "".join(c.source for c in got.cells if c.cell_type == "code")


def _check_outputs(path: Path) -> dict[int, str]:
    """Exercise number → the committed output of its check cell."""
    outputs = {}
    for cell in json.loads(path.read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and "exercises.check(" in source:
            assert source.startswith("# NBVAL_CHECK_OUTPUT"), source
            number = int(source.split("exercises.check(")[1].split(",")[0])
            outputs[number] = "".join("".join(o["text"]) for o in cell["outputs"] if "text" in o)
    return outputs


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_committed_outputs_not_done_for_learners_pass_for_solutions(solution):
    registered = sorted(core.REGISTRY.get(solution.stem, {}))
    solved, learner = _check_outputs(solution), _check_outputs(NOTEBOOKS / solution.name)
    assert sorted(solved) == sorted(learner) == registered
    for number in registered:
        assert solved[number].startswith(f"exercise {number}: PASS"), solved[number]
        assert learner[number] == f"exercise {number}: not done yet\n", learner[number]


def test_course_size():
    """At least 20 exercises, in every notebook but the optional appendices (notebook 10, the
    kernel lab, has none), each with its own rejection tests."""
    stems = [p.stem for p in NOTEBOOKS.glob("*.ipynb") if "appendix" not in p.stem]
    assert sum(len(core.REGISTRY.get(s, {})) for s in stems) >= 20
    for stem in stems:
        assert core.REGISTRY.get(stem), f"{stem} has no exercise"
        assert (ROOT / "tests" / "exercises" / f"test_exercises_nb{stem[:2]}.py").exists(), stem


# --- the grader -------------------------------------------------------------------------------

def _grade(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mamba_edu", "grade", str(path)],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.extra  # grading starts a worker and a kernel per notebook
@pytest.mark.solutions
def test_grader_on_both_versions_of_notebook_01():
    name = "01_gated_deltanet_recurrence.ipynb"
    learner = _grade(NOTEBOOKS / name)
    assert learner.returncode == 1, learner.stderr
    n = len(core.REGISTRY["01_gated_deltanet_recurrence"])
    assert learner.stdout.count(": not done") == n and f"score: 0/{n} (0 %)" in learner.stdout
    solved = _grade(NOTEBOOKS / "solutions" / name)
    assert solved.returncode == 0, solved.stdout + solved.stderr
    assert f"score: {n}/{n} (100 %)" in solved.stdout


@pytest.mark.extra  # grading starts a worker and a kernel per notebook
def test_grader_calls_the_checks_itself(tmp_path):
    """Printing a PASS line, or editing the check cell, does not fool the grader."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import torch\n"
        "def my_l2norm(x):\n    x = x.float()\n    return x / (x.norm(dim=-1, keepdim=True) + 1e-6)\n"
        "def my_key_head(value_head, H, HV):\n    return value_head % H\n"
        "print('exercise 1: PASS — trust me')")]
    nbformat.write(nb, tmp_path / "01_gated_deltanet_recurrence.ipynb")
    result = _grade(tmp_path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("graded with seed ") and lines[1] == "01_gated_deltanet_recurrence.ipynb"
    lines = lines[1:]
    assert lines[1].startswith("  exercise 1 (L2 norm, eps inside the root): fail — ")
    assert "my_gating is not defined" in lines[2] and lines[3].startswith("  exercise 3 (")
    assert f"score: 0/{len(core.REGISTRY['01_gated_deltanet_recurrence'])}" in result.stdout


def test_grader_without_notebooks_is_a_usage_error(tmp_path):
    result = _grade(tmp_path)
    assert result.returncode == 2 and "no notebook with registered exercises" in result.stderr
