"""python -m mamba_edu grade PATH: execute submitted notebooks and grade their exercises.

PATH is one notebook, a folder of notebooks (one student: not searched recursively), or a class
folder: a folder with no .ipynb directly inside but sub-folders, one per student, each named by
the student's id (submissions/alice/, submissions/bob/, ...; hidden folders are ignored, a
symbolic link is refused with a line naming it).

Each notebook runs top to bottom in a judge process of its own, in a throwaway copy of its folder
(a failing cell does not stop it); then the judge runs the checks on the notebook's functions, on
inputs drawn from a seed fresh for this run, with the functions each exercise forbids made absent.
Nothing the notebook prints reaches the report, and no notebook can change another's grade. A
symbolic link, a folder or a file that is not a JSON notebook is refused with a line naming it; a
dead judge, a timeout, exit() or KeyboardInterrupt gives that notebook 0 with the reason, and
grading goes on. A notebook whose name is not one of the course's is not graded and
is reported with the closest course name (rename it to grade it).

Scores: one point per exercise. A class folder is scored over the whole course (a fixed
denominator): every registered exercise counts for every student, a notebook not submitted
counts 0. A single folder or notebook is scored over the notebooks submitted. Progress (each
notebook as it starts and ends) goes to stderr; the report to stdout: one line per exercise then
the score (a class: one score line per student), or with --json one JSON report. Exit status: 0
when every exercise of every student passes, 1 when one does not, 2 for a usage error (PATH
holds no notebook with registered exercises and no student folder, --sandbox cannot be had).

Grading runs the submitted code: use --sandbox (bubblewrap) or a container; docs/teaching.md says
what each protects.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import threading
from pathlib import Path

from mamba_edu._cli import (HelpFormatter, cpu_seconds, memory_gib, positive_int, prog_name, timeout_seconds,
                            write_refusal)
from mamba_edu.grading.containment import GIB, JudgeLimits

GRADE_NEEDS = ("nbformat", "IPython")  # the extra "grade": pip install 'mamba_edu[grade]'


def missing_modules() -> list[str]:
    """What grading needs and this environment lacks (a plain ``pip install mamba_edu``)."""
    return [name for name in GRADE_NEEDS if importlib.util.find_spec(name) is None]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{prog_name()} grade", description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("path", type=Path,
                        help="a notebook (.ipynb), a folder of notebooks, or a class folder (one "
                             "sub-folder per student)")
    parser.add_argument("--timeout", type=timeout_seconds, default=900,
                        help="seconds one cell, or one exercise's check, may run (at most a day)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON report (per student, notebook and exercise) instead of lines")
    parser.add_argument("--sandbox", action="store_true",
                        help="run each judge in bubblewrap: file system read-only but for the "
                             "notebook's copy, no network, private /tmp and process tree")
    parser.add_argument("--max-memory", type=memory_gib, default=JudgeLimits.memory / GIB, metavar="GIB",
                        help="address space one notebook's judge may use, GiB (not set where a GPU is "
                             "visible: CUDA reserves far more than it uses)")
    parser.add_argument("--max-cpu", type=cpu_seconds, default=JudgeLimits.cpu_seconds, metavar="SECONDS",
                        help="CPU time one notebook's judge may use (the notebook and its checks), "
                             "all threads together")
    parser.add_argument("--jobs", type=positive_int, default=1,
                        help="students graded at a time (a class folder); each notebook runs in "
                             "its own judge process")
    parser.add_argument("--csv", type=Path, metavar="FILE",
                        help="also write one row per (student, exercise): student, notebook, "
                             "exercise, title, status, points, max_points, message")
    parser.add_argument("--feedback", type=Path, metavar="DIR",
                        help="also write DIR/<student>.md per student: the score, each notebook and "
                             "exercise with its status and message (by default none is written)")
    return parser


def usage_error(args, class_mode: bool) -> str | None:
    """What is wrong with the command line before any grading starts, or None."""
    if missing := missing_modules():
        return (f"grading runs notebooks, which needs {', '.join(missing)}: "
                "pip install 'mamba_edu[grade]' (make setup installs them)")
    if args.sandbox and shutil.which("bwrap") is None:
        return ("--sandbox needs bubblewrap (bwrap), which is not installed (apt install bubblewrap, "
                "dnf install bubblewrap); or grade inside a container (docs/teaching.md)")
    if why := path_refusal(args.path):
        return f"PATH {args.path}: {why}"
    if args.csv and (why := csv_refusal(args.csv)):
        return f"--csv {args.csv}: {why}"
    if args.feedback and (why := write_refusal(args.feedback)):
        return f"--feedback {args.feedback}: {why}"
    if args.feedback and class_mode and args.path.resolve() in args.feedback.resolve().parents:
        return f"--feedback {args.feedback}: inside the class folder it would be taken for a student"
    return None


def path_refusal(path: Path) -> str | None:
    """Why ``path`` cannot hold anything to grade, or None: it is missing, or a file that is
    not a notebook (a notebook that is not a regular file is the grader's to refuse, by name)."""
    if not path.exists() and not path.is_symlink():
        return "no such file or folder"
    if path.is_file() and path.suffix != ".ipynb":
        return "not a notebook (.ipynb) nor a folder of notebooks"
    return None


def csv_refusal(path: Path) -> str | None:
    """Why the grade book cannot be written at ``path``, or None (checked before any grading)."""
    if path.is_dir():
        return "is a folder"
    if not path.parent.is_dir():
        return f"no such folder {path.parent} (create it first)"
    return write_refusal(path.parent)


def judge_limits(args) -> JudgeLimits | None:
    """The judges' limits from ``--max-memory`` and ``--max-cpu``; None when both are the
    defaults (the grading library's own)."""
    limits = JudgeLimits(memory=int(args.max_memory * GIB), cpu_seconds=args.max_cpu)
    return None if limits == JudgeLimits() else limits


def main(argv=None) -> int:
    """Grade the notebooks, folder or class folder given in ``argv``; the exit status (0, 1, 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from mamba_edu.grading import classroom

    class_mode = classroom.is_class_folder(args.path)
    if why := usage_error(args, class_mode):
        print(f"{parser.prog}: {why}", file=sys.stderr)
        return 2
    lock = threading.Lock()

    def progress(line: str) -> None:
        with lock:  # students graded in threads: one whole line at a time
            print(line, file=sys.stderr, flush=True)

    args.limits = judge_limits(args)
    try:
        reports = (grade_class if class_mode else grade_folder)(args, progress)
    except classroom.NothingToGrade as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 2
    if args.csv:
        classroom.write_csv(reports, args.csv)
    if args.feedback:
        classroom.write_feedback(reports, args.feedback)
    return 0 if all(r.points == r.max_points for r in reports) else 1


def grade_class(args, progress) -> list:
    """Every student of a class folder, over the whole course: one score line per student, or
    the JSON report with its ``students`` list."""
    from mamba_edu.grading import classroom

    reports = classroom.grade_class(args.path, args.timeout, args.sandbox, args.jobs, progress, args.limits)
    if args.json:
        print(json.dumps({"points": sum(r.points for r in reports),
                          "max_points": sum(r.max_points for r in reports), "sandbox": args.sandbox,
                          "students": [r.as_dict() for r in reports]}, indent=1))
    else:
        for r in reports:
            refused = f", refused: {r.reason}" if r.reason else ""
            print(f"{r.student}: {classroom.score(r.points, r.max_points)}{refused}")
    return reports


def grade_folder(args, progress) -> list:
    """One student's folder or notebook, over the notebooks submitted: one line per exercise and
    the score, or the JSON report (``student`` is the folder's name)."""
    from mamba_edu.grading import classroom

    gradable, wrong = classroom.submitted(args.path)
    if not gradable:
        raise classroom.NothingToGrade(f"no notebook with registered exercises at {args.path} (expected names like "
                         f"{classroom.course_notebooks()[0]}.ipynb, or one sub-folder per student)"
                         + "".join(f"; {w.file}: {w.reason}" for w in wrong))
    folder = Path(os.path.abspath(args.path))
    student = folder.parent.name if folder.suffix == ".ipynb" else folder.name
    report = classroom.grade_student(student, args.path, args.timeout, args.sandbox, progress,
                                     fixed_denominator=False, limits=args.limits)
    if args.json:
        print(json.dumps({"student": student, "passed": report.points, "total": report.max_points,
                          "sandbox": args.sandbox,
                          "notebooks": [classroom.notebook_dict(nb) for nb in report.notebooks]}, indent=1))
    else:
        print_notebooks(report)
        print(f"score: {classroom.score(report.points, report.max_points)}")
    return [report]


#: How the text report introduces the reason of a notebook that was not graded.
NOT_GRADED = {"refused": "refused: ", "zero": "0 points: ", "misnamed": ""}


def print_notebooks(report) -> None:
    """One line per notebook, then one per exercise of a notebook that was graded."""
    from mamba_edu.exercises import core

    for nb in report.notebooks:
        print(nb.file)
        if nb.status != "graded":
            print(f"  {NOT_GRADED[nb.status]}{nb.reason}")
            continue
        for e in nb.exercises:
            detail = f" — {e.message.removeprefix('FAIL ')}" if e.status == core.FAIL and e.message else ""
            print(f"  exercise {e.number} ({e.title}): {e.status}{detail}")
