"""python -m mamba_edu grade PATH: execute submitted notebooks and grade their exercises.

PATH is one notebook or a folder of them (not searched recursively). Each notebook runs top to
bottom in a fresh kernel in its own folder (a failing cell does not stop it); then, in the same
kernel, every exercise registered for that notebook is checked against the functions the
notebook defines. The grader calls the checks itself, so an edited check cell changes nothing.
One line per exercise, then the score. Exit status: 0 when every exercise passes, 1 when one
does not, 2 when PATH holds no notebook with registered exercises.

Grading runs the submitted code: run it where you would run the learner's notebook.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
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
    parser.add_argument("--timeout", type=positive_int, default=900, help="seconds one cell may run")
    args = parser.parse_args(argv)
    if missing := missing_modules():
        print(f"{parser.prog}: grading runs notebooks, which needs {', '.join(missing)}: "
              "pip install 'mamba_edu[grade]' (make setup installs them)", file=sys.stderr)
        return 2
    from mamba_edu.exercises import core
    from mamba_edu.exercises.grader import execute_and_grade, notebooks_in

    gradable = [p for p in notebooks_in(args.path) if p.stem in core.REGISTRY]
    if not gradable:
        print(f"{parser.prog}: no notebook with registered exercises at {args.path} "
              f"(expected names like {sorted(core.REGISTRY)[0]}.ipynb)", file=sys.stderr)
        return 2
    passed = total = 0
    for path in gradable:
        print(f"{path.name}", flush=True)
        for number, title, status, message in execute_and_grade(path, args.timeout):
            total += 1
            passed += status == core.PASS
            detail = f" — {message.removeprefix('FAIL ')}" if status == core.FAIL and message else ""
            print(f"  exercise {number} ({title}): {status}{detail}", flush=True)
    print(f"score: {passed}/{total} ({100 * passed / total:.0f} %)")
    return 0 if passed == total else 1
