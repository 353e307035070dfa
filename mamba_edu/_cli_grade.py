"""python -m mamba_edu grade PATH: execute submitted notebooks and grade their exercises.

PATH is one notebook or a folder of them (not searched recursively). Each notebook runs top to
bottom in its own kernel, in a throwaway copy of its folder (a failing cell does not stop it);
then the grader calls the notebook's functions from its own process, with inputs it makes, and
judges what they return: nothing the notebook prints or patches reaches a verdict. A symbolic
link, a folder or a file that is not a JSON notebook is refused with a line naming it; a dead
kernel, a timeout, exit() or KeyboardInterrupt gives that notebook 0 with the reason, and grading
goes on. One line per exercise, then the score; --json prints one JSON report instead. Exit
status: 0 when every exercise passes, 1 when one does not, 2 when PATH holds no notebook with
registered exercises (or --sandbox cannot be had).

Grading runs the submitted code: use --sandbox (bubblewrap) or a container; docs/teaching.md says
what each protects.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from mamba_edu._cli import HelpFormatter, positive_int, prog_name

GRADE_NEEDS = ("nbformat", "nbclient", "ipykernel")  # the extra "grade": pip install 'mamba_edu[grade]'


def missing_modules() -> list[str]:
    """What grading needs and this environment lacks (a plain ``pip install mamba_edu``)."""
    return [name for name in GRADE_NEEDS if importlib.util.find_spec(name) is None]


def main(argv=None) -> int:
    """Grade every notebook at the path given in ``argv``; the exit status (0, 1 or 2)."""
    parser = argparse.ArgumentParser(prog=f"{prog_name()} grade", description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("path", type=Path, help="a notebook (.ipynb) or a folder of notebooks")
    parser.add_argument("--timeout", type=positive_int, default=900,
                        help="seconds one cell, or one call of a learner's function, may run")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON report (per notebook and exercise) instead of lines")
    parser.add_argument("--sandbox", action="store_true",
                        help="run each kernel in bubblewrap: file system read-only but for the "
                             "notebook's copy, no network, private /tmp and process tree")
    args = parser.parse_args(argv)
    if missing := missing_modules():
        print(f"{parser.prog}: grading runs notebooks, which needs {', '.join(missing)}: "
              "pip install 'mamba_edu[grade]' (make setup installs them)", file=sys.stderr)
        return 2
    if args.sandbox and shutil.which("bwrap") is None:
        print(f"{parser.prog}: --sandbox needs bubblewrap (bwrap), which is not installed "
              "(apt install bubblewrap, dnf install bubblewrap); or grade inside a container "
              "(docs/teaching.md)", file=sys.stderr)
        return 2
    from mamba_edu.exercises import core
    from mamba_edu.exercises.grader import grade_paths, notebooks_in

    gradable = [p for p in notebooks_in(args.path) if p.stem in core.REGISTRY]
    if not gradable:
        print(f"{parser.prog}: no notebook with registered exercises at {args.path} "
              f"(expected names like {sorted(core.REGISTRY)[0]}.ipynb)", file=sys.stderr)
        return 2

    def report(result) -> None:
        if args.json:
            return
        print(result.file, flush=True)
        if result.status == "refused":
            print(f"  refused: {result.reason}", flush=True)
            return
        if result.status == "zero":
            print(f"  0 points: {result.reason}", flush=True)
            return
        for e in result.exercises:
            detail = f" — {e.message.removeprefix('FAIL ')}" if e.status == core.FAIL and e.message else ""
            print(f"  exercise {e.number} ({e.title}): {e.status}{detail}", flush=True)

    results = grade_paths(gradable, args.timeout, sandbox=args.sandbox, report=report)
    passed, total = sum(r.passed for r in results), sum(r.total for r in results)
    if args.json:
        print(json.dumps({"passed": passed, "total": total, "sandbox": args.sandbox, "notebooks": [
            {**asdict(r), "passed": r.passed, "total": r.total} for r in results]}, indent=1))
    else:
        print(f"score: {passed}/{total} ({100 * passed / total:.0f} %)")
    return 0 if passed == total else 1
