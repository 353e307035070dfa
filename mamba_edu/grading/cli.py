"""python -m mamba_edu grade PATH: execute submitted notebooks and grade their exercises.

PATH is one notebook, a folder of notebooks (one student: not searched recursively), or a class
folder: a folder with no .ipynb directly inside but sub-folders, one per student, each named by
the student's id (submissions/alice/, submissions/bob/, ...; hidden folders are ignored, a
symbolic link is refused with a line naming it). A folder that reads both ways (notebooks beside
folders of notebooks, a folder named like a notebook beside other folders) is refused.

Each notebook runs top to bottom in a judge process of its own, in a throwaway copy of its folder
(a failing cell does not stop it); then the judge runs the checks on the notebook's functions, on
inputs drawn from the run's seed (fresh per run unless --seed), with the functions each exercise
forbids made absent. Nothing the notebook prints reaches the report, and no notebook can change
another's grade. The learner handout submitted unchanged is "not done" without being run. A
symbolic link, a folder or a file that is not a JSON notebook is refused with a line naming it; a
dead judge, a timeout, exit() or KeyboardInterrupt gives that notebook 0 with the reason, and
grading goes on. A notebook whose name is not one of the course's is not graded and is reported
with the closest course name (rename it to grade it).

Scores: each exercise is worth its points. A class folder is scored over the whole course, or
over the notebooks of --assignment (a fixed denominator): every exercise counts for every
student, a notebook not submitted counts 0. A single folder or notebook is scored over the
notebooks submitted. Progress (each notebook as it starts and ends) goes to stderr; the report to
stdout: a line with the seed, version and commit that replay the run, then one line per exercise
and the score (a class: one score line per student), or with --json one JSON report. Names and
messages reach every output on one line. Exit status: 0 when every exercise of every student
passes, 1 when one does not, 2 for a usage error (PATH holds no notebook with registered
exercises and no student folder, --sandbox cannot be had, --csv or --feedback would write into
the submissions), 130 on Ctrl-C: the students finished before it are written out, the others left
out (a line names them).

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

from mamba_edu._cli import (HelpFormatter, cpu_seconds, memory_gib, positive_int, prog_name, seed_int,
                            timeout_seconds, write_refusal)
from mamba_edu.grading.containment import GIB, JudgeLimits

GRADE_NEEDS = ("nbformat", "IPython")  # the extra "grade": pip install 'mamba_edu[grade]'


def missing_modules() -> list[str]:
    """What grading needs and this environment lacks (a plain ``pip install mamba_edu``)."""
    return [name for name in GRADE_NEEDS if importlib.util.find_spec(name) is None]


def assignment(value: str) -> list[str]:
    """``--assignment``'s argparse type: the notebooks ``value`` names, or a usage error."""
    from mamba_edu.grading import classroom

    try:
        return classroom.assignment(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


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
                        help="notebooks graded at a time, whichever students they belong to; each "
                             "in a judge process of its own")
    parser.add_argument("--assignment", type=assignment, action="extend", metavar="NN",
                        help="grade only these notebooks (two-digit prefix or full name; repeat or "
                             "separate by commas), scored over them alone (default: the whole course)")
    parser.add_argument("--seed", type=seed_int,
                        help="the checks' seed, to replay a run (every report records it; default: "
                             "a fresh one per run)")
    parser.add_argument("--csv", type=Path, metavar="FILE",
                        help="also write the grade book: one row per student, the points of each "
                             "exercise (05.1, …), total, max_points, needs_review, seed, version, commit")
    parser.add_argument("--csv-format", choices=("wide", "long"), default="wide",
                        help="long: one row per (student, exercise) instead: student, notebook, "
                             "exercise, title, status, points, max_points, message, review, seed, …")
    parser.add_argument("--feedback", type=Path, metavar="DIR",
                        help="also write DIR/<student>.md per student: the score, each notebook and "
                             "exercise with its status and message (by default none is written)")
    return parser


def usage_error(args) -> str | None:
    """What is wrong with the command line before any grading starts, or None."""
    if missing := missing_modules():
        return (f"grading runs notebooks, which needs {', '.join(missing)}: "
                "pip install 'mamba_edu[grade]' (make setup installs them)")
    if args.sandbox and shutil.which("bwrap") is None:
        return ("--sandbox needs bubblewrap (bwrap), which is not installed (apt install bubblewrap, "
                "dnf install bubblewrap); or grade inside a container (docs/teaching.md)")
    if why := path_refusal(args.path):
        return f"PATH {args.path}: {why}"
    for option, target, refusal in (("--csv", args.csv, csv_refusal), ("--feedback", args.feedback, write_refusal)):
        if target and (why := refusal(target) or submission_refusal(target, args.path)):
            return f"{option} {target}: {why}"
    return None


def path_refusal(path: Path) -> str | None:
    """Why ``path`` cannot hold anything to grade, or None: it is missing, or a file that is
    not a notebook (a notebook that is not a regular file is the grader's to refuse, by name)."""
    if not path.exists() and not path.is_symlink():
        return "no such file or folder"
    if path.is_file() and path.suffix != ".ipynb":
        return "not a notebook (.ipynb) nor a folder of notebooks"
    return None


def submission_refusal(target: Path, graded: Path) -> str | None:
    """Why an output may not be written at ``target``, or None: it is a notebook, or the path
    being graded, or inside it (grades never land on a submission, nor look like a student)."""
    target, graded = target.resolve(), graded.resolve()
    if target.suffix == ".ipynb":
        return "is a notebook: grades are never written over a submission"
    if target == graded or graded in target.parents:
        return f"lies in {graded}, which is being graded: write the grades outside the submissions"
    return None


def csv_refusal(path: Path) -> str | None:
    """Why the grade book cannot be written at ``path``, or None (checked before any grading)."""
    if path.is_dir():
        return "is a folder"
    if not path.parent.is_dir():
        return f"no such folder {path.parent} (create it first)"
    return write_refusal(path.parent)


def main(argv=None) -> int:
    """Grade the notebooks, folder or class folder given in ``argv``; the exit status (0, 1, 2,
    or 130 on Ctrl-C)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from mamba_edu.grading import classroom, grader

    try:
        class_mode = classroom.is_class_folder(args.path)
    except classroom.NothingToGrade as err:
        return refuse(parser, str(err))
    if why := usage_error(args):
        return refuse(parser, why)
    lock = threading.Lock()

    def progress(line: str) -> None:
        with lock:  # notebooks graded in threads: one whole line at a time
            print(line, file=sys.stderr, flush=True)

    seed = grader.fresh_seed() if args.seed is None else args.seed
    settings = {"sandbox": args.sandbox, "jobs": args.jobs, "seed": seed, "stems": args.assignment or (),
                "limits": JudgeLimits(memory=int(args.max_memory * GIB), cpu_seconds=args.max_cpu)}
    meta, unfinished = classroom.provenance(seed), None
    try:
        reports = (grade_class if class_mode else grade_folder)(args, progress, settings)
    except classroom.NothingToGrade as err:
        return refuse(parser, str(err))
    except classroom.Interrupted as interrupted:
        reports, unfinished = interrupted.reports, interrupted.unfinished
        progress(f"{parser.prog}: interrupted; not finished, so left out of every output: "
                 f"{', '.join(unfinished) or 'none'}")
    if class_mode:
        show_class(reports, {"sandbox": args.sandbox, **meta}, unfinished or [], args.json)
    elif reports:
        show_student(reports[0], {"sandbox": args.sandbox, **meta}, args.json)
    if args.csv and reports:
        classroom.write_csv(reports, args.csv, meta, args.csv_format)
    if args.feedback and reports:
        classroom.write_feedback(reports, args.feedback, meta)
    if unfinished is not None:
        return 130
    return 0 if all(r.points == r.max_points for r in reports) else 1


def refuse(parser, why: str) -> int:
    """A usage error: one line on stderr; exit status 2."""
    print(f"{parser.prog}: {why}", file=sys.stderr)
    return 2


def grade_class(args, progress, settings) -> list:
    """Every student of a class folder, over the notebooks of the run."""
    from mamba_edu.grading import classroom

    return classroom.grade_class(args.path, args.timeout, progress, **settings)


def grade_folder(args, progress, settings) -> list:
    """One student's folder or notebook, over the notebooks submitted (the student is named by
    the folder)."""
    from mamba_edu.grading import classroom

    gradable, wrong = classroom.submitted(args.path, settings["stems"])
    if not gradable:
        raise classroom.NothingToGrade(f"no notebook with registered exercises at {args.path} (expected names like "
                         f"{classroom.course_notebooks()[0]}.ipynb, or one sub-folder per student)"
                         + "".join(f"; {w.file}: {w.reason}" for w in wrong))
    folder = Path(os.path.abspath(args.path))
    student = classroom.student_name(folder.parent.name if folder.suffix == ".ipynb" else folder.name)
    return classroom.grade_students([(student, args.path)], classroom.Run(args.timeout, **settings), progress,
                                    fixed_denominator=False)


def show_class(reports: list, meta: dict, unfinished: list[str], as_json: bool) -> None:
    """A class's report: the run's provenance (``meta``, with ``sandbox``) then one score line per
    student, or the JSON report with its ``students`` list (and the names of those
    ``interrupted``)."""
    from mamba_edu.grading import classroom

    if as_json:
        print(json.dumps({"points": sum(r.points for r in reports), "max_points": sum(r.max_points for r in reports),
                          **meta, "interrupted": unfinished, "students": [r.as_dict() for r in reports]}, indent=1))
        return
    print(f"graded with {classroom.replay(meta)}")
    for r in reports:
        refused = f", refused: {r.reason}" if r.reason else ""
        print(f"{r.student}: {classroom.score(r.points, r.max_points)}{refused}")


def show_student(report, meta: dict, as_json: bool) -> None:
    """One folder's report: the run's provenance (``meta``, with ``sandbox``), one line per
    exercise and the score, or the JSON report."""
    from mamba_edu.grading import classroom

    if as_json:
        print(json.dumps({"student": report.student, "passed": sum(nb.passed for nb in report.notebooks),
                          "total": sum(nb.total for nb in report.notebooks), "points": report.points,
                          "max_points": report.max_points, **meta,
                          "notebooks": [classroom.notebook_dict(nb) for nb in report.notebooks]}, indent=1))
        return
    print(f"graded with {classroom.replay(meta)}")
    print_notebooks(report)
    print(f"score: {classroom.score(report.points, report.max_points)}")


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
            detail = f" — {e.message.removeprefix('FAIL ')}" if e.status != core.PASS and e.message else ""
            print(f"  exercise {e.number} ({e.title}): {e.status}{detail}")
