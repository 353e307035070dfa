"""Grading a class (issue 37): one sub-folder per student, a fixed denominator over the whole
course (or an assignment), misnamed notebooks reported, layouts that read two ways refused, outputs
kept off the submissions, Ctrl-C, notebooks graded in parallel, the untouched handout not run.
(The grade book and the feedback files: tests/grading/test_grade_book.py.)

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

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
SOLUTIONS = NOTEBOOKS / "solutions"
START, POOL = "00_start_here", "05_state_pool_and_prefix_cache"
MISNAMED = f"{POOL} (1).ipynb"
COURSE = sum(ex.points for exercises in REGISTRY.values() for ex in exercises.values())
POINTS = {stem: sum(ex.points for ex in exercises.values()) for stem, exercises in REGISTRY.items()}


def _result(stem: str, status: str = PASS, notebook_status: str = "graded") -> NotebookResult:
    reason = "" if notebook_status == "graded" else "the kernel died"
    return NotebookResult(f"{stem}.ipynb", notebook_status, reason,
                          [ExerciseResult(n, ex.title, status, f"{status} message", points=ex.points)
                           for n, ex in sorted(REGISTRY[stem].items())])


def _fake_grade_paths(paths, timeout, sandbox=False, report=None, started=None, limits=None, seed=None, environment=None):
    """grade_paths without a kernel: every exercise of every notebook passes."""
    for path in paths:
        started(path)
    return [_result(path.stem) for path in paths]


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


# --- the fixed denominator -------------------------------------------------------------------

def _alice() -> classroom.StudentReport:
    return classroom.StudentReport("alice", classroom.whole_course([_result(START)], [_misnamed()]))


def test_every_course_exercise_counts_and_a_missing_notebook_scores_zero():
    alice = _alice()
    assert alice.points == POINTS[START] and alice.max_points == COURSE == classroom.course_points()
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
        ("alice", POINTS[START], COURSE), ("bob", 0, COURSE), ("carol", 0, COURSE)]
    assert f"[alice] {START}.ipynb …" in lines
    assert f"[alice] {START}.ipynb: {POINTS[START]}/{POINTS[START]} (0 s)" in lines
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
    assert f"lies in {cls.resolve()}, which is being graded" in capsys.readouterr().err
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
    assert _cli_grade.main([str(cls), "--seed", "7"]) == 1
    out = capsys.readouterr().out
    n = POINTS[START]
    assert out.splitlines() == [f"graded with {classroom.replay(classroom.provenance(7))}",
                                f"alice: {classroom.score(n, COURSE)}", f"bob: {classroom.score(0, COURSE)}"]
    # one folder: today's report and total (what was submitted), its misnamed notebook listed
    assert _cli_grade.main([str(cls / "alice")]) == 0
    captured = capsys.readouterr()
    assert f"  not graded: name does not match a course notebook; did you mean {POOL}.ipynb?" in captured.out
    assert captured.out.rstrip().endswith(f"score: {n}/{n} (100 %)")
    assert f"[alice] {START}.ipynb …" in captured.err
    assert _cli_grade.main([str(cls / "alice"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["student"] == "alice" and (report["points"], report["max_points"]) == (n, n)
    assert (report["passed"], report["total"]) == (len(REGISTRY[START]),) * 2
    assert report["seed"] >= 0 and report.keys() >= {"version", "commit"}
    assert [nb["file"] for nb in report["notebooks"]] == [f"{START}.ipynb", MISNAMED]


# --- what is refused before any grading ----------------------------------------------------------

def test_a_folder_that_reads_two_ways_is_refused_in_one_line(tmp_path, capsys, no_kernel):
    named = tmp_path / "named"  # bob's folder is called bob.ipynb: read as a student, alice was skipped
    _touch(named / "alice", f"{START}.ipynb")
    _touch(named / "bob.ipynb", f"{START}.ipynb")
    both = tmp_path / "both"  # notebooks beside a folder of notebooks: one student, or a class?
    _touch(both, f"{START}.ipynb")
    _touch(both / "bob", f"{START}.ipynb")
    for path, said in ((named, "reads two ways: bob.ipynb is a folder named like a notebook"),
                       (both, f"reads two ways: notebooks ({START}.ipynb) beside folders of notebooks (bob)")):
        assert _cli_grade.main([str(path)]) == 2
        captured = capsys.readouterr()
        assert said in captured.err and len(captured.err.splitlines()) == 1 and captured.out == ""
    # what reads one way: a student's folder with a data folder and a folder named like a notebook
    # (the grader refuses that one by name), a class with its students' checkpoints hidden
    student = _touch(tmp_path / "student", f"{START}.ipynb")
    _touch(student / "data")
    _touch(student / "01_gated_deltanet_recurrence.ipynb")
    assert not classroom.is_class_folder(student)
    _touch(named / "bob.ipynb" / ".ipynb_checkpoints", f"{START}-checkpoint.ipynb")
    (named / "bob.ipynb").rename(named / "bob")
    assert classroom.is_class_folder(named)


def test_outputs_never_land_on_a_submission(tmp_path, capsys, no_kernel):
    cls = tmp_path / "class"
    _touch(cls / "alice", f"{START}.ipynb")
    _touch(cls / "bob", f"{START}.ipynb")
    mine, bobs = cls / "alice" / f"{START}.ipynb", cls / "bob" / f"{START}.ipynb"
    (tmp_path / "link.csv").symlink_to(bobs)
    probes = [([str(cls), "--csv", str(bobs)], "is a notebook"),          # a submission
              ([str(mine), "--csv", str(mine)], "is a notebook"),         # the notebook being graded
              ([str(mine), "--feedback", str(mine)], "exists and is not a folder"),
              ([str(cls), "--csv", str(tmp_path / "link.csv")], "is a notebook"),  # a link to one
              ([str(cls), "--csv", str(cls / "grades.csv")], "which is being graded"),
              ([str(cls / "alice"), "--csv", str(cls / "alice" / "grades.csv")], "which is being graded"),
              ([str(cls / "alice"), "--feedback", str(cls / "alice")], "which is being graded")]
    for argv, said in probes:
        assert _cli_grade.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert said in err and len(err.splitlines()) == 1, err  # one line, and no grading began
    assert mine.read_text() == bobs.read_text() == "{}" and sorted(p.name for p in cls.rglob("*")) == [
        f"{START}.ipynb", f"{START}.ipynb", "alice", "bob"]
    assert _cli_grade.main([str(cls), "--csv", str(tmp_path / "grades.csv")]) == 1  # beside the class: fine
    assert (tmp_path / "grades.csv").is_file()


# --- how a run grades ---------------------------------------------------------------------------

def test_ctrl_c_writes_the_students_finished_before_it(tmp_path, capsys, monkeypatch):
    def grade_paths(paths, *args, **kwargs):
        if "bob" in paths[0].parts:
            raise KeyboardInterrupt  # as Ctrl-C reaches the grader while bob's notebook runs
        return _fake_grade_paths(paths, *args, **kwargs)

    monkeypatch.setattr(classroom, "grade_paths", grade_paths)
    cls = tmp_path / "class"
    for student in ("alice", "bob"):
        _touch(cls / student, f"{START}.ipynb")
    argv = [str(cls), "--json", "--csv", str(tmp_path / "grades.csv"), "--feedback", str(tmp_path / "feedback")]
    assert _cli_grade.main(argv) == 130
    captured = capsys.readouterr()
    assert "interrupted; not finished, so left out of every output: bob" in captured.err
    report = json.loads(captured.out)
    assert [s["student"] for s in report["students"]] == ["alice"] and report["interrupted"] == ["bob"]
    with open(tmp_path / "grades.csv", newline="") as f:
        assert [(r["student"], int(r["total"])) for r in csv.DictReader(f)] == [("alice", POINTS[START])]
    assert [p.name for p in (tmp_path / "feedback").iterdir()] == ["alice.md"]


def test_ctrl_c_with_students_still_waiting_ends_and_writes_the_finished(tmp_path, capsys, monkeypatch):
    """One judge at a time: when Ctrl-C comes during bob's notebook, carol's runs and dave's is
    still queued. A cancelled job is never "done", so waiting for every job hung the grader with
    nothing written."""
    import threading
    import time

    def grade_paths(paths, *args, **kwargs):
        if "bob" in paths[0].parts:
            raise KeyboardInterrupt
        if "carol" in paths[0].parts:
            time.sleep(1)  # running when the interrupt is seen, so dave's job waits in the queue
        return _fake_grade_paths(paths, *args, **kwargs)

    monkeypatch.setattr(classroom, "grade_paths", grade_paths)
    cls = tmp_path / "class"
    for student in ("alice", "bob", "carol", "dave"):
        _touch(cls / student, f"{START}.ipynb")
    argv = [str(cls), "--json", "--jobs", "1", "--csv", str(tmp_path / "grades.csv")]
    status = []
    worker = threading.Thread(target=lambda: status.append(_cli_grade.main(argv)), daemon=True)
    worker.start()
    worker.join(20)
    assert status == [130], "the grader did not end after Ctrl-C"
    report = json.loads(capsys.readouterr().out)
    assert [s["student"] for s in report["students"]] == ["alice"] and report["interrupted"] == ["bob", "carol", "dave"]
    assert (tmp_path / "grades.csv").is_file()


def test_students_shown_by_one_name_and_broken_links_are_refused(tmp_path, capsys, no_kernel):
    cls = tmp_path / "class"
    long = "Jean-Baptiste Emmanuel Zorg_1234567_assignsubmission_file_extra_long_name"
    _touch(cls / long, f"{START}.ipynb")
    _touch(cls / classroom.student_name(long), f"{START}.ipynb")  # a folder named as the first is shown
    assert _cli_grade.main([str(cls)]) == 2
    err = capsys.readouterr().err
    assert "two student folders are shown as" in err and len(err.splitlines()) == 1, err
    other = tmp_path / "other"
    _touch(other / "alice", f"{START}.ipynb")
    (other / "gone").symlink_to(tmp_path / "nowhere")  # a link to nothing is a student refused, not dropped
    folders, refused = classroom.students_in(other)
    assert [f.name for f in folders] == ["alice"] and [r.student for r in refused] == ["gone"]
    assert "symbolic link" in refused[0].reason


def test_csv_names_stay_distinct_and_layout_refusals_are_one_line(tmp_path, capsys, no_kernel):
    assert classroom.cell("=x") != classroom.cell("'=x") and classroom.cell("'=x").startswith("''")
    odd = tmp_path / "odd"
    _touch(odd / "bob", f"{START}.ipynb")
    _touch(odd / "evil\nline.ipynb", f"{START}.ipynb")  # a folder named like a notebook, with a newline
    assert _cli_grade.main([str(odd)]) == 2
    err = capsys.readouterr().err
    assert "reads two ways" in err and len(err.splitlines()) == 1, err


def test_jobs_run_notebooks_not_students_at_a_time_in_a_stable_order(tmp_path, monkeypatch):
    """Four judges at a time over two students of two notebooks each: all four run together (one
    student's notebooks one after the other would never meet at the barrier)."""
    import threading

    barrier, seeds = threading.Barrier(4, timeout=20), []

    def grade_paths(paths, timeout, sandbox=False, started=None, limits=None, seed=None, environment=None):
        barrier.wait()
        seeds.append(seed)
        return _fake_grade_paths(paths, timeout, started=started)

    monkeypatch.setattr(classroom, "grade_paths", grade_paths)
    cls = tmp_path / "class"
    for student in ("bob", "alice"):
        _touch(cls / student, f"{POOL}.ipynb", f"{START}.ipynb")
    reports = classroom.grade_class(cls, 60, jobs=4, seed=11)
    assert [r.student for r in reports] == ["alice", "bob"] and seeds == [11] * 4
    graded = [[nb.file for nb in r.notebooks if nb.status == "graded"] for r in reports]
    assert graded == [[f"{START}.ipynb", f"{POOL}.ipynb"]] * 2


def test_one_seed_per_run_passed_to_every_judge_and_recorded(tmp_path, capsys, monkeypatch):
    from mamba_edu.exercises.core import SEED_VARIABLE

    seeds = []
    monkeypatch.setattr(classroom, "grade_paths", lambda paths, *a, seed=None, **k: seeds.append(seed) or
                        _fake_grade_paths(paths, *a, **k))
    monkeypatch.setenv(SEED_VARIABLE, "5")  # no longer how a run is seeded
    cls = tmp_path / "class"
    for student in ("alice", "bob"):
        _touch(cls / student, f"{START}.ipynb", f"{POOL}.ipynb")
    _cli_grade.main([str(cls), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert len(seeds) == 4 and set(seeds) == {report["seed"]}
    seeds.clear()
    _cli_grade.main([str(cls), "--json", "--seed", "42"])
    assert seeds == [42] * 4 and json.loads(capsys.readouterr().out)["seed"] == 42


def test_an_assignment_is_graded_and_scored_alone(tmp_path, capsys, no_kernel):
    assert classroom.assignment("05,07_precomputed_indices") == [POOL, "07_precomputed_indices"]
    cls = tmp_path / "class"
    _touch(cls / "alice", f"{START}.ipynb", f"{POOL}.ipynb")
    _touch(cls / "bob")
    for argv, stems in ((["--assignment", "05"], [POOL]), (["--assignment", "00,05"], [START, POOL]),
                        (["--assignment", "00", "--assignment", f"{POOL}.ipynb"], [START, POOL])):
        assert _cli_grade.main([str(cls), "--json", *argv]) == 1
        report = json.loads(capsys.readouterr().out)
        assert [s["max_points"] for s in report["students"]] == [sum(POINTS[s] for s in stems)] * 2
        assert [nb["file"] for nb in report["students"][1]["notebooks"]] == [f"{s}.ipynb" for s in stems]
    for wrong in ("13", "10", "5", "05,", "pool"):  # unknown, an appendix, one digit, empty, a word
        with pytest.raises(SystemExit) as exit_:
            _cli_grade.main([str(cls), "--assignment", wrong])
        assert exit_.value.code == 2
        said = capsys.readouterr().err.splitlines()[-1]
        assert said.startswith("mamba-edu grade: error: argument --assignment: no notebook with exercises")
        assert said.endswith(f"choose among {', '.join(sorted(s[:2] for s in REGISTRY))} (or their full names)")
    # one student's folder that holds other notebooks than the assignment's: said so, in one line
    assert _cli_grade.main([str(cls / "alice"), "--assignment", "07"]) == 2
    err = capsys.readouterr().err
    assert "no notebook of the assignment (07_precomputed_indices)" in err and f"it holds {START}.ipynb" in err
    assert len(err.splitlines()) == 1, err


def test_the_untouched_handout_is_not_done_without_a_judge(tmp_path, monkeypatch):
    import time

    def no_judge(*args, **kwargs):
        raise AssertionError("a judge was started for the untouched handout")

    monkeypatch.setattr(classroom, "grade_paths", no_judge)
    folder = tmp_path / "alice"
    folder.mkdir()
    shutil.copy(NOTEBOOKS / f"{POOL}.ipynb", folder)
    start = time.perf_counter()
    [alice] = classroom.grade_students([("alice", folder)], classroom.Run(60), fixed_denominator=False)
    assert time.perf_counter() - start < 1
    [nb] = alice.notebooks
    assert nb.status == "graded" and alice.points == 0 and alice.max_points == POINTS[POOL]
    assert {(e.status, e.message) for e in nb.exercises} == {(NOT_DONE, "the handout, unchanged")}
    # one code cell changed, or no handout to compare with: the notebook is run
    monkeypatch.setattr(classroom, "grade_paths", _fake_grade_paths)
    edited = nbformat.read(folder / f"{POOL}.ipynb", as_version=4)
    next(c for c in edited.cells if c.cell_type == "code").source += "\n# mine"
    nbformat.write(edited, tmp_path / f"{POOL}.ipynb")
    for path, repo in ((tmp_path / f"{POOL}.ipynb", classroom.REPO_DIR), (folder / f"{POOL}.ipynb", tmp_path)):
        monkeypatch.setattr(classroom, "REPO_DIR", repo)
        [report] = classroom.grade_students([("alice", path)], classroom.Run(60), fixed_denominator=False)
        assert report.points == POINTS[POOL]


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
    assert alice["points"] == POINTS[START] and bob["points"] == 0 and carol["points"] == 0
    assert (report["points"], report["max_points"]) == (POINTS[START], 3 * COURSE)
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
    _, report, rows, feedback = graded_class
    assert list(rows[0])[:3] == ["student", "00.1", "00.2"] and list(rows[0])[-6:] == [
        "total", "max_points", "needs_review", "seed", "version", "commit"]
    assert [r["student"] for r in rows] == ["alice", "bob", "carol"]
    assert [int(r["total"]) for r in rows] == [POINTS[START], 0, 0] and {r["max_points"] for r in rows} == {str(COURSE)}
    assert {r["seed"] for r in rows} == {str(report["seed"])}
    n = POINTS[START]
    assert sorted(p.name for p in feedback.iterdir()) == ["alice.md", "bob.md", "carol.md"]
    assert (feedback / "alice.md").read_text().startswith(f"# alice: {classroom.score(n, COURSE)}")
    assert (feedback / "bob.md").read_text().startswith(f"# bob: {classroom.score(0, COURSE)}")
    assert f"Graded with seed {report['seed']}, mamba_edu " in (feedback / "bob.md").read_text()


@pytest.mark.extra  # one real class grading: a worker and a kernel per notebook
def test_class_progress_names_student_and_notebook(graded_class):
    run, _, _, _ = graded_class
    for student in ("alice", "bob"):
        assert f"[{student}] {START}.ipynb …" in run.stderr
    n = POINTS[START]
    assert f"[alice] {START}.ipynb: {n}/{n} (" in run.stderr
    assert f"[bob] {START}.ipynb: 0/{n} (" in run.stderr
    assert "[carol] refused: carol is a symbolic link" in run.stderr
    assert f"[alice] {MISNAMED}: not graded" in run.stderr
    assert ".hidden" not in run.stderr


@pytest.mark.extra  # one real notebook graded: a judge and a kernel
@pytest.mark.solutions
def test_a_perfect_notebook_of_the_assignment_scores_full_marks(tmp_path):
    cls = tmp_path / "class"
    (cls / "alice").mkdir(parents=True)
    shutil.copy(SOLUTIONS / f"{POOL}.ipynb", cls / "alice")
    _minimal(START, cls / "alice")  # not in the assignment: not run, not counted
    run = subprocess.run([sys.executable, "-m", "mamba_edu", "grade", str(cls), "--assignment", "05", "--json",
                          "--timeout", "300"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    [alice] = json.loads(run.stdout)["students"]
    assert (alice["points"], alice["max_points"]) == (POINTS[POOL], POINTS[POOL])
    assert [nb["file"] for nb in alice["notebooks"]] == [f"{POOL}.ipynb"] and START not in run.stderr
