"""Shared test setup: the Triton interpreter without a GPU, the ``gpu`` marker, seeded inputs."""

import pytest
import torch

import mamba_edu  # noqa: F401  (selects the Triton interpreter without a GPU, before any kernel import)

# The grader's hostile notebooks are inputs of tests/test_grader_hostile.py, never to be run by
# nbval: one loops forever, one kills its parent, one appends an always-pass check to the package.
collect_ignore = ["hostile_notebooks"]


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

