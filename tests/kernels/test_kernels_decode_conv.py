"""Decode step and causal conv1d kernels (interpreter on CPU) vs the references, pools in place."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from mamba_edu.gdn import causal_conv1d, causal_conv1d_update, gdn_gating, recurrent_gated_delta_rule
from mamba_edu.kernels import build_chunk_meta, build_chunk_meta_with_indices, conv1d_decode, conv1d_prefill, gdn_decode, upload_indices
from mamba_edu import triton_interpreted
from mamba_edu.kernels.inputs import random_pool
from mamba_edu.testing import rel_err

IMPLS = [pytest.param("triton", marks=pytest.mark.skipif(
    not triton_interpreted(), reason="Triton on CPU tensors needs TRITON_INTERPRET=1")), "torch"]


def _decode_inputs(N, H, HV, K, V, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(N, H, K, generator=gen) for _ in range(2))
    v = torch.randn(N, HV, V, generator=gen)
    a, b = (torch.randn(N, HV, generator=gen) for _ in range(2))
    A_log = torch.empty(HV).uniform_(0, 2.77, generator=gen)
    dt_bias = torch.randn(HV, generator=gen)
    return q, k, v, a, b, A_log, dt_bias


@pytest.mark.parametrize("impl", IMPLS)
def test_decode_matches_recurrence(impl):
    N, H, HV, K, V = 4, 2, 4, 16, 32
    slots = [5, -1, 0, 3]  # row 1 is padding
    q, k, v, a, b, A_log, dt_bias = _decode_inputs(N, H, HV, K, V)
    pool = random_pool(6, HV, K, V)
    pool0 = pool.clone()
    o = gdn_decode(q, k, v, a, b, A_log, dt_bias, state_pool=pool,
                   state_indices=torch.tensor(slots), impl=impl)
    h0 = torch.stack([pool0[s] if s >= 0 else torch.zeros_like(pool0[0]) for s in slots])
    g, beta = gdn_gating(A_log, a, b, dt_bias)
    ref = recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                     cu_seqlens=list(range(N + 1)), use_qk_l2norm=True)
    assert rel_err(o, ref.o) <= 1e-4
    live = [n for n, s in enumerate(slots) if s >= 0]
    assert rel_err(pool[[slots[n] for n in live]], ref.final_state[live]) <= 1e-4
    assert torch.equal(pool[[1, 2, 4]], pool0[[1, 2, 4]])  # untouched slots, padding wrote nothing


def _conv_case(lengths, D=40, W=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lengths), D, generator=gen)
    weight = torch.randn(D, W, generator=gen)
    bias = torch.randn(D, generator=gen)
    return x, weight, bias


@pytest.mark.parametrize("impl", IMPLS)
def test_conv_prefill_matches_reference(impl):
    lengths = [1, 2, 63, 64, 65, 150]  # includes sequences shorter than W−1
    slots = [6, 1, 4, 0, 3, 7]
    x, weight, bias = _conv_case(lengths)
    pool = torch.randn(9, x.shape[1], 3)
    pool0 = pool.clone()
    meta, idx = build_chunk_meta_with_indices(lengths, "cpu", state_indices=slots)
    y = conv1d_prefill(x, weight, bias, conv_pool=pool, meta=meta, **idx, impl=impl)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    y_ref, finals = causal_conv1d(x, weight, bias, cu_seqlens=cu, initial_states=pool0[slots])
    assert rel_err(y, y_ref) <= 1e-5
    assert torch.equal(pool[slots], finals)
    assert torch.equal(pool[[2, 5, 8]], pool0[[2, 5, 8]])


# Tile shapes ``(num_warps, BD, CHANNELS_FIRST)``: the package's two launches and others, both
# grid orders.
LAUNCHES = [(4, 32, True), (4, 64, True), (4, 64, False), (8, 128, False), (16, 256, True)]


def _check_conv_launches(device, dtype, tol):
    """The prefill conv at several tile shapes against the reference: the kernel is correct for
    any channel block and grid order, not only for the one the package launches."""
    from mamba_edu.kernels.conv import NARROW_LAUNCH, WIDE_LAUNCH, conv1d_prefill_triton
    assert NARROW_LAUNCH in LAUNCHES and WIDE_LAUNCH in LAUNCHES
    lengths, slots = [1, 2, 63, 64, 65, 150], [6, 1, 4, 0, 3, -1]
    x, weight, bias = (t.to(device, dtype) for t in _conv_case(lengths, D=200))
    pool0 = torch.randn(9, 200, 3).to(device, dtype)
    meta, idx = build_chunk_meta_with_indices(lengths, device, state_indices=slots)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    init = torch.cat([pool0[slots[:-1]], torch.zeros_like(pool0[:1])]).float()
    y_ref, finals = causal_conv1d(x.float(), weight.float(), bias.float(), cu_seqlens=cu,
                                  initial_states=init)
    for launch in LAUNCHES:
        pool = pool0.clone()
        y = conv1d_prefill_triton(x, weight, bias, pool, idx["state_indices"], meta, True,
                                  launch=launch)
        assert rel_err(y, y_ref) <= tol, launch
        assert torch.equal(pool[slots[:-1]], finals[:-1].to(dtype)), launch
        assert torch.equal(pool[[2, 5, 7, 8]], pool0[[2, 5, 7, 8]]), launch


def test_conv_launch_follows_the_grid_size():
    """64 channels per program once that gives WIDE_FROM programs, else 32: Qwen3-Next's 8 × 1024
    tokens (8192 channels) take the wide launch, the Qwen3.5 tp8 slice's 1 × 512 (1536) and
    16 × 256 the narrow one."""
    from mamba_edu.kernels.conv import NARROW_LAUNCH, WIDE_FROM, WIDE_LAUNCH, conv_launch
    assert conv_launch(128, 8192) == WIDE_LAUNCH and conv_launch(8, 1536) == NARROW_LAUNCH
    assert conv_launch(64, 1536) == NARROW_LAUNCH
    assert conv_launch(WIDE_FROM // 2, 128) == WIDE_LAUNCH
    assert conv_launch(WIDE_FROM // 2 - 1, 128) == NARROW_LAUNCH


@pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
def test_conv_prefill_every_launch():
    _check_conv_launches("cpu", torch.float32, 1e-5)


@pytest.mark.gpu
def test_conv_prefill_every_launch_gpu_bf16():
    _check_conv_launches("cuda", torch.bfloat16, 1e-2)


def _check_tracked_windows(lengths, slots, track_slots, track_chunks, device, dtype, impl):
    """The ``fused`` strategy's conv snapshot: ``conv_pool[track_slots[n]]`` must equal the conv
    state after the first ``min(64·chunk, L)`` tokens, i.e. the final state of the reference run
    on that prefix alone; every other slot keeps its value or gets the final state."""
    x, weight, bias = (t.to(device, dtype) for t in _conv_case(lengths, D=72))
    pool0 = torch.randn(10, 72, 3).to(device, dtype)
    meta, idx = build_chunk_meta_with_indices(lengths, device, state_indices=slots, track_slots=track_slots,
                            track_chunks=track_chunks)
    pool = pool0.clone()
    conv1d_prefill(x, weight, bias, conv_pool=pool, meta=meta, **idx, impl=impl)
    starts = [sum(lengths[:n]) for n in range(len(lengths))]
    expected = pool0.clone()
    for n, (start, length) in enumerate(zip(starts, lengths)):
        state = pool0[slots[n]][None].float()
        _, final = causal_conv1d(x[start:start + length].float(), weight.float(), bias.float(),
                                 initial_states=state)
        expected[slots[n]] = final[0].to(dtype)
        end = min(64 * track_chunks[n], length)
        if track_chunks[n] >= 0:
            expected[track_slots[n]] = (pool0[slots[n]] if end == 0 else causal_conv1d(
                x[start:start + end].float(), weight.float(), bias.float(),
                initial_states=state)[1][0].to(dtype))
    assert torch.equal(pool, expected)


@pytest.mark.parametrize("impl", IMPLS)
def test_conv_prefill_saves_tracked_windows(impl):
    # windows at token 0 (the old state), 64 = L (the final state), 128 < L, and past L (final)
    _check_tracked_windows([2, 63, 64, 130, 150], [6, 1, 4, 0, 3], [8, -1, 2, 5, 7],
                           [0, -1, 1, 2, 3], "cpu", torch.float32, impl)


@pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
@settings(max_examples=8, deadline=None)
@given(st.lists(st.integers(1, 140), min_size=1, max_size=4), st.data())
def test_conv_prefill_tracked_windows_property(lengths, data):
    """Any batch shape and any tracked chunk boundary (or none) per sequence, in the kernel."""
    n = len(lengths)
    chunks = [data.draw(st.integers(-1, -(-length // 64))) for length in lengths]
    slots = list(range(n))
    track_slots = [n + i if c >= 0 else -1 for i, c in enumerate(chunks)]
    _check_tracked_windows(lengths, slots, track_slots, chunks, "cpu", torch.float32, "triton")


@pytest.mark.gpu
def test_conv_prefill_saves_tracked_windows_gpu_bf16():
    _check_tracked_windows([2, 63, 64, 130, 150], [6, 1, 4, 0, 3], [8, -1, 2, 5, 7],
                           [0, -1, 1, 2, 3], "cuda", torch.bfloat16, "triton")


@pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
def test_conv_prefill_continues_a_prefix():
    """Run a sequence in two pieces through the pool; equal to running it whole."""
    x, weight, bias = _conv_case([100], D=24, seed=2)
    whole, _ = causal_conv1d(x, weight, bias)
    pool = torch.zeros(2, 24, 3)
    first = conv1d_prefill(x[:70], weight, bias, conv_pool=pool,
                           meta=build_chunk_meta([70], "cpu"), state_indices=[1], impl="triton")
    second = conv1d_prefill(x[70:], weight, bias, conv_pool=pool,
                            meta=build_chunk_meta([30], "cpu"), state_indices=[1], impl="triton")
    assert rel_err(torch.cat([first, second]), whole) <= 1e-6


@pytest.mark.parametrize("impl", IMPLS)
def test_conv_decode_matches_reference(impl):
    x, weight, bias = _conv_case([5], D=40, seed=3)
    slots = [2, -1, 0, 4, 1]
    pool = torch.randn(6, 40, 3)
    pool0 = pool.clone()
    y = conv1d_decode(x, weight, bias, conv_pool=pool, state_indices=torch.tensor(slots),
                      impl=impl)
    state = torch.stack([pool0[s] if s >= 0 else torch.zeros(40, 3) for s in slots])
    y_ref, new_state = causal_conv1d_update(x, state, weight, bias)
    assert rel_err(y, y_ref) <= 1e-5
    live = [n for n, s in enumerate(slots) if s >= 0]
    assert torch.equal(pool[[slots[n] for n in live]], new_state[live])
    assert torch.equal(pool[3], pool0[3]) and torch.equal(pool[5], pool0[5])


# ---- GPU --------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_decode_gpu_bf16_and_sync_free():
    N, H, HV, K, V = 64, 16, 32, 128, 128
    slots = list(range(1, N)) + [-1]
    args = [t.cuda() for t in _decode_inputs(N, H, HV, K, V)]
    args[:3] = [t.bfloat16() for t in args[:3]]
    pool = random_pool(N + 1, HV, K, V, device="cuda")
    pool0 = pool.clone()
    idx = upload_indices(slots, "cuda")
    o = gdn_decode(*args, state_pool=pool, state_indices=idx)
    torch.cuda.synchronize()
    ref_pool = pool0.clone()
    ref = gdn_decode(*[t.float().cpu() for t in args], state_pool=ref_pool.cpu(),
                     state_indices=torch.tensor(slots), impl="torch")
    assert rel_err(o, ref) <= 5e-3
    torch.cuda.set_sync_debug_mode("error")
    try:
        gdn_decode(*args, state_pool=pool, state_indices=idx)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.gpu
def test_conv_gpu_sync_free_and_graph_replay():
    lengths = [3, 64, 200]
    x, weight, bias = (t.cuda().bfloat16() for t in _conv_case(lengths, D=512))
    pool = torch.randn(4, 512, 3, device="cuda", dtype=torch.bfloat16)
    meta, idx = build_chunk_meta_with_indices(lengths, "cuda", state_indices=[3, 0, 2])
    eager_pool = pool.clone()
    y_eager = conv1d_prefill(x, weight, bias, conv_pool=eager_pool, meta=meta, **idx)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        conv1d_prefill(x, weight, bias, conv_pool=pool.clone(), meta=meta, **idx)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    work = pool.clone()
    with torch.cuda.graph(graph):
        y_graph = conv1d_prefill(x, weight, bias, conv_pool=work, meta=meta, **idx)
    work.copy_(pool)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y_graph, y_eager) and torch.equal(work, eager_pool)
