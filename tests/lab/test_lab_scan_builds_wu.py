"""The lab's prefill with W and U formed in the scan (mamba_edu/lab/scan_builds_wu.py): the
reference's outputs, checkpoints, final and tracked states for any batch, and the three kernels'
results with the gating and the output norm inside."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from mamba_edu import triton_interpreted
from mamba_edu.kernels.inputs import random_pool
from mamba_edu.lab.scan_builds_wu import prefill_scan_builds_wu
from _helpers import (check_prefill_against_reference, compare_with_three_kernels,
                      compare_with_three_kernels_on_gpu, draw_prefill_case, launch_prefill)

interpreted = pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")


@interpreted
@settings(max_examples=8, deadline=None)
@given(lengths=st.lists(st.integers(1, 140), min_size=1, max_size=3), data=st.data(),
       heads=st.sampled_from([(1, 1), (1, 2), (2, 4)]))
def test_scan_builds_wu_matches_the_reference(lengths, data, heads):
    """Any batch shape, tracking position (or none) and head grouping: outputs, checkpoints,
    final and tracked states equal the chunked reference; no other slot changes."""
    inputs, slots, track = draw_prefill_case(data, lengths, heads)
    pool0 = random_pool(2 * len(lengths) + 1, heads[1], 16, 32)
    pool = pool0.clone()
    o, ckpt, meta = launch_prefill(prefill_scan_builds_wu, inputs, pool, lengths, slots, track)
    check_prefill_against_reference(inputs, lengths, o, ckpt, pool, pool0, slots, track, meta)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_scan_builds_wu_equals_the_three_kernels_with_gating_and_norm(dtype):
    """Raw gate projections and the gated output norm, fp32 and fp16, a padded row (slot −1)
    among them: the package's three kernels' outputs and states, slot 1 (no row's) unwritten."""
    before, after = compare_with_three_kernels(prefill_scan_builds_wu, dtype, slots=(0, -1, 2))
    assert torch.equal(after[1], before[1])


@pytest.mark.gpu
@pytest.mark.parametrize("lengths,heads", [([512], (2, 8)), ([256] * 16, (2, 8)),
                                           ([1, 63, 64, 65, 700, 2048], (4, 8)),
                                           ([2048] * 4, (16, 32))])
def test_scan_builds_wu_gpu_equals_the_three_kernels(lengths, heads):
    """bf16 on the GPU: the three kernels' outputs and states."""
    compare_with_three_kernels_on_gpu(prefill_scan_builds_wu, lengths, heads)
