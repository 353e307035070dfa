"""The lab's projections with the norm or SwiGLU in the GEMM's prologue
(mamba_edu/lab/prologue_gemms.py; interpreter on CPU, bf16 on a GPU) against the two steps the
model runs, in fp64."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from mamba_edu import triton_interpreted
from mamba_edu.kernels.fused_ops import gated_rms_norm
from mamba_edu.lab.prologue_gemms import gated_norm_linear, norm_linear, swiglu_linear
from mamba_edu.testing import rel_err

EPS = 1e-6
interpreted = pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _inputs(M, D, N, seed=0, pad=0, device="cpu", dtype=torch.float32):
    """``x, delta [M, D]`` (row-strided column slices with ``pad``), ``norm_weight [D]``,
    ``weight [N, D]`` and ``gate_up [M, 2D]``, seeded."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    def rows(width):
        return randn(M, width + pad)[:, pad // 2: pad // 2 + width].to(dtype)

    x, delta, gate_up = rows(D), rows(D), rows(2 * D)
    norm_weight = (1 + 0.5 * randn(D)).to(dtype)
    weight = (randn(N, D) * D ** -0.5).to(dtype)
    return x, delta, norm_weight, weight, gate_up


def ref_norm_linear(x, delta, norm_weight, weight):
    """fp64 reference from the rounded sum (both paths normalise ``s`` as stored)."""
    s = x if delta is None else x + delta
    h = F.rms_norm(s.double(), (s.shape[1],), norm_weight.double(), EPS)
    return s, h @ weight.double().T


def ref_swiglu_linear(gate_up, weight):
    gate, up = gate_up.double().chunk(2, -1)
    return (F.silu(gate) * up) @ weight.double().T


def ref_gated_norm_linear(o, z, norm_weight, weight):
    T, HV, V = o.shape
    normed = F.rms_norm(o.double(), (V,), norm_weight.double(), EPS) * F.silu(z.double().view(T, HV, V))
    return normed.view(T, -1) @ weight.double().T


def _gated_inputs(T, HV, V, N, pad=0, seed=0, device="cpu", dtype=torch.float32):
    """``o [T, HV, V]``, ``z [T, HV·V]`` (a row-strided slice with ``pad``), ``norm_weight [V]``,
    ``weight [N, HV·V]``."""
    x, z, _, weight, _ = _inputs(T, HV * V, N, seed, pad, device, dtype)
    norm_weight = _inputs(1, V, 1, seed + 1, 0, device, dtype)[2]
    return x.contiguous().view(T, HV, V), z, norm_weight, weight


def _check_norm_linear(M, D, N, dtype, with_delta, pad=0, seed=0, device="cpu"):
    x, delta, w_n, W, _ = _inputs(M, D, N, seed, pad, device, dtype)
    delta = delta if with_delta else None
    s, y = norm_linear(x, delta, w_n, EPS, W)
    s_ref, y_ref = ref_norm_linear(x, delta, w_n, W)
    assert torch.equal(s, s_ref), "the residual must be x + delta rounded as torch rounds it"
    assert y.shape == (M, N) and y.dtype == dtype and y.is_contiguous()
    assert rel_err(y, y_ref) <= TOL[dtype]


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_delta", [True, False])
@pytest.mark.parametrize("M, D, N, pad", [(1, 64, 200, 0), (70, 96, 130, 6), (5, 200, 40, 3)])
def test_norm_linear_matches_fp64(M, D, N, pad, with_delta, dtype):
    _check_norm_linear(M, D, N, dtype, with_delta, pad)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M, D, N, pad", [(1, 64, 200, 0), (70, 96, 130, 6), (5, 200, 40, 3)])
def test_swiglu_linear_matches_fp64(M, D, N, pad, dtype):
    *_, gate_up = _inputs(M, D, N, pad=pad, dtype=dtype)
    W = _inputs(M, D, N, seed=1, dtype=dtype)[3]
    y = swiglu_linear(gate_up, W)
    assert y.shape == (M, N) and y.dtype == dtype
    assert rel_err(y, ref_swiglu_linear(gate_up, W)) <= TOL[dtype]


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T, HV, V, N, pad", [(1, 2, 16, 40, 0), (70, 3, 32, 130, 6), (9, 1, 64, 24, 3)])
def test_gated_norm_linear_matches_fp64_and_the_norm_kernel_operand(T, HV, V, N, pad, dtype):
    o, z, w_n, W = _gated_inputs(T, HV, V, N, pad, dtype=dtype)
    y = gated_norm_linear(o, z, w_n, EPS, W)
    assert y.shape == (T, N) and y.dtype == dtype
    assert rel_err(y, ref_gated_norm_linear(o, z, w_n, W)) <= TOL[dtype]
    # The operand is rounded as the gated norm kernel stores it: fp32 products agree to fp32.
    two = F.linear(gated_rms_norm(o, z, w_n, EPS, impl="triton").view(T, -1), W)
    assert rel_err(y, two) <= (1e-6 if dtype == torch.float32 else TOL[dtype])


@interpreted
@settings(max_examples=12, deadline=None)
@given(M=st.integers(1, 90), D=st.integers(1, 160), N=st.integers(1, 150), pad=st.integers(0, 5),
       with_delta=st.booleans(), seed=st.integers(0, 2**16))
def test_property_norm_linear_any_shape(M, D, N, pad, with_delta, seed):
    _check_norm_linear(M, D, N, torch.float32, with_delta, pad, seed)


# ---------------------------------------------------------------------------------- validation

def _bad(**changes):
    x, delta, w_n, W, _ = _inputs(4, 8, 6)
    args = dict(x=x, delta=delta, norm_weight=w_n, eps=EPS, weight=W) | changes
    return lambda: norm_linear(args["x"], args["delta"], args["norm_weight"], args["eps"], args["weight"])


@pytest.mark.parametrize("call, message", [
    (_bad(delta=torch.zeros(4, 9)), r"delta must have shape \[4, 8\]"),
    (_bad(delta=torch.zeros(4, 8, dtype=torch.float16)), "delta must have dtype in"),
    (_bad(norm_weight=torch.ones(7)), r"norm_weight must have shape \[8\]"),
    (_bad(weight=torch.zeros(6, 9)), r"weight must have shape \[\*, 8\]"),
    (_bad(weight=torch.zeros(8, 6).t()), "weight must be contiguous"),
    (_bad(weight=torch.zeros(6, 8, device="meta")), "weight must be on cpu"),
    (_bad(x=torch.zeros(8, 4).t()), "x must be contiguous within"),
    (_bad(eps=-1.0), "eps must be"),
    (lambda: swiglu_linear(torch.zeros(4, 7), torch.zeros(3, 3)), "gate_up must have an even last dim"),
    (lambda: swiglu_linear(torch.zeros(4, 8), torch.zeros(3, 5)), r"weight must have shape \[\*, 4\]"),
    (lambda: swiglu_linear(torch.zeros(4, 8, dtype=torch.int32), torch.zeros(3, 4)),
     "gate_up must have dtype in"),
    (lambda: gated_norm_linear(torch.zeros(4, 2, 16), torch.zeros(4, 33), torch.ones(16), EPS,
                               torch.zeros(5, 32)), r"z must have shape \[4, 32\]"),
    (lambda: gated_norm_linear(torch.zeros(4, 2, 16), torch.zeros(4, 32), torch.ones(8), EPS,
                               torch.zeros(5, 32)), r"norm_weight must have shape \[16\]"),
    (lambda: gated_norm_linear(torch.zeros(4, 2, 16), torch.zeros(4, 32), torch.ones(16), EPS,
                               torch.zeros(5, 16)), r"weight must have shape \[\*, 32\]"),
    (lambda: gated_norm_linear(torch.zeros(4, 4, 16)[:, :2], torch.zeros(4, 32), torch.ones(16),
                               EPS, torch.zeros(5, 32)), "o must be contiguous"),
])
def test_rejects_bad_inputs(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@interpreted
def test_gated_norm_linear_refuses_a_head_dim_its_kernel_cannot_step_by():
    o, z, w_n, W = _gated_inputs(4, 2, 24, 8)
    with pytest.raises(ValueError, match="V=24 must be a power of two"):
        gated_norm_linear(o, z, w_n, EPS, W)


# ---------------------------------------------------------------------------------- GPU (bf16)

QWEN35_TP8_PROJECTIONS = [  # (in features, out features) at 512 tokens: notebook 09's budget
    (4096, 2576), (4096, 1536), (4096, 2816)]


@pytest.mark.gpu
@pytest.mark.parametrize("D, N", QWEN35_TP8_PROJECTIONS + [(4096, 248320)])
@pytest.mark.parametrize("with_delta", [True, False])
def test_gpu_bf16_norm_linear_model_shapes(D, N, with_delta):
    M = 1 if N > 100_000 else 512  # the LM head sees the last token of a prompt
    _check_norm_linear(M, D, N, torch.bfloat16, with_delta, pad=8, device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("T, HV, N", [(512, 8, 4096), (300, 32, 2048)])
def test_gpu_bf16_gated_norm_linear_model_shapes(T, HV, N):
    o, z, w_n, W = _gated_inputs(T, HV, 128, N, pad=8, device="cuda", dtype=torch.bfloat16)
    y = gated_norm_linear(o, z, w_n, EPS, W)
    assert rel_err(y, ref_gated_norm_linear(o, z, w_n, W)) <= TOL[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("Fw, N", [(1408, 4096), (5632, 2048)])
def test_gpu_bf16_swiglu_linear_model_shapes(Fw, N):
    *_, gate_up = _inputs(512, Fw, N, pad=8, device="cuda", dtype=torch.bfloat16)
    W = _inputs(1, Fw, N, seed=1, device="cuda", dtype=torch.bfloat16)[3]
    y = swiglu_linear(gate_up, W)
    assert rel_err(y, ref_swiglu_linear(gate_up, W)) <= TOL[torch.bfloat16]
