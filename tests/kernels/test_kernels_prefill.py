"""Triton chunked prefill (interpreter on CPU) and the torch path vs the chunked reference."""

import pytest
import torch
import triton
import triton.language as tl

from mamba_edu import triton_interpreted
from mamba_edu.gdn import chunk_gated_delta_rule, cu_offsets, gdn_gating, recurrent_gated_delta_rule
from mamba_edu.kernels import build_chunk_meta, build_chunk_meta_with_indices, gdn_prefill
from mamba_edu.kernels.fused_ops import gated_rms_norm
from mamba_edu.kernels.prefill import invert_unit_lower
from mamba_edu.kernels.inputs import random_pool, random_prefill_inputs
from mamba_edu.testing import rel_err

LENGTHS = [1, 63, 64, 65, 150]    # single token, chunk edges, and > 2 chunks
STATE_SLOTS = [3, 0, 7, 5, 10]    # scattered working slots
TRACK_SLOTS = [1, 2, 4, 6, 8]
TRACK_CHUNKS = [1, -1, 1, 0, 2]   # final state, none, final state, initial state, checkpoint h[2]
H, HV, K, V = 2, 4, 16, 32        # grouped value heads: 2 value heads per key head
SLOTS = 12

# Triton on CPU tensors runs in the interpreter; a GPU machine runs the gpu tests instead.
interpreted = pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")


def _reference(inputs, pool0, lengths, slots, checkpoints=True):
    return chunk_gated_delta_rule(**inputs, initial_state=pool0[slots], cu_seqlens=cu_offsets(lengths),
                                  use_qk_l2norm=True, output_checkpoints=checkpoints)


def _tracked_state(ref, meta, n, chunk):
    return ref.final_state[n] if chunk == meta.counts[n] else ref.checkpoints[meta.offsets[n] + chunk]


@pytest.mark.parametrize("impl", [pytest.param("triton", marks=interpreted), "torch"])
def test_prefill_matches_reference(impl):
    inputs = random_prefill_inputs(LENGTHS, H, HV, K, V, seed=0)
    pool = random_pool(SLOTS, HV, K, V)
    pool0 = pool.clone()
    meta, idx = build_chunk_meta_with_indices(LENGTHS, "cpu", state_indices=STATE_SLOTS, track_slots=TRACK_SLOTS,
                            track_chunks=TRACK_CHUNKS)
    o, ckpt = gdn_prefill(**inputs, state_pool=pool, meta=meta, **idx, output_checkpoints=True,
                          impl=impl)
    ref = _reference(inputs, pool0, LENGTHS, STATE_SLOTS)
    assert rel_err(o, ref.o) <= 1e-4
    assert rel_err(ckpt, ref.checkpoints) <= 1e-4
    assert rel_err(pool[STATE_SLOTS], ref.final_state) <= 1e-4
    for n, (slot, chunk) in enumerate(zip(TRACK_SLOTS, TRACK_CHUNKS)):
        expected = pool0[slot] if chunk < 0 else _tracked_state(ref, meta, n, chunk)
        assert rel_err(pool[slot], expected) <= 1e-4, (n, slot, chunk)
    untouched = sorted(set(range(SLOTS)) - set(STATE_SLOTS) - set(TRACK_SLOTS))
    assert torch.equal(pool[untouched], pool0[untouched])


@interpreted
@pytest.mark.parametrize("gating", ["g", "raw"])
def test_prefill_with_infinite_decay_matches_the_recurrence(gating):
    """B5: g = −inf (the state wiped at that token), or A_log = 100 with the raw gating (exp
    overflows; with a softplus that underflowed, inf · 0): the Triton prefill stays finite and
    matches the token-by-token recurrence."""
    lengths, slots = [70, 5], [1, 0]
    x = random_prefill_inputs(lengths, 1, 2, 16, 16, seed=5)
    T = sum(lengths)
    if gating == "g":
        g = x["g"].clone()
        g[3, 0] = g[66, 1] = g[71, 0] = float("-inf")
        gates, ref_g, ref_beta = dict(g=g, beta=x["beta"]), g, x["beta"]
    else:
        gen = torch.Generator().manual_seed(6)
        a, b = torch.randn(T, 2, generator=gen), torch.randn(T, 2, generator=gen)
        a[10, 0] = a[72, 0] = -200.0  # softplus underflows to 0
        A_log, dt_bias = torch.tensor([100.0, 0.0]), torch.zeros(2)
        gates = dict(a=a, b=b, A_log=A_log, dt_bias=dt_bias)
        ref_g, ref_beta = gdn_gating(A_log, a, b, dt_bias)
    pool = random_pool(2, 2, 16, 16)
    pool0 = pool.clone()
    meta, idx = build_chunk_meta_with_indices(lengths, "cpu", state_indices=slots)
    o, _ = gdn_prefill(x["q"], x["k"], x["v"], **gates, state_pool=pool, meta=meta, **idx, impl="triton")
    ref = recurrent_gated_delta_rule(x["q"], x["k"], x["v"], ref_g, ref_beta, initial_state=pool0[slots],
                                     cu_seqlens=cu_offsets(lengths), use_qk_l2norm=True)
    assert torch.isfinite(o).all() and torch.isfinite(pool).all()
    assert rel_err(o, ref.o) <= 1e-4
    assert rel_err(pool[slots], ref.final_state) <= 1e-4


@interpreted
def test_prefill_one_sequence_no_extras_mha():
    """H == HV, one sequence, no checkpoints, no tracking, plain index tensor on CPU."""
    lengths = [130]
    inputs = random_prefill_inputs(lengths, 2, 2, 32, 16, seed=3)
    pool = random_pool(3, 2, 32, 16)
    pool0 = pool.clone()
    meta = build_chunk_meta(lengths, "cpu")
    o, ckpt = gdn_prefill(**inputs, state_pool=pool, state_indices=torch.tensor([2]), meta=meta,
                          impl="triton")
    ref = _reference(inputs, pool0, lengths, [2], checkpoints=False)
    assert ckpt is None
    assert rel_err(o, ref.o) <= 1e-4
    assert rel_err(pool[2], ref.final_state[0]) <= 1e-4
    assert torch.equal(pool[:2], pool0[:2])


@interpreted
def test_prefill_fp16_inputs_interpreter():
    inputs = random_prefill_inputs([70, 5], 1, 2, 16, 16, dtype=torch.float16, seed=4)
    pool = random_pool(2, 2, 16, 16)
    pool0 = pool.clone()
    meta, idx = build_chunk_meta_with_indices([70, 5], "cpu", state_indices=[1, 0])
    o, _ = gdn_prefill(**inputs, state_pool=pool, meta=meta, **idx, impl="triton")
    ref = _reference(inputs, pool0, [70, 5], [1, 0], checkpoints=False)
    assert o.dtype == torch.float16
    assert rel_err(o, ref.o) <= 5e-3
    assert rel_err(pool[[1, 0]], ref.final_state) <= 5e-3


@interpreted
def test_prefill_without_qk_l2norm():
    """Keys used as given (here normalised by the caller), a non-default scale."""
    lengths = [70, 9]
    inputs = random_prefill_inputs(lengths, 1, 2, 16, 16, seed=6)
    inputs["q"], inputs["k"] = (torch.nn.functional.normalize(inputs[n], dim=-1) for n in "qk")
    pool = random_pool(2, 2, 16, 16)
    pool0 = pool.clone()
    meta, idx = build_chunk_meta_with_indices(lengths, "cpu", state_indices=[1, 0])
    o, _ = gdn_prefill(**inputs, state_pool=pool, meta=meta, **idx, scale=0.3, use_qk_l2norm=False,
                       impl="triton")
    cu = [0, 70, 79]
    ref = chunk_gated_delta_rule(**inputs, scale=0.3, initial_state=pool0[[1, 0]], cu_seqlens=cu,
                                 use_qk_l2norm=False)
    assert rel_err(o, ref.o) <= 1e-4
    assert rel_err(pool[[1, 0]], ref.final_state) <= 1e-4


def _output_norm(T, HV, V, *, dtype=torch.float32, device="cpu", seed=7):
    """``output_norm = (z, weight, eps)``: ``z [T, HV·V]`` a column slice of a wider matrix (row
    stride ``HV·V + 5``, as the in-projection gives it), ``weight [V]`` around 1."""
    gen = torch.Generator().manual_seed(seed)
    wide = torch.randn(T, HV * V + 5, generator=gen).to(device, dtype)
    weight = (1 + 0.5 * torch.randn(V, generator=gen)).to(device, dtype)
    return wide[:, 2:2 + HV * V], weight, 1e-6


@interpreted
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("dims", [(1, 2, 16, 16), (2, 4, 32, 32)])
def test_output_norm_in_the_output_kernel_matches_the_separate_norm(dims, dtype, tol):
    """``output_norm`` = the prefill, then ``gated_rms_norm`` (both Triton), up to the rounding of
    o that the separate norm reads (the kernel norms the fp32 o); the pool ends the same."""
    Hd, HVd, Kd, Vd = dims
    lengths, slots = [1, 65, 70], [3, 0, 2]
    inputs = random_prefill_inputs(lengths, Hd, HVd, Kd, Vd, dtype=dtype, seed=8)
    z, weight, eps = _output_norm(sum(lengths), HVd, Vd, dtype=dtype)
    assert not z.is_contiguous()
    meta, idx = build_chunk_meta_with_indices(lengths, "cpu", state_indices=slots, track_slots=[1, 4, 5],
                            track_chunks=[1, 0, 1])
    pool, pool_fused = random_pool(6, HVd, Kd, Vd), random_pool(6, HVd, Kd, Vd)
    o, _ = gdn_prefill(**inputs, state_pool=pool, meta=meta, **idx, impl="triton")
    fused, _ = gdn_prefill(**inputs, state_pool=pool_fused, meta=meta, **idx, impl="triton",
                           output_norm=(z, weight, eps))
    assert fused.dtype == dtype and fused.shape == o.shape
    assert rel_err(fused, gated_rms_norm(o, z, weight, eps, impl="triton")) <= tol
    assert torch.equal(pool_fused, pool)


def test_output_norm_on_the_torch_path_is_the_separate_norm_bit_for_bit():
    inputs = random_prefill_inputs(LENGTHS, H, HV, K, V, seed=0)
    z, weight, eps = _output_norm(sum(LENGTHS), HV, V)
    outs = []
    for norm in (None, (z, weight, eps)):
        meta, idx = build_chunk_meta_with_indices(LENGTHS, "cpu", state_indices=STATE_SLOTS, track_slots=TRACK_SLOTS,
                                track_chunks=TRACK_CHUNKS)
        o, _ = gdn_prefill(**inputs, state_pool=random_pool(SLOTS, HV, K, V), meta=meta, **idx,
                           output_norm=norm, impl="torch")
        outs.append(o)
    assert torch.equal(outs[1], gated_rms_norm(outs[0], z, weight, eps, impl="torch"))


@interpreted
def test_output_norm_where_the_output_kernel_splits_heads_is_the_separate_norm():
    """V = 128 with few chunks: the output kernel takes 64-wide V-tiles, so the norm (which sums
    over the whole head) runs as its own kernel after it: exactly prefill + ``gated_rms_norm``."""
    lengths = [70]
    inputs = random_prefill_inputs(lengths, 1, 1, 16, 128, seed=10)
    norm = _output_norm(70, 1, 128)
    outs = []
    for output_norm in (None, norm):
        meta, idx = build_chunk_meta_with_indices(lengths, "cpu", state_indices=[0])
        outs.append(gdn_prefill(**inputs, state_pool=random_pool(1, 1, 16, 128), meta=meta, **idx,
                                output_norm=output_norm, impl="triton")[0])
    assert torch.equal(outs[1], gated_rms_norm(outs[0], *norm, impl="triton"))


@triton.jit
def invert_kernel(L_ptr, T_ptr, C: tl.constexpr, FP16: tl.constexpr):
    r = tl.arange(0, C)
    offs = r[:, None] * C + r[None, :]
    tl.store(T_ptr + offs, invert_unit_lower(tl.load(L_ptr + offs), C, FP16))


def _correlated_inverse_error(C, device, fp16=False):
    """Relative error of ``invert_unit_lower`` where a power series would blow up: nearly equal
    keys, β = 0.99 and no decay make L almost all ones below the diagonal."""
    gen = torch.Generator().manual_seed(2)
    k = torch.nn.functional.normalize(1.0 + 0.01 * torch.randn(C, 8, generator=gen), dim=-1)
    L = (0.99 * k @ k.T).tril(-1)
    T = torch.empty(C, C, device=device)
    invert_kernel[(1,)](L.to(device), T, C, fp16)
    expected = torch.linalg.inv(torch.eye(C, dtype=torch.float64) + L.double())
    return rel_err(T, expected)


@interpreted
@pytest.mark.parametrize("C", [16, 32, 64])
def test_invert_unit_lower_correlated_keys(C):
    assert _correlated_inverse_error(C, "cpu") <= 1e-5


# ---- GPU --------------------------------------------------------------------------------------

GPU_LENGTHS = [1, 63, 64, 65, 700, 1500]


def _gpu_case(dtype, seed=0, dims=(4, 8, 128, 128)):
    Hg, HVg, Kg, Vg = dims
    inputs = random_prefill_inputs(GPU_LENGTHS, Hg, HVg, Kg, Vg, dtype=dtype, device="cuda",
                                   seed=seed)
    pool = random_pool(16, HVg, Kg, Vg, device="cuda")
    meta, idx = build_chunk_meta_with_indices(GPU_LENGTHS, "cuda", state_indices=[9, 2, 14, 0, 5, 11],
                            track_slots=[1, 3, 4, 6, 7, 8], track_chunks=[1, 0, 1, 2, 5, 23])
    return inputs, pool, meta, idx


@pytest.mark.gpu
def test_invert_unit_lower_gpu_tf32():
    assert _correlated_inverse_error(64, "cuda") <= 2e-3  # fp32 dots run as tf32 on a GPU


@pytest.mark.parametrize("device", [
    pytest.param("cpu", marks=interpreted),
    pytest.param("cuda", marks=pytest.mark.gpu)])
def test_invert_unit_lower_fp16_products(device):
    """The prepare kernel's path for 16-bit inputs: products on fp16 operands, X kept in fp32,
    as accurate as tf32 (a torch model of the rounding: 3e-4 for both; bf16 operands: 1.4e-3)."""
    assert _correlated_inverse_error(64, device, fp16=True) <= 1e-3


# Small head dims once gave NaNs (K=16, V=32) and an illegal address (K=V=32) in bf16: Triton 3.6
# miscompiled the old prepare kernel's 64-row products with a 16- or 32-wide operand at 4 warps
# (data/benchmarks/small_head_dims.md).
@pytest.mark.gpu
@pytest.mark.parametrize("dims", [(4, 8, 128, 128), (2, 4, 16, 32), (2, 4, 32, 32)])
def test_prefill_gpu_bf16_close_to_fp32_reference(dims):
    inputs, pool, meta, idx = _gpu_case(torch.bfloat16, dims=dims)
    pool0 = pool.clone()
    o, ckpt = gdn_prefill(**inputs, state_pool=pool, meta=meta, **idx, output_checkpoints=True)
    ref = _reference({n: t.float() for n, t in inputs.items()}, pool0, GPU_LENGTHS,
                     [9, 2, 14, 0, 5, 11])
    assert rel_err(o, ref.o) <= 5e-3
    assert rel_err(ckpt, ref.checkpoints) <= 5e-3
    assert rel_err(pool[[9, 2, 14, 0, 5, 11]], ref.final_state) <= 5e-3
    for n, (slot, chunk) in enumerate(zip([1, 3, 4, 6, 7, 8], [1, 0, 1, 2, 5, 23])):
        assert rel_err(pool[slot], _tracked_state(ref, meta, n, chunk)) <= 5e-3


@pytest.mark.gpu
def test_prefill_gpu_is_sync_free():
    inputs, pool, meta, idx = _gpu_case(torch.bfloat16)
    for checkpoints in (False, True):  # compile and autotune first (h is fp32 with checkpoints)
        gdn_prefill(**inputs, state_pool=pool, meta=meta, **idx, output_checkpoints=checkpoints)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        meta2, idx2 = build_chunk_meta_with_indices(GPU_LENGTHS, "cuda", state_indices=[9, 2, 14, 0, 5, 11],
                                 track_slots=[1, 3, 4, 6, 7, 8], track_chunks=[1, 0, 1, 2, 5, 23])
        gdn_prefill(**inputs, state_pool=pool, meta=meta2, **idx2, output_checkpoints=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_prefill_gpu_graph_replay_equals_eager():
    inputs, pool, meta, idx = _gpu_case(torch.bfloat16, seed=5)
    pool_eager = pool.clone()
    o_eager, _ = gdn_prefill(**inputs, state_pool=pool_eager, meta=meta, **idx)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on the capture stream
        gdn_prefill(**inputs, state_pool=pool.clone(), meta=meta, **idx)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, _ = gdn_prefill(**inputs, state_pool=pool, meta=meta, **idx)
    pool.copy_(random_pool(16, 8, 128, 128, device="cuda"))  # the graph reads the pool anew
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_graph, o_eager)
    assert torch.equal(pool, pool_eager)


@pytest.mark.gpu
def test_output_norm_gpu_bf16_matches_the_separate_norm():
    """One 512-token prompt at the Qwen3.5 tp8 slice (H = 2, HV = 8, K = V = 128) in bf16: the
    norm of the fp32 output in the output kernel vs the norm kernel on the bf16 output."""
    inputs = random_prefill_inputs([512], 2, 8, 128, 128, dtype=torch.bfloat16, device="cuda",
                                   seed=10)
    z, weight, eps = _output_norm(512, 8, 128, dtype=torch.bfloat16, device="cuda")
    pool = random_pool(1, 8, 128, 128, device="cuda")
    meta, idx = build_chunk_meta_with_indices([512], "cuda", state_indices=[0])
    o, _ = gdn_prefill(**inputs, state_pool=pool.clone(), meta=meta, **idx)
    fused, _ = gdn_prefill(**inputs, state_pool=pool.clone(), meta=meta, **idx,
                           output_norm=(z, weight, eps))
    assert fused.dtype == torch.bfloat16
    assert rel_err(fused, gated_rms_norm(o, z, weight, eps)) <= 1e-2


def test_scan_tile_follows_the_number_of_chains():
    """The scan narrows its V-tile until it has SCAN_PROGRAMS programs: one 512-token prompt at
    the Qwen3.5 tp8 slice (N·HV = 8) gets 16-wide tiles, one long prompt at Qwen3-Next's heads
    (N·HV = 32) 32-wide ones, eight prompts (N·HV = 256) 64-wide ones; never wider than the
    head's tile."""
    from mamba_edu.kernels.prefill import SCAN_PROGRAMS, scan_config
    assert SCAN_PROGRAMS == 128
    assert scan_config(1 * 8, 128) == (16, 4, 3) and scan_config(1, 128)[0] == 16
    assert scan_config(1 * 32, 128) == (32, 4, 3) and scan_config(63, 128)[0] == 32
    assert scan_config(8 * 32, 128) == (64, 4, 2) and scan_config(64, 128)[0] == 64
    assert scan_config(256, 32) == (64, 4, 2)  # V = 32 fits one 64-wide (masked) tile
