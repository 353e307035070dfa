"""``gdn_layer_prefill``: one layer's conv and prefill in one call, the conv inside the kernels.

It must give what the two calls give (``conv1d_prefill``, then ``gdn_prefill`` on the split
output): the same output, checkpoints, conv and SSM states, tracked snapshots of both, and no
other slot touched. In the kernels the conv is the same code on the same values, so on fp32
inputs (the interpreter) and on bf16 (the GPU) the results are equal bit for bit.
"""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from mamba_edu import triton_interpreted
from mamba_edu.kernels import (build_chunk_meta, conv1d_prefill, gdn_layer_prefill, gdn_prefill,
                               split_qkv)
from mamba_edu.kernels import prefill as prefill_module
from mamba_edu.kernels.inputs import random_pool

BACKENDS = [pytest.param("triton", marks=pytest.mark.skipif(
    not triton_interpreted(), reason="Triton on CPU tensors needs TRITON_INTERPRET=1")), "torch"]
W = 4


def _layer_case(lengths, heads, slots, track_slots, track_chunks, *, device="cpu",
                dtype=torch.float32, seed=0):
    """The projection's views ``x [T, D]``, ``a, b [T, HV]``, the layer's weights, both pools
    (random, one spare slot more than the batch uses) and the metadata."""
    H, K, HV, V = heads
    T, D = sum(lengths), 2 * H * K + HV * V
    gen = torch.Generator().manual_seed(seed)
    proj = torch.randn(T, D + 2 * HV + 3, generator=gen).to(device, dtype)
    slots_n = max(slots + track_slots) + 2
    used = set(slots) | {s for s, c in zip(track_slots, track_chunks) if c >= 0}
    return dict(
        x=proj[:, :D], a=proj[:, D:D + HV], b=proj[:, D + HV:D + 2 * HV],
        conv_weight=(0.5 * torch.randn(D, W, generator=gen)).to(device, dtype),
        conv_bias=(0.1 * torch.randn(D, generator=gen)).to(device, dtype),
        A_log=torch.empty(HV).uniform_(0.0, 2.77, generator=gen).to(device),
        dt_bias=torch.randn(HV, generator=gen).to(device),
        conv_pool=torch.randn(slots_n, D, W - 1, generator=gen).to(device, dtype),
        state_pool=random_pool(slots_n, HV, K, V, device=device, seed=seed + 1),
        meta=build_chunk_meta(lengths, device, state_indices=slots, track_slots=track_slots,
                              track_chunks=track_chunks),
        untouched=[s for s in range(slots_n) if s not in used])


def _both_ways(case, heads, backend):
    """``(layer call, two calls)``, each ``(o, checkpoints, conv_pool, state_pool)``."""
    c = dict(case)
    weights = dict(a=c["a"], b=c["b"], A_log=c["A_log"], dt_bias=c["dt_bias"], meta=c["meta"],
                   output_checkpoints=True, backend=backend)
    pools = [(c["conv_pool"].clone(), c["state_pool"].clone()) for _ in range(2)]
    o, ckpt = gdn_layer_prefill(c["x"], c["conv_weight"], c["conv_bias"], heads=heads,
                                conv_pool=pools[0][0], state_pool=pools[0][1], **weights)
    y = conv1d_prefill(c["x"], c["conv_weight"], c["conv_bias"], conv_pool=pools[1][0],
                       meta=c["meta"], backend=backend)
    o2, ckpt2 = gdn_prefill(*split_qkv(y, heads), state_pool=pools[1][1], **weights)
    return (o, ckpt, *pools[0]), (o2, ckpt2, *pools[1])


def _assert_equal_ways(case, heads, backend):
    layer, two_calls = _both_ways(case, heads, backend)
    for name, got, want in zip(("o", "checkpoints", "conv_pool", "state_pool"), layer, two_calls):
        assert torch.equal(got, want), f"{name} differs: max {(got - want).abs().max().item()}"
    for pool, original in zip(layer[2:], (case["conv_pool"], case["state_pool"])):
        assert torch.equal(pool[case["untouched"]], original[case["untouched"]])


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_prefill_equals_conv_then_prefill(backend, output_path):
    """Lengths below the conv width (the new state mixes old state and tokens), one chunk and
    several; tracked windows at 64 and 128 tokens and none."""
    heads = (1, 16, 2, 16)
    case = _layer_case([2, 70, 140], heads, [4, 0, 2], [1, 3, 5], [-1, 1, 2])
    _assert_equal_ways(case, heads, backend)


@pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
def test_layer_prefill_with_few_scan_programs(monkeypatch):
    """One scan program per value head: each writes the conv states of more channels than one
    block of them (96 channels, blocks of 64)."""
    monkeypatch.setattr(prefill_module, "SCAN_PROGRAMS", 1)
    heads = (1, 32, 1, 32)
    case = _layer_case([3, 100], heads, [1, 2], [0, 3], [1, 2])
    _assert_equal_ways(case, heads, "triton")


@pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
@settings(max_examples=6, deadline=None)
@given(st.lists(st.integers(1, 140), min_size=1, max_size=3), st.data())
def test_layer_prefill_property(lengths, data):
    """Any batch shape, slot order and tracked chunk boundary (or none) per sequence."""
    n = len(lengths)
    slots = data.draw(st.permutations(range(n)))
    chunks = [data.draw(st.integers(-1, -(-length // 64))) for length in lengths]
    heads = (1, 16, 2, 16)
    case = _layer_case(lengths, heads, list(slots), [n + i for i in range(n)], chunks, seed=n)
    _assert_equal_ways(case, heads, "triton")


def test_layer_prefill_refuses_bad_heads_and_gates():
    heads = (1, 16, 2, 16)
    case = _layer_case([5], heads, [0], [1], [-1])
    args = dict(conv_pool=case["conv_pool"], state_pool=case["state_pool"], meta=case["meta"],
                A_log=case["A_log"], dt_bias=case["dt_bias"])
    call = lambda **kw: gdn_layer_prefill(case["x"], case["conv_weight"], **{**args, **kw})  # noqa: E731
    with pytest.raises(ValueError, match=r"heads=\(1, 16, 2, 32\) give 2·H·K \+ HV·V = 96"):
        call(heads=(1, 16, 2, 32), a=case["a"], b=case["b"])
    with pytest.raises(ValueError, match="heads must be"):
        call(heads=(1, 16, 2), a=case["a"], b=case["b"])
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        call(heads=heads, a=case["a"], b=None)
    with pytest.raises(ValueError, match="conv_pool must have shape"):
        call(heads=heads, a=case["a"], b=case["b"], conv_pool=case["conv_pool"][:, :, :2])


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(2, 128, 8, 128), (2, 32, 4, 32)])
def test_layer_prefill_gpu_bf16(heads, output_path):
    case = _layer_case([1, 200, 64, 513], heads, [3, 0, 1, 2], [4, 5, 6, 7], [-1, 3, 1, 8],
                       device="cuda", dtype=torch.bfloat16)
    _assert_equal_ways(case, heads, "triton")
