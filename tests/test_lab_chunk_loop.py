"""The lab's one-program-per-sequence prefill (mamba_edu/lab/chunk_loop.py): the reference's
outputs, checkpoints, final and tracked states for any batch, and the three kernels' results
with the gating and the output norm inside."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from mamba_edu import triton_interpreted
from mamba_edu.kernels.inputs import random_pool, random_prefill_inputs
from mamba_edu.kernels.prefill import prefill_triton
from mamba_edu.lab.chunk_loop import prefill_chunk_loop
from mamba_edu.testing import rel_err
from _helpers import check_prefill_against_reference, draw_prefill_case, launch_prefill as _launch

interpreted = pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")


@interpreted
@settings(max_examples=10, deadline=None)
@given(lengths=st.lists(st.integers(1, 140), min_size=1, max_size=3), data=st.data(),
       heads=st.sampled_from([(1, 1), (1, 2), (2, 4)]), block_v=st.sampled_from([None, 16]))
def test_chunk_loop_matches_the_reference(lengths, data, heads, block_v):
    """Any batch shape, tracking position (or none), head grouping and V-tile: outputs,
    checkpoints, final and tracked states equal the chunked reference; no other slot changes."""
    inputs, slots, track = draw_prefill_case(data, lengths, heads)
    pool0 = random_pool(2 * len(lengths) + 1, heads[1], 16, 32)
    pool = pool0.clone()
    o, ckpt, meta = _launch(prefill_chunk_loop, inputs, pool, lengths, slots, track, block_v=block_v)
    check_prefill_against_reference(inputs, lengths, o, ckpt, pool, pool0, slots, track, meta)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_chunk_loop_equals_the_three_kernels_with_gating_and_norm(dtype):
    """Raw gate projections and the gated output norm inside, fp32 and fp16: the package's three
    kernels' outputs and states."""
    lengths, H, HV, K, V = [70, 1, 130], 2, 4, 16, 32
    T, N = sum(lengths), len(lengths)
    gen = torch.Generator().manual_seed(4)
    inputs = random_prefill_inputs(lengths, H, HV, K, V, dtype=dtype, seed=2)
    inputs["g"], inputs["beta"] = torch.randn(2, T, HV, generator=gen)  # raw a, b
    gating = (torch.rand(HV, generator=gen) * 2, torch.randn(HV, generator=gen))
    norm = (torch.randn(T, HV * V, generator=gen).to(dtype), torch.rand(V, generator=gen).to(dtype), 1e-6)
    track = (list(range(N, 2 * N)), [1, 0, 2])
    runs = []
    for fn in (prefill_triton, prefill_chunk_loop):
        pool = random_pool(2 * N + 1, HV, K, V)
        runs.append((*_launch(fn, inputs, pool, lengths, list(range(N)), track, gating=gating,
                              output_norm=norm)[:2], pool))
    (o, ckpt, pool), (o2, ckpt2, pool2) = runs
    tol = 1e-5 if dtype == torch.float32 else 5e-3
    assert rel_err(o2.float(), o.float()) <= tol
    assert rel_err(ckpt2, ckpt) <= tol and rel_err(pool2, pool) <= tol


def test_the_output_norm_needs_the_whole_head():
    inputs = random_prefill_inputs([8], 1, 1, 16, 32)
    norm = (torch.randn(8, 32), torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="whole head"):
        _launch(prefill_chunk_loop, inputs, random_pool(3, 1, 16, 32), [8], [0], ([1], [0]),
                output_norm=norm, block_v=16)


@pytest.mark.gpu
@pytest.mark.parametrize("lengths,heads", [([512], (2, 8)), ([256] * 16, (2, 8)),
                                           ([1, 63, 64, 65, 700, 2048], (4, 8)),
                                           ([2048] * 4, (16, 32))])
def test_chunk_loop_gpu_equals_the_three_kernels(lengths, heads):
    """bf16 on the GPU: the three kernels' outputs and states."""
    H, HV = heads
    N = len(lengths)
    inputs = random_prefill_inputs(lengths, H, HV, 128, 128, dtype=torch.bfloat16, device="cuda")
    track = (list(range(N, 2 * N)), [min(1, -(-n // 64)) for n in lengths])
    base = random_pool(2 * N + 1, HV, 128, 128, device="cuda")
    runs = []
    for fn in (prefill_triton, prefill_chunk_loop):
        pool = base.clone()
        runs.append((*_launch(fn, inputs, pool, lengths, list(range(N)), track)[:2], pool))
    torch.cuda.synchronize()
    (o, ckpt, pool), (o2, ckpt2, pool2) = runs
    assert rel_err(o2.float(), o.float()) <= 1e-2
    assert rel_err(ckpt2, ckpt) <= 1e-2 and rel_err(pool2, pool) <= 1e-2
