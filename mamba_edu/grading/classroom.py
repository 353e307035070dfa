"""Grading a class, with the conventions of nbgrader and otter-grader: one sub-folder per student,
scored over the whole course or an assignment (a notebook not submitted counts 0), misnamed
notebooks reported with the closest name, the handout unchanged "not done" without a judge,
``jobs`` notebooks graded at a time, a grade book and a feedback file per student, every name
and message printable, each naming what replays the run. ``docs/teaching.md`` gives the rules.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import os
import signal
import subprocess
import threading
import unicodedata
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import mamba_edu
from mamba_edu.exercises import core
from mamba_edu.exercises.core import ExerciseResult, NotebookResult
from mamba_edu.grading.containment import JudgeLimits, children, kill_descendants, read_regular
from mamba_edu.grading.grader import (CONFINED, REPO_DIR, Environment, code_cells, every_exercise,
                                      fresh_seed, grade_paths)

NAME_BYTES = 64  # a longer student name is shortened: a file name holds at most 255 bytes
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet may read these as a formula (OWASP)


class NothingToGrade(ValueError):
    """The path holds no notebook of the course and no student folder, or reads two ways."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while grading: the ``reports`` of the students finished before it, and the names of
    the others."""

    def __init__(self, reports: list[StudentReport], unfinished: list[str]):
        super().__init__(f"interrupted: {len(unfinished)} student(s) not finished")
        self.reports, self.unfinished = reports, unfinished


def _silent(line: str) -> None:
    """The default progress: say nothing."""


# --- what reaches the outputs -----------------------------------------------------------------

def printable(text: str) -> str:
    """``text`` on one line: a line break becomes ``␤``, another control character (or a file
    name's undecodable byte) ``�``, so that no message writes a line (``score: 4/4``) of its own."""
    one_line = "␤".join(text.splitlines())
    return "".join("�" if unicodedata.category(c) in ("Cc", "Cs") else c for c in one_line)


def cell(value):
    """A CSV cell: a string made printable, after a ``'`` where it starts (spaces aside) as a
    formula may, or with a ``'`` itself (so that ``=x`` and ``'=x`` stay two names)."""
    if not isinstance(value, str):
        return value
    return "'" + printable(value) if value.lstrip(" ").startswith((*FORMULA_START, "'")) else printable(value)


def student_name(folder: str) -> str:
    """The name a student folder is shown by: its own when printable and at most
    :data:`NAME_BYTES` bytes, else its printable start, ``…`` and 8 hex digits of its hash."""
    raw, shown = os.fsencode(folder), printable(folder).replace("/", "�")
    if shown == folder and len(raw) <= NAME_BYTES:
        return folder
    start = shown.encode()[:NAME_BYTES - 12].decode(errors="ignore")
    return f"{start}…{hashlib.sha256(raw).hexdigest()[:8]}"


@cache
def commit() -> str:
    """The commit of the checkout the package runs from, or ``unknown``."""
    try:
        top, head = subprocess.run(["git", "-C", str(REPO_DIR), "rev-parse", "--show-toplevel", "HEAD"],
                                   capture_output=True, text=True, timeout=10, check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError, ValueError):
        return "unknown"
    return head if Path(top).resolve() == REPO_DIR.resolve() else "unknown"


def provenance(seed: int) -> dict:
    """What replays a grading run: the checks' ``seed``, the package's version, the commit."""
    return {"seed": seed, "version": mamba_edu.__version__, "commit": commit()}


def replay(meta: dict) -> str:
    """:func:`provenance` in words."""
    return f"seed {meta['seed']}, mamba_edu {meta['version']}, commit {meta['commit']}"


# --- the course's names and points ------------------------------------------------------------

def course_notebooks() -> list[str]:
    """The stems of the course's notebooks: those with exercises, and the appendices."""
    return sorted(set(core.REGISTRY) | {p.stem for p in (REPO_DIR / "notebooks").glob("*.ipynb")})


def course_points(stems=()) -> int:
    """The fixed denominator: the points of the notebooks ``stems`` (empty: the course)."""
    return sum(ex.points for stem in (stems or core.REGISTRY) for ex in core.REGISTRY[stem].values())


def assignment(choices: str) -> list[str]:
    """The notebooks ``choices`` names (``05``, ``05,07``, full names); ``ValueError`` for one
    without exercises."""
    stems = []
    for choice in choices.split(","):
        found = [s for s in core.REGISTRY if choice.strip().removesuffix(".ipynb") in (s, s[:2])]
        if not found:
            raise ValueError(f"no notebook with exercises is called {choice!r}: choose among "
                             f"{', '.join(sorted(s[:2] for s in core.REGISTRY))} (or their full names)")
        stems += found
    return stems


def closest(stem: str) -> str | None:
    """The course notebook ``stem`` most likely meant, or None."""
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


def scored(nb: NotebookResult, e: ExerciseResult) -> int:
    """The points exercise ``e`` earned: its worth if it passed in a graded notebook."""
    return e.points if nb.status == "graded" and e.status == core.PASS else 0


def earned(nb: NotebookResult) -> int:
    return sum(scored(nb, e) for e in nb.exercises)


def worth(nb: NotebookResult) -> int:
    return sum(e.points for e in nb.exercises)


# --- the layout -------------------------------------------------------------------------------

def notebooks_in(path: Path) -> list[Path]:
    """``path`` if it names a notebook, else what lies directly in it named ``*.ipynb`` (a
    folder too: the grader refuses it by name), sorted."""
    if path.suffix == ".ipynb" and (path.is_symlink() or not path.is_dir()):
        return [path]
    return sorted(p for p in path.iterdir() if p.name.endswith(".ipynb")) if path.is_dir() else []


def is_class_folder(path: Path) -> bool:
    """A folder with sub-folders (one per student) and no notebook directly inside;
    :class:`NothingToGrade` for one that reads two ways: folders named like notebooks beside
    other sub-folders, or notebooks beside sub-folders of notebooks."""
    if not path.is_dir():
        return False
    named = notebooks_in(path)
    folders = [p for p in path.iterdir() if p.is_dir() and p not in named and not p.name.startswith(".")]
    if named and folders and all(p.is_dir() for p in named):
        raise NothingToGrade(f"{path} reads two ways: {printable(named[0].name)} is a folder named like a "
                             f"notebook, beside the folder {printable(folders[0].name)}; rename it, or grade one folder")
    if any(not p.is_dir() for p in named) and (holders := [f for f in folders if notebooks_in(f)]):
        raise NothingToGrade(f"{path} reads two ways: notebooks ({printable(named[0].name)}) beside folders "
                             f"of notebooks ({printable(holders[0].name)}); a class folder holds only student folders")
    return not named and any(p.is_dir() for p in path.iterdir())


# --- grading students -------------------------------------------------------------------------

@dataclass
class Run:
    """What a run applies to every notebook: the judges' ``timeout`` (s), ``sandbox`` and
    ``limits``, ``jobs`` judges at a time, the checks' ``seed`` (None: a fresh one) and the
    notebooks graded, ``stems`` (empty: the course's)."""

    timeout: int
    sandbox: bool = False
    jobs: int = 1
    limits: JudgeLimits = JudgeLimits()
    seed: int | None = None
    stems: tuple[str, ...] = ()
    environment: Environment | None = None  # shared by the run's notebooks (made here)

    def __post_init__(self):
        if type(self.jobs) is not int or self.jobs < 1:
            raise ValueError("jobs (notebooks graded at a time) must be a whole number of at least 1, "
                             f"got {self.jobs!r}")
        self.seed = fresh_seed() if self.seed is None else self.seed
        self.stems = tuple(sorted(set(self.stems or core.REGISTRY)))
        self.environment = Environment(CONFINED and not self.sandbox)


@dataclass
class StudentReport:
    """One student's grade: every notebook reported (graded, zero, refused, missing, misnamed),
    and why the whole folder was refused, if it was."""

    student: str
    notebooks: list[NotebookResult]
    reason: str = ""

    @property
    def points(self) -> int:
        return sum(earned(nb) for nb in self.notebooks)

    @property
    def max_points(self) -> int:
        return sum(worth(nb) for nb in self.notebooks)

    def as_dict(self) -> dict:
        return {"student": self.student, "points": self.points, "max_points": self.max_points,
                "reason": self.reason, "notebooks": [notebook_dict(nb) for nb in self.notebooks]}


def notebook_dict(nb: NotebookResult) -> dict:
    """A notebook of the JSON report, its exercises and points counted."""
    return {**asdict(nb), "passed": nb.passed, "total": nb.total, "points": earned(nb),
            "max_points": worth(nb)}


def tidy(nb: NotebookResult) -> NotebookResult:
    """``nb`` as every output shows it (changed in place): its texts printable, each exercise
    worth its registered points."""
    registered = core.REGISTRY.get(Path(nb.file).stem, {})
    nb.file, nb.reason = printable(nb.file), printable(nb.reason)
    for e in nb.exercises:
        e.message, e.review, e.points = printable(e.message), printable(e.review), registered[e.number].points
    return nb


def submitted(path: Path, stems=()) -> tuple[list[Path], list[NotebookResult]]:
    """The notebooks at ``path`` (a folder or one notebook) to grade, those of ``stems`` (empty:
    the course's), and a ``misnamed`` result for each whose name is not a course notebook's."""
    found, course = notebooks_in(path), course_notebooks()
    wrong = [tidy(NotebookResult(p.name, "misnamed", misnamed_reason(p.name))) for p in found
             if p.stem not in course]
    return [p for p in found if p.stem in (stems or core.REGISTRY)], wrong


def whole_course(results: list[NotebookResult], wrong: list[NotebookResult],
                 why: str = "not submitted", stems=()) -> list[NotebookResult]:
    """``results`` and ``wrong``, and each notebook of ``stems`` (empty: the course's) not among
    the results as missing (naming the misnamed files that look like it), sorted by file."""
    graded, missing = {Path(r.file).stem for r in results}, []
    for stem in sorted(set(stems or core.REGISTRY) - graded):
        lookalikes = ", ".join(w.file for w in wrong if closest(Path(w.file).stem) == stem)
        reason = why + (f" ({lookalikes} was not graded: its name is not this one)" if lookalikes else "")
        missing.append(NotebookResult(f"{stem}.ipynb", "missing", reason,
                                      every_exercise(stem, core.FAIL, reason)))
    return sorted(results + wrong + missing, key=lambda r: r.file)


def untouched(path: Path) -> bool:
    """Whether the code cells of notebook ``path`` are the checkout's handout's, unchanged."""
    handout = REPO_DIR / "notebooks" / path.name
    try:
        return handout.is_file() and code_cells(read_regular(path)) == code_cells(handout.read_bytes())
    except (OSError, ValueError, TypeError, AttributeError, KeyError):  # no notebook: refused later
        return False


def grade_notebook(student: str, path: Path, run: Run, progress) -> NotebookResult:
    """``student``'s notebook at ``path`` in a judge of its own (the handout unchanged is not
    run), tidied; ``progress(line)`` as it starts and ends."""
    if untouched(path):
        result = NotebookResult(path.name, "graded",
                                exercises=every_exercise(path.stem, core.NOT_DONE, "the handout, unchanged"))
    else:
        [result] = grade_paths([path], run.timeout, run.sandbox, limits=run.limits, seed=run.seed,
                               environment=run.environment,
                               started=lambda p: progress(f"[{student}] {p.name} …"))
    tidy(result)
    if result.status == "graded":
        progress(f"[{student}] {result.file}: {earned(result)}/{worth(result)} ({result.seconds:.0f} s)")
    else:
        progress(f"[{student}] {result.file}: 0/{worth(result)}, {result.status}: {result.reason}")
    return result


def grade_students(students: list[tuple[str, Path]], run: Run, progress=_silent,
                   fixed_denominator: bool = True) -> list[StudentReport]:
    """Grade each ``(name, folder or notebook)``, a job per notebook, ``run.jobs`` at a time; with
    a ``fixed_denominator`` every notebook of the run is reported (those not submitted missing),
    else what was submitted. Ctrl-C raises :class:`Interrupted` with the students finished."""
    found = {name: submitted(path, run.stems) for name, path in students}
    for name, (_, wrong) in found.items():
        for result in wrong:
            progress(f"[{name}] {result.file}: {result.reason}")

    def report(name: str) -> StudentReport:
        results, wrong = [job.result() for job in jobs[name]], found[name][1]
        return StudentReport(name, whole_course(results, wrong, stems=run.stems) if fixed_denominator
                             else sorted(results + wrong, key=lambda r: r.file))

    spared = frozenset(children())  # this process's children from before any judge
    with ThreadPoolExecutor(max_workers=run.jobs) as pool:
        jobs = {name: [pool.submit(grade_notebook, name, p, run, progress) for p in gradable]
                for name, (gradable, _) in found.items()}
        try:
            return [report(name) for name in jobs]
        except KeyboardInterrupt:
            main = threading.current_thread() is threading.main_thread()
            handler = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None  # a second Ctrl-C: the same
            finished = [name for name, mine in jobs.items()
                        if all(j.done() and not j.cancelled() and j.exception() is None for j in mine)]
            pool.shutdown(wait=False, cancel_futures=True)  # then kill the judges in flight
            running = [job for mine in jobs.values() for job in mine if not job.cancelled()]
            while wait(running, timeout=0.5).not_done:  # (a cancelled job is never "done")
                kill_descendants(keep=spared)
            unfinished = [name for name in jobs if name not in finished]
            reports = [report(name) for name in finished]
            if main:
                signal.signal(signal.SIGINT, handler)
            raise Interrupted(reports, unfinished) from None


def grade_folder(path: Path, timeout: int, progress=_silent, **settings) -> list[StudentReport]:
    """One student's folder or notebook under ``Run(timeout, **settings)``, scored over what was
    submitted; the student is named by the folder."""
    run = Run(timeout, **settings)
    gradable, wrong = submitted(path, run.stems)
    held = submitted(path)[0] if run.stems and not gradable else []  # the course's notebooks it holds
    if held:
        raise NothingToGrade(f"no notebook of the assignment ({', '.join(run.stems)}) at {path}; it holds "
                             + ", ".join(p.name for p in held))
    if not gradable:
        raise NothingToGrade(f"no notebook with registered exercises at {path} (expected names like "
                             f"{course_notebooks()[0]}.ipynb, or one sub-folder per student)"
                             + "".join(f"; {w.file}: {w.reason}" for w in wrong))
    folder = Path(os.path.abspath(path))
    student = student_name(folder.parent.name if folder.suffix == ".ipynb" else folder.name)
    return grade_students([(student, path)], run, progress, fixed_denominator=False)


def students_in(class_dir: Path, stems=()) -> tuple[list[Path], list[StudentReport]]:
    """The student folders of ``class_dir`` (not hidden, sorted), and a refused report (0 points
    of the notebooks ``stems``) for each one that is a symbolic link (a broken one too).
    :class:`NothingToGrade` where two folders are shown by the same name."""
    folders, refused = [], []
    entries = sorted(p for p in class_dir.iterdir()
                     if (p.is_dir() or p.is_symlink()) and not p.name.startswith("."))
    names = [student_name(p.name) for p in entries]
    twins = sorted({n for n in names if names.count(n) > 1})
    if twins:
        raise NothingToGrade(f"{class_dir}: two student folders are shown as {printable(twins[0])} (a name "
                             "made printable or shortened); rename one, so that no grade lands on the other")
    for entry in entries:
        name = student_name(entry.name)
        if entry.is_symlink():
            why = f"{name} is a symbolic link (copy the student's folder itself)"
            refused.append(StudentReport(name, whole_course([], [], "not graded: " + why, stems), why))
        else:
            folders.append(entry)
    return folders, refused


def grade_class(class_dir: Path, timeout: int, progress=_silent, **settings) -> list[StudentReport]:
    """Every student of ``class_dir`` under ``Run(timeout, **settings)``, sorted by name."""
    run = Run(timeout, **settings)
    if not class_dir.is_dir():
        raise NothingToGrade(f"{class_dir}: no such folder (expected a class folder, one sub-folder per "
                             "student)")
    folders, refused = students_in(class_dir, run.stems)
    if not folders and not refused:
        raise NothingToGrade(f"{class_dir} holds no student sub-folders (hidden ones are ignored): "
                             "expected one sub-folder of notebooks per student")
    for report in refused:
        progress(f"[{report.student}] refused: {report.reason}")
    try:
        graded = grade_students([(student_name(f.name), f) for f in folders], run, progress)
    except Interrupted as interrupted:
        interrupted.reports = sorted(interrupted.reports + refused, key=lambda r: r.student)
        raise
    return sorted(graded + refused, key=lambda r: r.student)


# --- what is written out ----------------------------------------------------------------------

def wide_rows(reports: list[StudentReport]) -> list[dict]:
    """A row per student, as a grade book imports it: the points of each exercise (``05.1``:
    exercise 1 of ``05_….ipynb``), ``total``, ``max_points``, ``needs_review`` (``06.1;07.2``)."""
    rows = []
    for r in reports:
        done = {f"{nb.file[:2]}.{e.number}": (scored(nb, e), e.review)
                for nb in r.notebooks for e in nb.exercises}
        rows.append({"student": r.student, **{column: points for column, (points, _) in done.items()},
                     "total": r.points, "max_points": r.max_points,
                     "needs_review": ";".join(column for column, (_, why) in done.items() if why)})
    return rows


def long_rows(reports: list[StudentReport]) -> list[dict]:
    """A row per (student, exercise) of every notebook reported."""
    return [{"student": r.student, "notebook": nb.file, "exercise": e.number, "title": e.title,
             "status": e.status, "points": scored(nb, e), "max_points": e.points, "message": e.message,
             "review": e.review} for r in reports for nb in r.notebooks for e in nb.exercises]


def write_csv(reports: list[StudentReport], path: Path, meta: dict, form: str = "wide") -> None:
    """The grade book, :func:`wide_rows` or :func:`long_rows`, each row ending with the run's
    :func:`provenance`, every cell through :func:`cell`."""
    rows = [{**row, **meta} for row in (wide_rows if form == "wide" else long_rows)(reports)]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, list(dict.fromkeys(key for row in rows for key in row)), restval="")
        writer.writeheader()
        writer.writerows({key: cell(value) for key, value in row.items()} for row in rows)


def feedback(report: StudentReport, meta: dict) -> str:
    """A student's feedback in Markdown: the score and the run's provenance, then each notebook
    and its exercises."""
    lines = [f"# {report.student}: {score(report.points, report.max_points)}", "",
             f"Graded with {replay(meta)}.", ""]
    if report.reason:
        return "\n".join(lines + [f"Not graded: {report.reason}.", ""])
    for nb in report.notebooks:
        if nb.status == "graded":
            lines.append(f"## {nb.file}: {earned(nb)}/{worth(nb)}")
            for e in nb.exercises:
                message = f" — {e.message}" if e.message else ""
                lines.append(f"- exercise {e.number} ({e.title}): {e.status}{message}")
        else:
            lines.append(f"## {nb.file}: {nb.reason}" if nb.status == "misnamed"
                         else f"## {nb.file}: 0/{worth(nb)}, {nb.reason}")
        lines.append("")
    return "\n".join(lines)


def write_feedback(reports: list[StudentReport], folder: Path, meta: dict) -> None:
    """``folder/<student>.md`` for each report."""
    folder.mkdir(parents=True, exist_ok=True)
    for report in reports:
        (folder / f"{report.student}.md").write_text(feedback(report, meta), encoding="utf-8")
