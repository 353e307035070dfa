"""Grading a class: one sub-folder per student, every student scored over the whole course.

The conventions instructors know from nbgrader and otter-grader:

- ``submissions/<student id>/NN_name.ipynb``: a folder with no notebook directly inside but
  sub-folders is a class folder, and each of its sub-folders is a student, named by its folder
  (hidden folders are ignored, a symbolic link is refused);
- a fixed denominator: every registered exercise of the course is one point for every student,
  and a notebook that was not submitted counts 0, "not submitted";
- a notebook whose name is not one of the course's is not graded (an instructor decides what it
  was meant to be) and is reported with the closest course name;
- one CSV row per (student, exercise) for the grade book, one feedback file per student.

Each notebook is still graded by :func:`~mamba_edu.grading.grader.grade_paths`, in its own
judge process; ``jobs`` students are graded at a time, each in a thread of this process.
"""

from __future__ import annotations

import csv
import difflib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from mamba_edu.exercises import core
from mamba_edu.grading.containment import JudgeLimits
from mamba_edu.exercises.core import ExerciseResult, NotebookResult
from mamba_edu.grading.grader import REPO_DIR, grade_paths

CSV_COLUMNS = ("student", "notebook", "exercise", "title", "status", "points", "max_points", "message")


class NothingToGrade(ValueError):
    """The path holds nothing to grade: no notebook of the course, no student folder."""


def _silent(line: str) -> None:
    """The default progress: say nothing."""


# --- the course's names and points ------------------------------------------------------------

def course_notebooks() -> list[str]:
    """The stems of the course's notebooks: those with exercises, and the repository's others
    (the appendices: they have none and are never graded, nor reported as misnamed)."""
    return sorted(set(core.REGISTRY) | {p.stem for p in (REPO_DIR / "notebooks").glob("*.ipynb")})


def course_points() -> int:
    """The fixed denominator: one point per registered exercise of the whole course."""
    return sum(len(exercises) for exercises in core.REGISTRY.values())


def closest(stem: str) -> str | None:
    """The course notebook ``stem`` most likely meant, or None when none is close."""
    match = difflib.get_close_matches(stem, course_notebooks(), n=1)
    return match[0] if match else None


def misnamed_reason(name: str) -> str:
    """Why the notebook file ``name`` is not graded, with the closest course name."""
    guess = closest(Path(name).stem)
    hint = f"did you mean {guess}.ipynb?" if guess else f"expected names like {course_notebooks()[0]}.ipynb"
    return f"not graded: name does not match a course notebook; {hint}"


def score(points: int, max_points: int) -> str:
    """``2/28 (7 %)``."""
    return f"{points}/{max_points} ({100 * points / max_points if max_points else 0:.0f} %)"


def notebooks_in(path: Path) -> list[Path]:
    """``path`` itself if it names a notebook, else the entries directly inside it whose names end
    in ``.ipynb`` (files or not), sorted."""
    if path.suffix == ".ipynb" and (path.is_symlink() or not path.is_dir()):
        return [path]
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.name.endswith(".ipynb"))
    return []


# --- one student ------------------------------------------------------------------------------

@dataclass
class StudentReport:
    """One student's grade: ``notebooks`` holds every notebook reported (graded, zero, refused,
    missing, misnamed); ``reason`` says why the whole folder was refused, if it was."""

    student: str
    notebooks: list[NotebookResult]
    reason: str = ""

    @property
    def points(self) -> int:
        return sum(nb.passed for nb in self.notebooks)

    @property
    def max_points(self) -> int:
        return sum(nb.total for nb in self.notebooks)

    def as_dict(self) -> dict:
        return {"student": self.student, "points": self.points, "max_points": self.max_points,
                "reason": self.reason, "notebooks": [notebook_dict(nb) for nb in self.notebooks]}


def notebook_dict(nb: NotebookResult) -> dict:
    """One notebook of the JSON report: its fields, with ``passed`` and ``total``."""
    return {**asdict(nb), "passed": nb.passed, "total": nb.total}


def submitted(path: Path) -> tuple[list[Path], list[NotebookResult]]:
    """At ``path`` (a folder or one notebook): the notebooks to grade, and a ``misnamed`` result
    for each one whose name is not a course notebook's."""
    found = notebooks_in(path)
    course = course_notebooks()
    wrong = [NotebookResult(p.name, "misnamed", misnamed_reason(p.name)) for p in found if p.stem not in course]
    return [p for p in found if p.stem in core.REGISTRY], wrong


def not_submitted(stem: str, why: str) -> NotebookResult:
    """Notebook ``stem`` missing: each of its exercises fails with ``why``."""
    registered = core.REGISTRY[stem]
    return NotebookResult(f"{stem}.ipynb", "missing", why,
                          [ExerciseResult(n, registered[n].title, core.FAIL, why) for n in sorted(registered)])


def whole_course(results: list[NotebookResult], wrong: list[NotebookResult],
                 why: str = "not submitted") -> list[NotebookResult]:
    """``results`` and ``wrong``, with every course notebook not among the results added as
    missing (naming the misnamed files that look like it), sorted by file: the fixed
    denominator."""
    graded = {Path(r.file).stem for r in results}
    missing = []
    for stem in sorted(set(core.REGISTRY) - graded):
        lookalikes = [w.file for w in wrong if closest(Path(w.file).stem) == stem]
        note = f" ({', '.join(lookalikes)} was not graded: its name is not this one)" if lookalikes else ""
        missing.append(not_submitted(stem, why + note))
    return sorted(results + wrong + missing, key=lambda r: r.file)


def _summary(result: NotebookResult) -> str:
    if result.status == "graded":
        return f"{result.passed}/{result.total} ({result.seconds:.0f} s)"
    return f"0/{result.total}, {result.status}: {result.reason}"


def grade_student(student: str, path: Path, timeout: int, sandbox: bool = False, progress=_silent,
                  fixed_denominator: bool = True, limits: JudgeLimits | None = None) -> StudentReport:
    """Grade the notebooks at ``path`` (a folder or one notebook) as ``student``'s, calling
    ``progress(line)`` as each notebook starts and ends. ``fixed_denominator``: every course
    notebook is reported, those not submitted as missing; else only what was submitted.
    ``limits``: each judge's (None: :class:`JudgeLimits`' defaults)."""
    gradable, wrong = submitted(path)
    for result in wrong:
        progress(f"[{student}] {result.file}: {result.reason}")
    results = grade_paths(gradable, timeout, sandbox,
                          started=lambda p: progress(f"[{student}] {p.name} …"),
                          report=lambda r: progress(f"[{student}] {r.file}: {_summary(r)}"),
                          **({"limits": limits} if limits else {}))
    if fixed_denominator:
        return StudentReport(student, whole_course(results, wrong))
    return StudentReport(student, sorted(results + wrong, key=lambda r: r.file))


# --- a class ----------------------------------------------------------------------------------

def is_class_folder(path: Path) -> bool:
    """A folder with no notebook directly inside, but sub-folders: one per student."""
    return path.is_dir() and not notebooks_in(path) and any(p.is_dir() for p in path.iterdir())


def students_in(class_dir: Path) -> tuple[list[Path], list[StudentReport]]:
    """The student folders of ``class_dir`` (its sub-folders not hidden, sorted), and a refused
    report (0 points of the course's) for each one that is a symbolic link."""
    folders, refused = [], []
    for entry in sorted(class_dir.iterdir()):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        if entry.is_symlink():
            why = f"{entry.name} is a symbolic link (copy the student's folder itself)"
            refused.append(StudentReport(entry.name, whole_course([], [], "not graded: " + why), why))
        else:
            folders.append(entry)
    return folders, refused


def grade_class(class_dir: Path, timeout: int, sandbox: bool = False, jobs: int = 1,
                progress=_silent, limits: JudgeLimits | None = None) -> list[StudentReport]:
    """Grade every student of ``class_dir``, ``jobs`` at a time, sorted by student id, each judge
    under ``limits`` (None: the defaults). Raises :class:`NothingToGrade` when it holds no
    student folder."""
    if type(jobs) is not int or jobs < 1:
        raise ValueError(f"jobs (students graded at a time) must be a whole number of at least 1, got {jobs!r}")
    if not class_dir.is_dir():
        raise NothingToGrade(f"{class_dir}: no such folder (expected a class folder, one sub-folder per student)")
    folders, refused = students_in(class_dir)
    if not folders and not refused:
        raise NothingToGrade(f"{class_dir} holds no student sub-folders (hidden ones are ignored): "
                             "expected one sub-folder of notebooks per student")
    for report in refused:
        progress(f"[{report.student}] refused: {report.reason}")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        graded = list(pool.map(lambda f: grade_student(f.name, f, timeout, sandbox, progress, limits=limits),
                               folders))
    return sorted(graded + refused, key=lambda r: r.student)


# --- what is written out ----------------------------------------------------------------------

def csv_rows(reports: list[StudentReport]) -> list[dict]:
    """One row per (student, exercise) of every notebook reported, in :data:`CSV_COLUMNS`."""
    return [{"student": r.student, "notebook": nb.file, "exercise": e.number, "title": e.title,
             "status": e.status, "points": int(nb.status == "graded" and e.status == core.PASS),
             "max_points": 1, "message": e.message}
            for r in reports for nb in r.notebooks for e in nb.exercises]


def write_csv(reports: list[StudentReport], path: Path) -> None:
    """The grade book: :func:`csv_rows` under a header of :data:`CSV_COLUMNS`."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(csv_rows(reports))


def feedback(report: StudentReport) -> str:
    """A student's feedback in Markdown: the score, then each notebook with its exercises (one
    line for a notebook missing, misnamed or not graded)."""
    lines = [f"# {report.student}: {score(report.points, report.max_points)}", ""]
    if report.reason:
        return "\n".join(lines + [f"Not graded: {report.reason}.", ""])
    for nb in report.notebooks:
        if nb.status == "misnamed":
            lines.append(f"## {nb.file}: {nb.reason}")
        elif nb.status == "graded":
            lines.append(f"## {nb.file}: {nb.passed}/{nb.total}")
            lines += [f"- exercise {e.number} ({e.title}): {e.status}" + (f" — {e.message}" if e.message else "")
                      for e in nb.exercises]
        else:
            lines.append(f"## {nb.file}: 0/{nb.total}, {nb.reason}")
        lines.append("")
    return "\n".join(lines)


def write_feedback(reports: list[StudentReport], folder: Path) -> None:
    """``folder/<student>.md`` for each report."""
    folder.mkdir(parents=True, exist_ok=True)
    for report in reports:
        (folder / f"{report.student}.md").write_text(feedback(report), encoding="utf-8")
