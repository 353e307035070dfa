"""Grading a class (issue 37): one sub-folder per student, a fixed denominator over the whole
course, misnamed notebooks reported, a CSV grade book and feedback files.

Most tests replace ``grade_paths`` by a stand-in that runs no kernel; one module-scoped run of the
real command grades a two-student class (two kernels in all) and many tests read it."""

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")  # the notebook tests need it; a bare GPU machine lacks it

from mamba_edu.grading import cli as _cli_grade
from mamba_edu.grading import classroom
from mamba_edu.exercises.core import FAIL, NOT_DONE, PASS, REGISTRY
from mamba_edu.exercises.core import ExerciseResult, NotebookResult

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = NOTEBOOKS / "solutions"
START, POOL = "00_start_here", "05_state_pool_and_prefix_cache"
MISNAMED = f"{POOL} (1).ipynb"
COURSE = sum(len(exercises) for exercises in REGISTRY.values())


def _result(stem: str, status: str = PASS, notebook_status: str = "graded") -> NotebookResult:
    reason = "" if notebook_status == "graded" else "the kernel died"
    return NotebookResult(f"{stem}.ipynb", notebook_status, reason,
                          [ExerciseResult(n, ex.title, status, f"{status} message")
                           for n, ex in sorted(REGISTRY[stem].items())])


def _fake_grade_paths(paths, timeout, sandbox=False, report=None, started=None):
    """grade_paths without a kernel: every exercise of every notebook passes."""
    results = []
    for path in paths:
        started(path)
        results.append(_result(path.stem))
        report(results[-1])
    return results


@pytest.fixture
def no_kernel(monkeypatch):
    monkeypatch.setattr(classroom, "grade_paths", _fake_grade_paths)


def _touch(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("{}")
    return folder


def _misnamed() -> NotebookResult:
    return NotebookResult(MISNAMED, "misnamed", classroom.misnamed_reason(MISNAMED))


# --- names ------------------------------------------------------------------------------------

def test_a_misnamed_notebook_is_told_the_closest_course_name():
    assert classroom.misnamed_reason(MISNAMED) == (
        f"not graded: name does not match a course notebook; did you mean {POOL}.ipynb?")
    assert classroom.closest(f"Copy of {POOL}") == POOL and classroom.closest("00_start_here_alice") == START
    assert classroom.closest("homework") is None
    assert classroom.misnamed_reason("homework.ipynb").endswith("expected names like 00_start_here.ipynb")


def test_submitted_separates_the_gradable_from_the_misnamed(tmp_path):
    _touch(tmp_path, f"{START}.ipynb", MISNAMED, "notes.txt")
    if (NOTEBOOKS / "10_appendix_kernel_lab.ipynb").exists():  # a course notebook without exercises
        _touch(tmp_path, "10_appendix_kernel_lab.ipynb")
    gradable, wrong = classroom.submitted(tmp_path)
    assert [p.name for p in gradable] == [f"{START}.ipynb"]
    assert [(w.file, w.status, w.total, w.passed) for w in wrong] == [(MISNAMED, "misnamed", 0, 0)]


# --- the fixed denominator, the CSV and the feedback -------------------------------------------

def _alice() -> classroom.StudentReport:
    return classroom.StudentReport("alice", classroom.whole_course([_result(START)], [_misnamed()]))


def test_every_course_exercise_counts_and_a_missing_notebook_scores_zero():
    alice = _alice()
    assert alice.points == len(REGISTRY[START]) and alice.max_points == COURSE == classroom.course_points()
    by_file = {nb.file: nb for nb in alice.notebooks}
    assert list(by_file) == sorted(by_file)
    assert set(by_file) == {f"{stem}.ipynb" for stem in REGISTRY} | {MISNAMED}
    missing = [nb for nb in alice.notebooks if nb.status == "missing"]
    assert len(missing) == len(REGISTRY) - 1
    assert all(nb.passed == 0 and nb.reason.startswith("not submitted") for nb in missing)
    assert all(e.status == FAIL and e.message == nb.reason for nb in missing for e in nb.exercises)
    # the notebook the misnamed file looks like says so; the others do not
    assert f"{MISNAMED} was not graded" in by_file[f"{POOL}.ipynb"].reason
    assert by_file["01_gated_deltanet_recurrence.ipynb"].reason == "not submitted"
    # a notebook that got 0 counts its exercises, none of its passes
    zero = classroom.whole_course([_result(START, notebook_status="zero")], [])
    assert sum(nb.passed for nb in zero) == 0 and sum(nb.total for nb in zero) == COURSE


def test_csv_has_one_row_per_student_and_registered_exercise(tmp_path):
    bob = classroom.StudentReport("bob", classroom.whole_course([_result(START, NOT_DONE)], []))
    classroom.write_csv([_alice(), bob], tmp_path / "grades.csv")
    with open(tmp_path / "grades.csv", newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames) == classroom.CSV_COLUMNS == (
        "student", "notebook", "exercise", "title", "status", "points", "max_points", "message")
    assert len(rows) == 2 * COURSE
    for student, points in (("alice", len(REGISTRY[START])), ("bob", 0)):
        mine = [r for r in rows if r["student"] == student]
        assert {(r["notebook"], int(r["exercise"])) for r in mine} == {
            (f"{stem}.ipynb", n) for stem, exercises in REGISTRY.items() for n in exercises}
        assert sum(int(r["points"]) for r in mine) == points and all(r["max_points"] == "1" for r in mine)
    first = rows[0]
    assert (first["student"], first["notebook"], first["exercise"], first["status"], first["points"]) == (
        "alice", f"{START}.ipynb", "1", PASS, "1")
    assert first["title"] == REGISTRY[START][1].title
    bobs_pool = {r["message"] for r in rows if r["student"] == "bob" and r["notebook"] == f"{POOL}.ipynb"}
    assert bobs_pool == {"not submitted"}


def test_feedback_gives_the_score_each_exercise_and_what_was_not_graded(tmp_path):
    classroom.write_feedback([_alice()], tmp_path / "feedback")
    text = (tmp_path / "feedback" / "alice.md").read_text()
    n = len(REGISTRY[START])
    assert text.startswith(f"# alice: {n}/{COURSE} ({100 * n / COURSE:.0f} %)")
    assert f"## {START}.ipynb: {n}/{n}" in text
    assert f"- exercise 1 ({REGISTRY[START][1].title}): pass — pass message" in text
    assert f"## 01_gated_deltanet_recurrence.ipynb: 0/{len(REGISTRY['01_gated_deltanet_recurrence'])}, not submitted" in text
    assert f"## {MISNAMED}: not graded: name does not match a course notebook; did you mean {POOL}.ipynb?" in text


# --- the class folder ---------------------------------------------------------------------------

def test_what_is_a_class_folder_and_who_is_in_it(tmp_path):
    assert not classroom.is_class_folder(_touch(tmp_path / "empty"))
    assert not classroom.is_class_folder(_touch(tmp_path / "alice", f"{START}.ipynb"))
    assert not classroom.is_class_folder(tmp_path / "alice" / f"{START}.ipynb")
    cls = tmp_path / "class"
    _touch(cls / "bob", f"{START}.ipynb")
    _touch(cls / "alice")
    _touch(cls / ".git")
    _touch(cls, "grades.csv")
    (cls / "carol").symlink_to(tmp_path / "alice")
    assert classroom.is_class_folder(cls)
    folders, refused = classroom.students_in(cls)
    assert [f.name for f in folders] == ["alice", "bob"]
    assert [r.student for r in refused] == ["carol"] and "carol is a symbolic link" in refused[0].reason
    assert refused[0].points == 0 and refused[0].max_points == COURSE


def test_grade_class_scores_each_student_and_reports_progress(tmp_path, no_kernel):
    cls = tmp_path / "class"
    _touch(cls / "alice", f"{START}.ipynb", MISNAMED)
    _touch(cls / "bob")
    (cls / "carol").symlink_to(cls / "alice")
    lines = []
    reports = classroom.grade_class(cls, 60, jobs=2, progress=lines.append)
    assert [(r.student, r.points, r.max_points) for r in reports] == [
        ("alice", len(REGISTRY[START]), COURSE), ("bob", 0, COURSE), ("carol", 0, COURSE)]
    assert f"[alice] {START}.ipynb …" in lines
    assert f"[alice] {START}.ipynb: {len(REGISTRY[START])}/{len(REGISTRY[START])} (0 s)" in lines
    assert any(line.startswith(f"[alice] {MISNAMED}: not graded") for line in lines)
    assert any(line.startswith("[carol] refused: carol is a symbolic link") for line in lines)


def test_cli_refuses_a_class_without_students_and_bad_outputs(tmp_path, capsys):
    assert _cli_grade.main([str(_touch(tmp_path / "empty"))]) == 2
    assert "no notebook with registered exercises" in capsys.readouterr().err
    hidden_only = _touch(tmp_path / "hidden_only")
    _touch(hidden_only / ".git")
    assert _cli_grade.main([str(hidden_only)]) == 2
    assert "holds no student sub-folders (hidden ones are ignored)" in capsys.readouterr().err
    cls = tmp_path / "class"
    _touch(cls / "alice", f"{START}.ipynb")
    assert _cli_grade.main([str(cls), "--feedback", str(cls / "feedback")]) == 2
    assert "it would be taken for a student" in capsys.readouterr().err
    assert _cli_grade.main([str(cls), "--csv", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert _cli_grade.main([str(tmp_path / "alice.ipynb")]) == 2
    assert "did you mean" not in capsys.readouterr().err  # nothing there to suggest for
    _touch(tmp_path / "misnamed", MISNAMED)
    assert _cli_grade.main([str(tmp_path / "misnamed")]) == 2
    assert f"{MISNAMED}: not graded: name does not match a course notebook; did you mean" in capsys.readouterr().err


def test_cli_text_and_json_reports(tmp_path, capsys, no_kernel):
    cls = tmp_path / "class"
    _touch(cls / "alice", f"{START}.ipynb", MISNAMED)
    _touch(cls / "bob")
    assert _cli_grade.main([str(cls)]) == 1
    out = capsys.readouterr().out
    n = len(REGISTRY[START])
    assert out.splitlines() == [f"alice: {classroom.score(n, COURSE)}", f"bob: {classroom.score(0, COURSE)}"]
    # one folder: today's report and total (what was submitted), its misnamed notebook listed
    assert _cli_grade.main([str(cls / "alice")]) == 0
    captured = capsys.readouterr()
    assert f"  not graded: name does not match a course notebook; did you mean {POOL}.ipynb?" in captured.out
    assert captured.out.rstrip().endswith(f"score: {n}/{n} (100 %)")
    assert f"[alice] {START}.ipynb …" in captured.err
    assert _cli_grade.main([str(cls / "alice"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["student"] == "alice" and (report["passed"], report["total"]) == (n, n)
    assert [nb["file"] for nb in report["notebooks"]] == [f"{START}.ipynb", MISNAMED]


# --- the real thing: one class, two kernels ----------------------------------------------------

def _minimal(stem: str, target: Path, source: Path = SOLUTIONS) -> None:
    """A notebook of the cells of ``source``'s version that define the answers (quick to run):
    the solutions' answers, or the learner's stubs."""
    solution = nbformat.read(source / f"{stem}.ipynb", as_version=4)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import torch")] + [
        nbformat.v4.new_code_cell(c.source) for c in solution.cells
        if c.cell_type == "code" and "def my_" in c.source]
    nbformat.write(nb, target / f"{stem}.ipynb")


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """alice: a good minimal 00 and a misnamed copy of 05; bob: the learner's stubs of 00;
    carol: a symbolic link to alice's folder; .hidden: ignored. Graded once, two at a time."""
    if not SOLUTIONS.is_dir():
        pytest.skip("needs notebooks/solutions/ (the instructor's copy)")
    root = tmp_path_factory.mktemp("grade_class")
    cls = root / "submissions"
    (cls / "alice").mkdir(parents=True)
    _minimal(START, cls / "alice")
    shutil.copy(NOTEBOOKS / f"{POOL}.ipynb", cls / "alice" / MISNAMED)
    (cls / "bob").mkdir()
    _minimal(START, cls / "bob", NOTEBOOKS)
    (cls / "carol").symlink_to(cls / "alice")
    (cls / ".hidden").mkdir()
    cmd = [sys.executable, "-m", "mamba_edu", "grade", str(cls), "--jobs", "2", "--timeout", "120", "--json",
           "--csv", str(root / "grades.csv"), "--feedback", str(root / "feedback")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    with open(root / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return run, json.loads(run.stdout), rows, root / "feedback"


@pytest.mark.extra  # one real class grading: a worker and a kernel per notebook
def test_class_exit_status_and_students(graded_class):
    run, report, _, _ = graded_class
    assert run.returncode == 1, run.stderr[-3000:]
    assert [s["student"] for s in report["students"]] == ["alice", "bob", "carol"]
    assert all(s["max_points"] == COURSE for s in report["students"])
    alice, bob, carol = report["students"]
    assert alice["points"] == len(REGISTRY[START]) and bob["points"] == 0 and carol["points"] == 0
    assert (report["points"], report["max_points"]) == (len(REGISTRY[START]), 3 * COURSE)
    assert "carol is a symbolic link" in carol["reason"]


@pytest.mark.extra  # one real class grading: a worker and a kernel per notebook
def test_class_notebooks_graded_missing_and_misnamed(graded_class):
    _, report, _, _ = graded_class
    alice, bob, _ = ({nb["file"]: nb for nb in s["notebooks"]} for s in report["students"])
    assert alice[f"{START}.ipynb"]["status"] == "graded"
    assert {e["status"] for e in alice[f"{START}.ipynb"]["exercises"]} == {PASS}
    assert {e["status"] for e in bob[f"{START}.ipynb"]["exercises"]} == {NOT_DONE}
    assert alice[MISNAMED]["status"] == "misnamed" and alice[MISNAMED]["total"] == 0
    assert f"did you mean {POOL}.ipynb?" in alice[MISNAMED]["reason"]
    pool = alice[f"{POOL}.ipynb"]
    assert pool["status"] == "missing" and pool["reason"].startswith("not submitted")
    assert all(nb["reason"] == "not submitted" for file, nb in bob.items() if file != f"{START}.ipynb")


@pytest.mark.extra  # one real class grading: a worker and a kernel per notebook
def test_class_csv_and_feedback_files(graded_class):
    _, _, rows, feedback = graded_class
    assert list(rows[0]) == list(classroom.CSV_COLUMNS)
    assert len(rows) == 3 * COURSE
    assert {r["student"] for r in rows} == {"alice", "bob", "carol"}
    assert sum(int(r["points"]) for r in rows) == len(REGISTRY[START])
    n = len(REGISTRY[START])
    assert sorted(p.name for p in feedback.iterdir()) == ["alice.md", "bob.md", "carol.md"]
    assert (feedback / "alice.md").read_text().startswith(f"# alice: {classroom.score(n, COURSE)}")
    assert (feedback / "bob.md").read_text().startswith(f"# bob: {classroom.score(0, COURSE)}")


@pytest.mark.extra  # one real class grading: a worker and a kernel per notebook
def test_class_progress_names_student_and_notebook(graded_class):
    run, _, _, _ = graded_class
    for student in ("alice", "bob"):
        assert f"[{student}] {START}.ipynb …" in run.stderr
    n = len(REGISTRY[START])
    assert f"[alice] {START}.ipynb: {n}/{n} (" in run.stderr
    assert f"[bob] {START}.ipynb: 0/{n} (" in run.stderr
    assert "[carol] refused: carol is a symbolic link" in run.stderr
    assert f"[alice] {MISNAMED}: not graded" in run.stderr
    assert ".hidden" not in run.stderr
