"""The lab's prefill with W and U formed in the scan (mamba_edu/lab/scan_builds_wu.py): the
reference's outputs, checkpoints, final and tracked states for any batch, and the three kernels'
results with the gating and the output norm inside."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from mamba_edu import triton_interpreted
from mamba_edu.kernels.inputs import random_pool, random_prefill_inputs
from mamba_edu.kernels.prefill import prefill_triton
from mamba_edu.lab.scan_builds_wu import prefill_scan_builds_wu
from mamba_edu.testing import rel_err
from _helpers import check_prefill_against_reference, draw_prefill_case, launch_prefill

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
    among them: the package's three kernels' outputs and states, the padded row's slot unwritten."""
    lengths, H, HV, K, V = [70, 1, 130], 2, 4, 16, 32
    T, N = sum(lengths), len(lengths)
    gen = torch.Generator().manual_seed(4)
    inputs = random_prefill_inputs(lengths, H, HV, K, V, dtype=dtype, seed=2)
    inputs["g"], inputs["beta"] = torch.randn(2, T, HV, generator=gen)  # raw a, b
    gating = (torch.rand(HV, generator=gen) * 2, torch.randn(HV, generator=gen))
    norm = (torch.randn(T, HV * V, generator=gen).to(dtype), torch.rand(V, generator=gen).to(dtype), 1e-6)
    track = (list(range(N, 2 * N)), [1, 0, 2])
    base = random_pool(2 * N + 1, HV, K, V)
    runs = []
    for fn in (prefill_triton, prefill_scan_builds_wu):
        pool = base.clone()
        runs.append((*launch_prefill(fn, inputs, pool, lengths, [0, -1, 2], track, gating=gating,
                                     output_norm=norm)[:2], pool))
    (o, ckpt, pool), (o2, ckpt2, pool2) = runs
    tol = 1e-5 if dtype == torch.float32 else 5e-3
    assert rel_err(o2.float(), o.float()) <= tol
    assert rel_err(ckpt2, ckpt) <= tol and rel_err(pool2, pool) <= tol
    assert torch.equal(pool2[1], base[1])  # the padded row's slot number, never written


@pytest.mark.gpu
@pytest.mark.parametrize("lengths,heads", [([512], (2, 8)), ([256] * 16, (2, 8)),
                                           ([1, 63, 64, 65, 700, 2048], (4, 8)),
                                           ([2048] * 4, (16, 32))])
def test_scan_builds_wu_gpu_equals_the_three_kernels(lengths, heads):
    """bf16 on the GPU: the three kernels' outputs and states."""
    H, HV = heads
    N = len(lengths)
    inputs = random_prefill_inputs(lengths, H, HV, 128, 128, dtype=torch.bfloat16, device="cuda")
    track = (list(range(N, 2 * N)), [min(1, -(-n // 64)) for n in lengths])
    base = random_pool(2 * N + 1, HV, 128, 128, device="cuda")
    runs = []
    for fn in (prefill_triton, prefill_scan_builds_wu):
        pool = base.clone()
        runs.append((*launch_prefill(fn, inputs, pool, lengths, list(range(N)), track)[:2], pool))
    torch.cuda.synchronize()
    (o, ckpt, pool), (o2, ckpt2, pool2) = runs
    assert rel_err(o2.float(), o.float()) <= 1e-2
    assert rel_err(ckpt2, ckpt) <= 1e-2 and rel_err(pool2, pool) <= 1e-2
