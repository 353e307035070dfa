"""Grading a submitted notebook: run it top to bottom in a fresh kernel, then grade its exercises.

:func:`execute_and_grade` runs the notebook in its own folder (a failing cell does not stop it),
then appends one cell that calls :func:`mamba_edu.exercises.core.grade_namespace` on the names
the notebook defined and reports the verdicts on a marked line. The grader calls the checks
itself, so an edited check cell changes nothing. ``python -m mamba_edu grade PATH`` is its
command line.

Grading runs the submitted code: run it where you would run the learner's notebook.
"""

from __future__ import annotations

import json
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
