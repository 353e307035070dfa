"""Fused norm / SwiGLU / RoPE ops (interpreter on CPU) vs the torch expressions the model writes."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from mamba_edu import triton_interpreted
from mamba_edu.kernels import add_rms_norm, gated_rms_norm, rms_norm, rope, silu_mul
from mamba_edu.model.layers import rope_tables
from mamba_edu.testing import rel_err

IMPLS = [pytest.param("triton", marks=pytest.mark.skipif(
    not triton_interpreted(), reason="Triton on CPU tensors needs TRITON_INTERPRET=1")), "torch"]
EPS = 1e-6


def _randn(*shape, seed=0, pad=0, device="cpu", dtype=torch.float32):
    """``randn(*shape)``; with ``pad`` a row-strided column slice of a ``pad``-wider matrix."""
    gen = torch.Generator().manual_seed(seed)
    T, *rest = shape
    width = math.prod(rest)
    full = torch.randn(T, width + pad, generator=gen).to(device, dtype)
    return full[:, pad // 2: pad // 2 + width].view(T, *rest)


def _weight(D, seed=1, device="cpu", dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return (1 + 0.5 * torch.randn(D, generator=gen)).to(device, dtype)


# ---------------------------------------------------------------------------------- expressions

def ref_rms_norm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def ref_add_rms_norm(x, delta, w):
    s = x + delta
    return s, F.rms_norm(s, (x.shape[-1],), w, EPS)


def ref_gated(o, z, w):
    T, HV, V = o.shape
    return F.rms_norm(o, (V,), w, EPS) * F.silu(z.view(T, HV, V))


def ref_silu_mul(gate_up):
    gate, up = gate_up.chunk(2, -1)
    return F.silu(gate) * up


def ref_rope(x, cos, sin):
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def _tables(T, D, device="cpu"):
    return rope_tables(torch.arange(3, 3 + T, device=device), D, 10_000.0)


def _cases(T, pad, device="cpu", dtype=torch.float32):
    """``name → (fn, ref, args)`` at odd sizes: D=40, 3 heads × V=24, F=36, rope 3 heads × 20."""
    kw = dict(device=device, dtype=dtype)
    cos, sin = _tables(T, 20, device)
    return {
        "rms_norm": (rms_norm, ref_rms_norm, (_randn(T, 40, pad=pad, **kw), _weight(40, **kw))),
        "add_rms_norm": (add_rms_norm, ref_add_rms_norm,
                         (_randn(T, 40, pad=pad, **kw), _randn(T, 40, seed=2, pad=2 * pad, **kw),
                          _weight(40, **kw))),
        "gated_rms_norm": (gated_rms_norm, ref_gated,
                           (_randn(T, 3, 24, **kw), _randn(T, 72, seed=2, pad=pad, **kw),
                            _weight(24, **kw))),
        "silu_mul": (silu_mul, ref_silu_mul, (_randn(T, 72, pad=pad, **kw),)),
        "rope": (rope, ref_rope, (_randn(T, 3, 20, pad=pad, **kw), cos, sin)),
    }


def _call(name, fn, args, impl):
    return fn(*args, EPS, impl=impl) if "norm" in name else fn(*args, impl=impl)


def _pairs(out, ref):
    return zip(out, ref) if isinstance(ref, tuple) else [(out, ref)]


NAMES = ["rms_norm", "add_rms_norm", "gated_rms_norm", "silu_mul", "rope"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("T, pad", [(5, 0), (70, 0), (70, 6)])
def test_matches_torch_expression(name, T, pad, impl):
    fn, ref_fn, args = _cases(T, pad)[name]
    assert all(a.is_contiguous() for a in args) == (pad == 0)
    out, ref = _call(name, fn, args, impl), ref_fn(*args)
    for a, b in _pairs(out, ref):
        assert a.shape == b.shape and a.dtype == b.dtype and a.is_contiguous()
        assert rel_err(a, b) <= 1e-5


@pytest.mark.parametrize("impl", ["auto", "torch"])
@pytest.mark.parametrize("name", NAMES)
def test_torch_path_is_the_expression_bit_for_bit(name, impl):
    fn, ref_fn, args = _cases(70, 6)[name]
    for a, b in _pairs(_call(name, fn, args, impl), ref_fn(*args)):
        assert torch.equal(a, b)


@pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
def test_add_rms_norm_fp16_sum_is_exact():
    """fp16: ``s`` is ``x + delta`` rounded as torch rounds it, and ``n`` is the norm of that ``s``."""
    x, delta = _randn(33, 40, dtype=torch.float16) * 30, _randn(33, 40, seed=2, dtype=torch.float16)
    w = _weight(40, dtype=torch.float16)
    s, n = add_rms_norm(x, delta, w, EPS, impl="triton")
    assert torch.equal(s, x + delta)
    assert rel_err(n, ref_rms_norm(s.float(), w.float())) <= 1e-3


@pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
@settings(max_examples=15, deadline=None)
@given(T=st.integers(1, 40), D=st.one_of(st.integers(1, 300), st.integers(1500, 5000)),
       pad=st.integers(0, 9), seed=st.integers(0, 2**16))
def test_property_rms_norm_any_shape(T, D, pad, seed):
    x, w = _randn(T, D, seed=seed, pad=pad), _weight(D, seed=seed + 1)
    assert rel_err(rms_norm(x, w, EPS, impl="triton"), ref_rms_norm(x, w)) <= 1e-5


# ---------------------------------------------------------------------------------- validation

@pytest.mark.parametrize("call, message", [
    (lambda: rms_norm(torch.zeros(4, 8), torch.ones(7), EPS), r"weight must have shape \[8\]"),
    (lambda: rms_norm(torch.zeros(4, 8, dtype=torch.float64), torch.ones(8), EPS),
     "x must have dtype in"),
    (lambda: rms_norm(torch.zeros(4, 8), torch.ones(8, dtype=torch.float16), EPS),
     "weight must have dtype in"),
    (lambda: rms_norm(torch.zeros(8, 4).t(), torch.ones(8), EPS), "x must be contiguous within"),
    (lambda: rms_norm(torch.zeros(4, 8), torch.ones(8), "1e-6"), "eps must be"),
    (lambda: add_rms_norm(torch.zeros(4, 8), torch.zeros(4, 9), torch.ones(8), EPS),
     r"delta must have shape \[4, 8\]"),
    (lambda: add_rms_norm(torch.zeros(4, 8), torch.zeros(4, 8, dtype=torch.float16),
                          torch.ones(8), EPS), "delta must have dtype in"),
    (lambda: gated_rms_norm(torch.zeros(4, 3, 8), torch.zeros(4, 25), torch.ones(8), EPS),
     r"z must have shape \[4, 24\]"),
    (lambda: gated_rms_norm(torch.zeros(4, 3, 8), torch.zeros(4, 24, dtype=torch.float16),
                            torch.ones(8), EPS), "z must have dtype in"),
    (lambda: gated_rms_norm(torch.zeros(4, 3, 8)[:, :2], torch.zeros(4, 16), torch.ones(8), EPS),
     "o must be contiguous"),
    (lambda: silu_mul(torch.zeros(4, 7)), "gate_up must have an even last dim"),
    (lambda: silu_mul(torch.zeros(4, 8, dtype=torch.int32)), "gate_up must have dtype in"),
    (lambda: rope(torch.zeros(4, 2, 8), *_tables(3, 8)), r"cos must have shape \[4, 1, 4\]"),
    (lambda: rope(torch.zeros(4, 2, 8), torch.zeros(4, 1, 4, dtype=torch.float16),
                  _tables(4, 8)[1]), "cos must have dtype in"),
    (lambda: rope(torch.zeros(4, 2, 7), *_tables(4, 8)), "x must have an even last dim"),
    (lambda: rms_norm(torch.zeros(4, 8), torch.ones(8), EPS, impl="cuda"), "impl must be"),
])
def test_rejects_bad_inputs(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
def test_interpreter_refuses_bf16_naming_the_argument():
    with pytest.raises(ValueError, match="gate_up has dtype bfloat16"):
        silu_mul(torch.zeros(4, 8, dtype=torch.bfloat16), impl="triton")


# ---------------------------------------------------------------------------------- GPU (bf16)

@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("T, pad", [(5, 0), (300, 6)])
def test_gpu_bf16_matches_fp32_torch(name, T, pad):
    fn, ref_fn, args = _cases(T, pad, device="cuda", dtype=torch.bfloat16)[name]
    out = _call(name, fn, args, "auto")
    ref = ref_fn(*(a.float() for a in args))
    for a, b in _pairs(out, ref):
        assert a.dtype == torch.bfloat16 and a.is_contiguous()
        assert rel_err(a, b) <= 5e-3


@pytest.mark.gpu
@pytest.mark.parametrize("D", [2048, 4096, 8192])
def test_gpu_bf16_wide_rows(D):
    """Model-sized rows: the presets' hidden sizes (and beyond) for the norms."""
    kw = dict(device="cuda", dtype=torch.bfloat16)
    x, delta, w = _randn(64, D, pad=128, **kw), _randn(64, D, seed=2, **kw), _weight(D, **kw)
    s, n = add_rms_norm(x, delta, w, EPS)
    s_ref, n_ref = ref_add_rms_norm(x.float(), delta.float(), w.float())
    assert rel_err(s, s_ref) <= 5e-3 and rel_err(n, n_ref) <= 5e-3
    assert rel_err(rms_norm(x, w, EPS), ref_rms_norm(x.float(), w.float())) <= 5e-3


@pytest.mark.gpu
@pytest.mark.parametrize("Fw", [11 * 512, 11 * 1024])
def test_gpu_bf16_silu_mul_mlp_width(Fw):
    """The presets' MLP widths: several column blocks per row, not a power of two."""
    gate_up = _randn(64, 2 * Fw, pad=64, device="cuda", dtype=torch.bfloat16)
    assert rel_err(silu_mul(gate_up), ref_silu_mul(gate_up.float())) <= 5e-3
