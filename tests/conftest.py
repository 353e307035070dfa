"""Shared test setup: one torch thread, the Triton interpreter without a GPU, the ``gpu`` and
``solutions`` markers, seeded inputs."""

import os

# Tiny tensors gain nothing from intra-op threads, and on a loaded 2-core machine torch's thread
# pool oversubscribes the cores (one subset: 130 s with the default threads, 8 s with one).
os.environ["OMP_NUM_THREADS"] = "1"

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import mamba_edu  # noqa: E402,F401  (selects the Triton interpreter without a GPU, before any kernel import)

torch.set_num_threads(1)

SOLUTIONS = Path(__file__).resolve().parent.parent / "notebooks" / "solutions"

# The grader's hostile notebooks are inputs of tests/grading/test_grader_hostile.py, never to be run by
# nbval: one loops forever, one kills its parent, one appends an always-pass check to the package.
collect_ignore = ["hostile_notebooks"]


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    no_solutions = pytest.mark.skip(reason="needs notebooks/solutions/ (the instructor's copy; a "
                                           "learner copy is handed out without it)")
    for item in items:
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if item.get_closest_marker("solutions") and not SOLUTIONS.is_dir():
            item.add_marker(no_solutions)
