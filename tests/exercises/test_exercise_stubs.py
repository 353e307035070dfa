"""Every Python exercise's check calls an untouched stub "not done", through the grader's path.

Notebook 03's stubs are Triton kernels with the exercise's signature: its own tests judge them.
"""

import pytest
from exercise_judge import judge_answer

import mamba_edu.exercises  # noqa: F401 - importing the checks fills the registry
from mamba_edu.exercises.core import NOT_DONE, REGISTRY

PYTHON_EXERCISES = [(nb, number) for nb in sorted(REGISTRY) if not nb.startswith("03_")
                    for number in sorted(REGISTRY[nb])]


def stub(*args):
    raise NotImplementedError("hint: …")


def test_the_registry_is_filled():
    # an import that registered nothing would leave the parametrised test below with no cases
    assert len(PYTHON_EXERCISES) >= 20


@pytest.mark.parametrize("notebook,number", PYTHON_EXERCISES)
def test_stub_is_not_done(notebook, number):
    assert judge_answer(notebook, number, stub).status == NOT_DONE
