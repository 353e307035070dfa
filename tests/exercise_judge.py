"""Judge a test's answer through the grader's own path, without running a notebook.

The judge (:mod:`mamba_edu.grading.judge`) runs the notebook, then calls
:func:`~mamba_edu.grading.judge.judge_exercise` with the notebook's globals: each call of an
answer runs with its exercise's forbidden functions absent, and
:func:`mamba_edu.exercises.core.judge` gives the verdict. :func:`judge_answer` makes the same call
with the test's functions, so a wrong answer rejected here is rejected by the grader for the same
reason, including the forbidden call.
"""

from __future__ import annotations

from mamba_edu.exercises.core import Verdict, lookup
from mamba_edu.grading.judge import judge_exercise


def judge_answer(notebook: str, number: int, *functions) -> Verdict:
    """The verdict the grader gives exercise ``number`` of ``notebook`` for ``functions``."""
    ex = lookup(notebook, number)
    return judge_exercise(ex, dict(zip(ex.names, functions, strict=True)))
