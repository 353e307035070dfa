"""Shared test setup: the Triton interpreter without a GPU, the ``gpu`` marker, seeded inputs."""

import pytest
import torch

import mamba_edu  # noqa: F401  (selects the Triton interpreter without a GPU, before any kernel import)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=["in_scan", "separate", "chained"])
def output_path(request):
    """Run the Triton prefill three ways: the output computed inside the scan, by its own kernel
    (the default), and the three stages in one launch."""
    from mamba_edu.kernels.chained import forced_chained
    from mamba_edu.kernels.prefill import forced_output_path
    with forced_output_path(request.param == "in_scan"), forced_chained(request.param == "chained"):
        yield request.param
