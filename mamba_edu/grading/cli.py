"""python -m mamba_edu grade PATH: execute submitted notebooks and grade their exercises.

PATH is one notebook, a folder of notebooks (one student), or a class folder: no .ipynb directly
inside, one sub-folder per student (submissions/alice/, ...). Each notebook runs in a judge
process of its own, then the checks run on its functions, on inputs drawn from the run's seed.
A class is scored over the whole course or --assignment, a folder over what was submitted.
Progress goes to stderr, the report to stdout. Exit status: 0 when every exercise passes, 1 when
one does not, 2 for a usage error, 130 on Ctrl-C (the students finished are still written out).
Grading runs the submitted code: docs/teaching.md says what each setting protects.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import threading
from pathlib import Path

from mamba_edu._cli import (HelpFormatter, cpu_seconds, memory_gib, positive_int, prog_name, seed_int,
                            timeout_seconds, write_refusal)
from mamba_edu.grading.containment import GIB, JudgeLimits

GRADE_NEEDS = ("nbformat", "IPython")  # the extra "grade": pip install 'mamba_edu[grade]'
NOT_GRADED = {"refused": "refused: ", "zero": "0 points: ", "misnamed": ""}  # before a notebook's reason


def missing_modules() -> list[str]:
    """What grading needs and this environment lacks (a plain ``pip install mamba_edu``)."""
    return [name for name in GRADE_NEEDS if importlib.util.find_spec(name) is None]


def assignment(value: str) -> list[str]:
    """``--assignment``'s type: the notebooks ``value`` names, or a usage error."""
    from mamba_edu.grading import classroom

    try:
        return classroom.assignment(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{prog_name()} grade", description=__doc__,
                                     formatter_class=HelpFormatter)
    add = parser.add_argument
    add("path", type=Path, help="a notebook (.ipynb), a folder of notebooks, or a class folder")
    add("--timeout", type=timeout_seconds, default=900,
        help="seconds one cell, or one exercise's check, may run (at most a day)")
    add("--json", action="store_true", help="print one JSON report instead of lines")
    add("--sandbox", action="store_true", help="run each judge in bubblewrap: file system read-only but "
        "for the notebook's copy, no network, private /tmp and process tree")
    add("--max-memory", type=memory_gib, default=JudgeLimits.memory / GIB, metavar="GIB",
        help="address space one judge may use, GiB (not set where a GPU is visible)")
    add("--max-cpu", type=cpu_seconds, default=JudgeLimits.cpu_seconds, metavar="SECONDS",
        help="CPU time one judge may use, all threads together")
    add("--jobs", type=positive_int, default=1, help="notebooks graded at a time, whoever submitted them")
    add("--assignment", type=assignment, action="extend", metavar="NN",
        help="grade only these notebooks (two-digit prefix or full name; repeat or separate by commas)")
    add("--seed", type=seed_int, help="the checks' seed, to replay a run (default: a fresh one)")
    add("--csv", type=Path, metavar="FILE", help="also write the grade book: a row per student, the "
        "points of each exercise, total, max_points, needs_review, seed, …")
    add("--csv-format", choices=("wide", "long"), default="wide", help="long: a row per (student, exercise)")
    add("--feedback", type=Path, metavar="DIR", help="also write DIR/<student>.md per student")
    return parser


def csv_refusal(path: Path) -> str | None:
    """Why the grade book cannot be written at ``path``, or None."""
    if path.is_dir():
        return "is a folder"
    if not path.parent.is_dir():
        return f"no such folder {path.parent} (create it first)"
    return write_refusal(path.parent)


def submission_refusal(target: Path, graded: Path) -> str | None:
    """Why an output may not be written at ``target``, or None: grades never land on a notebook,
    nor in the path graded."""
    target, graded = target.resolve(), graded.resolve()
    if target.suffix == ".ipynb":
        return "is a notebook: grades are never written over a submission"
    if target == graded or graded in target.parents:
        return f"lies in {graded}, which is being graded: write the grades outside the submissions"
    return None


def usage_error(args) -> str | None:
    """What is wrong with the command line before any grading starts, or None."""
    if missing := missing_modules():
        return (f"grading runs notebooks, which needs {', '.join(missing)}: "
                "pip install 'mamba_edu[grade]' (make setup installs them)")
    if args.sandbox and shutil.which("bwrap") is None:
        return ("--sandbox needs bubblewrap (bwrap), which is not installed (apt install bubblewrap, "
                "dnf install bubblewrap); or grade inside a container (docs/teaching.md)")
    if not args.path.exists() and not args.path.is_symlink():
        return f"PATH {args.path}: no such file or folder"
    if args.path.is_file() and args.path.suffix != ".ipynb":
        return f"PATH {args.path}: not a notebook (.ipynb) nor a folder of notebooks"
    for option, target, refusal in (("--csv", args.csv, csv_refusal),
                                    ("--feedback", args.feedback, write_refusal)):
        if target and (why := refusal(target) or submission_refusal(target, args.path)):
            return f"{option} {target}: {why}"
    return None


def main(argv=None) -> int:
    """Grade the notebooks, folder or class folder given in ``argv``; the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from mamba_edu.grading import classroom, grader

    lock = threading.Lock()

    def progress(line: str) -> None:
        with lock:  # notebooks graded in threads: one whole line at a time
            print(line, file=sys.stderr, flush=True)

    seed = grader.fresh_seed() if args.seed is None else args.seed
    settings = {"sandbox": args.sandbox, "jobs": args.jobs, "seed": seed, "stems": args.assignment or (),
                "limits": JudgeLimits(memory=int(args.max_memory * GIB), cpu_seconds=args.max_cpu)}
    reports, unfinished = [], None
    try:
        class_mode = classroom.is_class_folder(args.path)
        if why := usage_error(args):
            return refuse(parser, why)
        grade = classroom.grade_class if class_mode else classroom.grade_folder
        reports = grade(args.path, args.timeout, progress, **settings)
    except classroom.NothingToGrade as err:
        return refuse(parser, str(err))
    except classroom.Interrupted as interrupted:
        reports, unfinished = interrupted.reports, interrupted.unfinished
        progress(f"{parser.prog}: interrupted; not finished, so left out of every output: "
                 f"{', '.join(unfinished) or 'none'}")
    meta = classroom.provenance(seed)
    if args.json and (class_mode or reports):
        report = json_report(reports, {"sandbox": args.sandbox, **meta}, class_mode, unfinished)
        print(json.dumps(report, indent=1))
    elif class_mode or reports:
        show(reports, meta, class_mode)
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


def json_report(reports: list, meta: dict, class_mode: bool, unfinished: list[str] | None) -> dict:
    """The JSON report: the run's provenance (``meta``) and a class's ``students`` (and those
    ``interrupted``), or one folder's ``notebooks``."""
    from mamba_edu.grading import classroom

    if class_mode:
        return {"points": sum(r.points for r in reports), "max_points": sum(r.max_points for r in reports),
                **meta, "interrupted": unfinished or [], "students": [r.as_dict() for r in reports]}
    [r] = reports
    return {"student": r.student, "passed": sum(nb.passed for nb in r.notebooks),
            "total": sum(nb.total for nb in r.notebooks), "points": r.points, "max_points": r.max_points,
            **meta, "notebooks": [classroom.notebook_dict(nb) for nb in r.notebooks]}


def show(reports: list, meta: dict, class_mode: bool) -> None:
    """The text report: the run's provenance, then a score line per student of a class, or a
    line per notebook and exercise of one folder and its score."""
    from mamba_edu.exercises import core
    from mamba_edu.grading import classroom

    print(f"graded with {classroom.replay(meta)}")
    if class_mode:
        for r in reports:
            refused = f", refused: {r.reason}" if r.reason else ""
            print(f"{r.student}: {classroom.score(r.points, r.max_points)}{refused}")
        return
    [report] = reports
    for nb in report.notebooks:
        print(nb.file)
        if nb.status != "graded":
            print(f"  {NOT_GRADED[nb.status]}{nb.reason}")
            continue
        for e in nb.exercises:
            detail = f" — {e.message.removeprefix('FAIL ')}" if e.status != core.PASS and e.message else ""
            print(f"  exercise {e.number} ({e.title}): {e.status}{detail}")
    print(f"score: {classroom.score(report.points, report.max_points)}")
