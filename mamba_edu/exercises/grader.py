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
import json
import sys
from pathlib import Path

MARK = "@@mamba_edu-grade@@"

GRADING_CELL = f"""
import json as _json
import mamba_edu.exercises as _exercises
_verdicts = _exercises.core.grade_namespace({{notebook!r}}, globals())
print({MARK!r} + _json.dumps([[v.exercise.number, v.exercise.title, v.status, v.message] for v in _verdicts]))
"""


def notebooks_in(path: Path) -> list[Path]:
    """``path`` itself if it is a notebook, else the notebooks directly inside it, sorted."""
    if path.is_file():
        return [path] if path.suffix == ".ipynb" else []
    return sorted(path.glob("*.ipynb"))


def execute_and_grade(path: Path, timeout: int) -> list[tuple[int, str, str, str]]:
    """Run the notebook, then the grading cell; ``[(number, title, status, message), …]``."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(GRADING_CELL.format(notebook=path.stem)))
    NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent.resolve())}}).execute()
    for output in nb.cells[-1].outputs:
        for line in output.get("text", "").splitlines():
            if line.startswith(MARK):
                return [tuple(row) for row in json.loads(line[len(MARK):])]
    errors = [o for o in nb.cells[-1].outputs if o.output_type == "error"]
    reason = f"{errors[0].ename}: {errors[0].evalue}" if errors else "no output"
    raise RuntimeError(f"{path}: the grading cell did not report ({reason})")


def main(argv=None) -> int:
    from mamba_edu._cli import HelpFormatter, prog_name
    from mamba_edu.exercises import core

    parser = argparse.ArgumentParser(prog=f"{prog_name()} grade", description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("path", type=Path, help="a notebook (.ipynb) or a folder of notebooks")
    parser.add_argument("--timeout", type=int, default=900,
                        help="seconds one cell may run")
    args = parser.parse_args(argv)

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
            detail = f" — {message}" if status == core.FAIL else ""
            print(f"  exercise {number} ({title}): {status}{detail}", flush=True)
    print(f"score: {passed}/{total} ({100 * passed / total:.0f} %)")
    return 0 if passed == total else 1


if __name__ == "__main__":
    sys.exit(main())
