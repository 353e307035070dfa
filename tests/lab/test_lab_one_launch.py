"""The lab's one-launch prefill (mamba_edu/lab/one_launch.py): same results as the three kernels,
no deadlock when the grid does not fit on the GPU at once."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from mamba_edu import triton_interpreted
from mamba_edu.kernels import build_chunk_meta_with_indices, gdn_prefill
from mamba_edu.kernels.inputs import random_pool, random_prefill_inputs
from mamba_edu.lab.one_launch import prefill_one_launch
from mamba_edu.testing import rel_err
from _helpers import check_prefill_against_reference, draw_prefill_case

interpreted = pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")


def _run(inputs, lengths, slots, track, HV, K, V, chained, device="cpu", pool=None):
    meta, idx = build_chunk_meta_with_indices(lengths, device, state_indices=slots, track_slots=track[0],
                            track_chunks=track[1])
    pool = random_pool(len(lengths) * 2 + 1, HV, K, V, device=device) if pool is None else pool
    pool0 = pool.clone()
    if chained:
        o, ckpt = _one_launch(inputs, pool, meta, idx["state_indices"], output_checkpoints=True,
                              track_slots=idx["track_slots"], track_chunks=idx["track_chunks"])
    else:
        o, ckpt = gdn_prefill(**inputs, state_pool=pool, meta=meta, **idx, output_checkpoints=True,
                              impl="triton")
    return o, ckpt, pool, pool0, meta


def _one_launch(inputs, pool, meta, state_indices, **kw):
    """The lab's entry point takes checked inputs, as gdn_prefill passes them on."""
    q = inputs["q"]
    return prefill_one_launch(q, inputs["k"], inputs["v"], inputs["g"], inputs["beta"], pool,
                              state_indices, meta, q.shape[-1] ** -0.5, True, **kw)


@interpreted
@settings(max_examples=12, deadline=None)
@given(lengths=st.lists(st.integers(1, 140), min_size=1, max_size=4), data=st.data(),
       heads=st.sampled_from([(1, 1), (1, 2), (2, 4)]))
def test_one_launch_matches_the_reference(lengths, data, heads):
    """Any batch shape, tracking position (or none) and head grouping: outputs, checkpoints, final
    and tracked states equal the chunked reference; no other slot is written."""
    inputs, slots, track = draw_prefill_case(data, lengths, heads)
    o, ckpt, pool, pool0, meta = _run(inputs, lengths, slots, track, heads[1], 16, 32, True)
    check_prefill_against_reference(inputs, lengths, o, ckpt, pool, pool0, slots, track, meta)


def _gpu_inputs(lengths, H, HV, seed=0):
    return random_prefill_inputs(lengths, H, HV, 128, 128, dtype=torch.bfloat16, device="cuda",
                                 seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("lengths,heads", [([512], (2, 8)), ([256] * 16, (2, 8)),
                                           ([1, 63, 64, 65, 700, 2048], (4, 8)),
                                           ([2048] * 8, (16, 32))])
def test_one_launch_gpu_equals_the_three_kernels(lengths, heads):
    """bf16 on the GPU, the same outputs and states as the three kernels, twice. The last two shapes launch 960 and 16 896 programs, many times the
    H200's 132 SMs: waits that could deadlock would hang here."""
    H, HV = heads
    N = len(lengths)
    inputs = _gpu_inputs(lengths, H, HV)
    track = (list(range(N, 2 * N)), [min(1, -(-n // 64)) for n in lengths])
    base = random_pool(2 * N + 1, HV, 128, 128, device="cuda")
    runs = [_run(inputs, lengths, list(range(N)), track, HV, 128, 128, chained, "cuda",
                 base.clone()) for chained in (False, True, True)]
    torch.cuda.synchronize()
    o, ckpt, pool, _, _ = runs[0]
    for o2, ckpt2, pool2, _, meta in runs[1:]:
        assert rel_err(o2, o) <= 1e-3 and rel_err(ckpt2, ckpt) <= 1e-3
        assert rel_err(pool2, pool) <= 1e-3


@pytest.mark.gpu
def test_one_launch_gpu_reuses_its_metadata_in_a_graph():
    """A forward's layers share one metadata: 45 launches in a row, then three in a CUDA graph
    replayed twice, all equal to the first launch."""
    lengths, H, HV = [512], 2, 8
    inputs = _gpu_inputs(lengths, H, HV, seed=3)
    meta, idx = build_chunk_meta_with_indices(lengths, "cuda", state_indices=[0])
    pool = random_pool(2, HV, 128, 128, device="cuda")
    expected, _ = _one_launch(inputs, pool.clone(), meta, idx["state_indices"])
    for _ in range(45):
        o, _ = _one_launch(inputs, pool.clone(), meta, idx["state_indices"])
        assert torch.equal(o, expected)
    work = pool.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _one_launch(inputs, work.clone(), meta, idx["state_indices"])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [_one_launch(inputs, work, meta, idx["state_indices"])[0] for _ in range(3)]
    for _ in range(2):
        work.copy_(pool)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(outs[0], expected)
