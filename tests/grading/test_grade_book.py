"""What grading writes out (issue 37 and the trustworthy-grading issue): the CSV grade book (one
row per student, or per exercise), the feedback files and the terminal lines, every name and
message in them escaped, each naming the seed, version and commit that replay the run; and the
course's counts in docs/teaching.md, checked against the registry."""

import csv
import re
from pathlib import Path

import pytest

pytest.importorskip("nbformat")  # as tests/grading/test_grade_class.py, whose helpers this file uses

from mamba_edu.grading import classroom
from mamba_edu.grading import cli as _cli_grade
from mamba_edu.exercises.core import FAIL, NOT_DONE, PASS, REGISTRY, ExerciseResult, NotebookResult
from test_grade_class import COURSE, MISNAMED, POINTS, POOL, START, _alice, _fake_grade_paths, _result, _touch

ROOT = Path(__file__).resolve().parents[2]
META = {"seed": 7, "version": "0.1.0", "commit": "0123abc"}
FORGED = "wrong\nscore: 4/4 (100 %)"
HOSTILE_NAMES = ('=HYPERLINK("http://x")', "+1", "@SUM(1)", "-2")


def _read(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


# --- escaping ---------------------------------------------------------------------------------

def test_a_cell_a_spreadsheet_would_run_is_quoted():
    for name in HOSTILE_NAMES + ("\t=1+1", "\r=1+1", " =1"):
        assert classroom.cell(name).startswith("'"), name
    assert [classroom.cell(v) for v in ("alice", "0.5 s", 3, "a=b")] == ["alice", "0.5 s", 3, "a=b"]


def test_no_message_writes_a_line_of_its_own():
    assert classroom.printable(FORGED) == "wrong␤score: 4/4 (100 %)"
    for text in ("a\r\nb", "a\rb", "a\x0bb", "a\u2028b", "a\x85b"):
        assert classroom.printable(text) == "a␤b", repr(text)
    assert classroom.printable("a\x1b[2Jb\x00c\udcff") == "a�[2Jb�c�"  # an escape sequence, a NUL, a byte
    assert classroom.printable("naïve — ok") == "naïve — ok"


def test_a_student_name_is_printable_short_and_unique():
    assert classroom.student_name("alice") == "alice" and classroom.student_name("=SUM(1)") == "=SUM(1)"
    long_a, long_b = "a" * 253, "a" * 252 + "b"
    shown = {classroom.student_name(n) for n in (long_a, long_b, "x\ny", "x\u2028y", "é" * 40, "\udcff")}
    assert len(shown) == 6 and all(len(n.encode()) <= classroom.NAME_BYTES for n in shown)
    assert classroom.student_name(long_a).startswith("a" * 50) and "\n" not in classroom.student_name("x\ny")


def _hostile_reports() -> list[classroom.StudentReport]:
    """A student per hostile name, each with a message that forges a score line, tidied as the
    grader tidies what it reports; and a 253-character folder name."""
    reports = []
    for folder in HOSTILE_NAMES + ("b" * 253, "eve\nscore: 4/4"):
        nb = classroom.tidy(NotebookResult(f"{START}.ipynb", "graded", exercises=[
            ExerciseResult(n, ex.title, FAIL, FORGED, review=FORGED) for n, ex in sorted(REGISTRY[START].items())]))
        reports.append(classroom.StudentReport(classroom.student_name(folder), [nb]))
    return reports


def test_hostile_names_and_messages_reach_the_csv_escaped(tmp_path):
    for form in ("wide", "long"):
        classroom.write_csv(_hostile_reports(), tmp_path / f"{form}.csv", META, form)
        text = (tmp_path / f"{form}.csv").read_text(encoding="utf-8")
        rows = _read(tmp_path / f"{form}.csv")
        quoted = {r["student"] for r in rows if r["student"].startswith("'")}
        assert {"'+1", "'-2", "'@SUM(1)"} < quoted and any(q.startswith("'=HYPERLINK(") for q in quoted)
        assert not any(line.startswith("score") for line in text.splitlines())
        assert len(text.splitlines()) == 1 + len(rows)  # no cell spans two lines
    assert {r["message"] for r in rows} == {"wrong␤score: 4/4 (100 %)"}


def test_hostile_names_and_messages_reach_feedback_and_terminal_escaped(tmp_path, capsys, monkeypatch):
    classroom.write_feedback(_hostile_reports(), tmp_path / "feedback", META)
    files = sorted(p.name for p in (tmp_path / "feedback").iterdir())
    assert len(files) == len(HOSTILE_NAMES) + 2 and all(len(f.encode()) <= 255 for f in files)
    for path in (tmp_path / "feedback").iterdir():
        lines = path.read_text(encoding="utf-8").splitlines()
        assert not any(line.startswith("score") for line in lines) and lines[0].startswith("# ")
    # through the command: a message that forges a score line, a student folder named like one
    monkeypatch.setattr(classroom, "grade_paths", lambda paths, *a, **k: [
        NotebookResult(p.name, "zero", FORGED, classroom.every_exercise(p.stem, FAIL, FORGED)) for p in paths])
    folder = _touch(tmp_path / "alice\nscore: 36", f"{START}.ipynb")
    assert _cli_grade.main([str(folder)]) == 1
    captured = capsys.readouterr()
    assert [line for line in captured.out.splitlines() if line.startswith("score")] == [
        f"score: 0/{POINTS[START]} (0 %)"]
    assert not any(line.startswith("score") for line in captured.err.splitlines())
    assert "[alice␤score: 36…" in captured.err


# --- the grade book ---------------------------------------------------------------------------

def _class() -> list[classroom.StudentReport]:
    """alice: 00 passed, a misnamed 05; bob: 00 not done, 06·1 flagged for review."""
    review = _result("06_naive_tracking", FAIL)
    review.exercises[0].review = "the answer reads the checks' frames"
    bob = classroom.StudentReport("bob", classroom.whole_course([_result(START, NOT_DONE), review], []))
    return [_alice(), bob]


def test_the_wide_csv_has_a_row_per_student_and_a_column_per_exercise(tmp_path):
    classroom.write_csv(_class(), tmp_path / "grades.csv", META)
    alice, bob = _read(tmp_path / "grades.csv")
    columns = [f"{stem[:2]}.{n}" for stem in sorted(REGISTRY) for n in sorted(REGISTRY[stem])]
    assert list(alice) == ["student", *columns, "total", "max_points", "needs_review", "seed", "version", "commit"]
    assert [alice[f"00.{n}"] for n in sorted(REGISTRY[START])] == [str(ex.points) for _, ex in
                                                                 sorted(REGISTRY[START].items())]
    assert {bob[c] for c in columns} == {"0"} and {alice[c] for c in columns if not c.startswith("00.")} == {"0"}
    assert (alice["total"], alice["max_points"], bob["total"]) == (str(POINTS[START]), str(COURSE), "0")
    assert (alice["needs_review"], bob["needs_review"]) == ("", "06.1")
    assert (bob["seed"], bob["version"], bob["commit"]) == ("7", "0.1.0", "0123abc")


def test_the_long_csv_has_a_row_per_student_and_exercise(tmp_path):
    classroom.write_csv(_class(), tmp_path / "grades.csv", META, "long")
    rows = _read(tmp_path / "grades.csv")
    assert list(rows[0]) == ["student", "notebook", "exercise", "title", "status", "points", "max_points",
                             "message", "review", "seed", "version", "commit"]
    assert len(rows) == 2 * len([n for exercises in REGISTRY.values() for n in exercises])
    for student, points in (("alice", POINTS[START]), ("bob", 0)):
        mine = [r for r in rows if r["student"] == student]
        assert {(r["notebook"], int(r["exercise"])) for r in mine} == {
            (f"{stem}.ipynb", n) for stem, exercises in REGISTRY.items() for n in exercises}
        assert sum(int(r["points"]) for r in mine) == points and sum(int(r["max_points"]) for r in mine) == COURSE
    first = rows[0]
    assert (first["student"], first["notebook"], first["exercise"], first["status"], first["points"]) == (
        "alice", f"{START}.ipynb", "1", PASS, str(REGISTRY[START][1].points))
    assert first["title"] == REGISTRY[START][1].title
    assert {r["message"] for r in rows if r["student"] == "bob" and r["notebook"] == f"{POOL}.ipynb"} == {
        "not submitted"}
    assert [r["review"] for r in rows if r["review"]] == ["the answer reads the checks' frames"]


def test_points_come_from_the_registry(monkeypatch):
    """An exercise worth 3 counts 3 in every total; a pass in a notebook that got 0 counts none."""
    first = REGISTRY[START][1]
    monkeypatch.setitem(REGISTRY[START], 1, type(first)(**{**first.__dict__, "points": 3}))
    graded = classroom.tidy(_result(START))
    assert classroom.earned(graded) == classroom.worth(graded) == POINTS[START] + 2
    assert classroom.course_points() == COURSE + 2 and classroom.course_points([START]) == POINTS[START] + 2
    zero = classroom.tidy(_result(START, notebook_status="zero"))
    assert classroom.earned(zero) == 0 and classroom.worth(zero) == POINTS[START] + 2
    missing = classroom.whole_course([], [], stems=[START])
    assert [classroom.worth(nb) for nb in missing] == [POINTS[START] + 2]


def test_feedback_gives_the_score_the_run_and_each_exercise(tmp_path):
    classroom.write_feedback([_alice()], tmp_path / "feedback", META)
    text = (tmp_path / "feedback" / "alice.md").read_text()
    n = POINTS[START]
    assert text.startswith(f"# alice: {n}/{COURSE} ({100 * n / COURSE:.0f} %)\n\n"
                           "Graded with seed 7, mamba_edu 0.1.0, commit 0123abc.\n")
    assert f"## {START}.ipynb: {n}/{n}" in text
    assert f"- exercise 1 ({REGISTRY[START][1].title}): pass — pass message" in text
    assert f"## 01_gated_deltanet_recurrence.ipynb: 0/{POINTS['01_gated_deltanet_recurrence']}, not submitted" in text
    assert f"## {MISNAMED}: not graded: name does not match a course notebook; did you mean {POOL}.ipynb?" in text


# --- replaying a run --------------------------------------------------------------------------

def test_the_provenance_names_seed_version_and_commit(monkeypatch):
    import subprocess

    import mamba_edu

    meta = classroom.provenance(5)
    assert meta["seed"] == 5 and meta["version"] == mamba_edu.__version__
    assert meta["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}", meta["commit"])
    for trouble in (FileNotFoundError("git"), subprocess.TimeoutExpired("git", 10),
                    subprocess.CalledProcessError(128, "git")):  # no git, a hung git, not a checkout
        def run(*args, trouble=trouble, **kwargs):
            raise trouble
        monkeypatch.setattr(subprocess, "run", run)
        classroom.commit.cache_clear()
        assert classroom.commit() == "unknown"
    # a checkout above the package (an installed copy inside someone's repository) is not its own
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "/elsewhere\n" + "f" * 40))
    classroom.commit.cache_clear()
    assert classroom.commit() == "unknown"
    classroom.commit.cache_clear()


def test_the_cli_records_the_run_in_every_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(classroom, "grade_paths", _fake_grade_paths)
    folder = _touch(tmp_path / "alice", f"{START}.ipynb")
    out = tmp_path / "out"
    assert _cli_grade.main([str(folder), "--seed", "9", "--csv", str(tmp_path / "g.csv"), "--feedback", str(out)]) == 0
    said = f"graded with {classroom.replay(classroom.provenance(9))}"
    assert capsys.readouterr().out.splitlines()[0] == said
    assert said.replace("graded", "Graded") in (out / "alice.md").read_text()
    assert _read(tmp_path / "g.csv")[0]["seed"] == "9"


# --- the docs' counts -------------------------------------------------------------------------

def test_the_teaching_docs_count_the_registry():
    """docs/teaching.md's counts of exercises and points are the registry's."""
    text = (ROOT / "docs" / "teaching.md").read_text()
    exercises = sum(len(e) for e in REGISTRY.values())
    assert re.findall(r"\((\d+) points today\)", text) == [str(classroom.course_points())]
    assert re.findall(r"(\d+) exercises in \w+ notebooks", text) == [str(exercises)]
    assert re.findall(r'"max_points": (\d+), "reason"', text) == [str(classroom.course_points())] * 2
