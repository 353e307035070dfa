"""Causal GQA attention (Triton in the interpreter on CPU, and the SDPA expression) vs an fp64
softmax over a masked score matrix, written out per sequence."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from mamba_edu import triton_interpreted
from mamba_edu.kernels import attention, causal_attention
from mamba_edu.testing import rel_err

IMPLS = [pytest.param("triton", marks=pytest.mark.skipif(
    not triton_interpreted(), reason="Triton on CPU tensors needs TRITON_INTERPRET=1")), "torch"]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def reference(q, k, v, n_seqs, scale=None, diagonal=0):
    """fp64 attention: query i of a sequence sees its keys j <= i + Lk - Lq (+ ``diagonal``, to
    make a wrong mask); KV heads repeated."""
    T, Hq, D = q.shape
    Lq, Lk = T // n_seqs, k.shape[0] // n_seqs
    scale = D ** -0.5 if scale is None else scale
    group = Hq // k.shape[1]
    q, k, v = q.double(), *(t.double().repeat_interleave(group, 1) for t in (k, v))
    hidden = torch.arange(Lk)[None, :] > torch.arange(Lq)[:, None] + (Lk - Lq + diagonal)
    outs = []
    for n in range(n_seqs):
        q_n, k_n, v_n = q[n * Lq:(n + 1) * Lq], k[n * Lk:(n + 1) * Lk], v[n * Lk:(n + 1) * Lk]
        scores = torch.einsum("ihd,jhd->hij", q_n, k_n) * scale
        probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        outs.append(torch.einsum("hij,jhd->ihd", probs, v_n))
    return torch.cat(outs)


def inputs(n_seqs, Lq, Lk, Hq, Hkv, D, *, strided=False, seed=0, device="cpu", dtype=torch.float32):
    """``q [n·Lq, Hq, D]``, ``k, v [n·Lk, Hkv, D]``; ``strided``: q and k are head slices of
    ``[T, Hq+Hkv, D]`` tensors (one tensor when Lq == Lk, as in the model's projection), v a
    column slice of a wider ``[T, Hkv·D + 6]`` matrix."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    Tq, Tk = n_seqs * Lq, n_seqs * Lk
    if not strided:
        return randn(Tq, Hq, D), randn(Tk, Hkv, D), randn(Tk, Hkv, D)
    qk = randn(Tk, Hq + Hkv, D)
    q = qk[:, :Hq] if Lq == Lk else randn(Tq, Hq + Hkv, D)[:, :Hq]
    v = randn(Tk, Hkv * D + 6)[:, 3:3 + Hkv * D].view(Tk, Hkv, D)
    return q, qk[:, Hq:], v


# (n_seqs, Lq, Lk, Hq, Hkv, D): plain causal at lengths off the 64-row blocks, prefixes (queries
# after cached keys), decode tokens; key ranges long enough for blocks without the causal mask.
CASES = [
    (1, 1, 1, 2, 2, 16),
    (1, 7, 7, 4, 2, 64),
    (1, 33, 33, 4, 1, 16),
    (3, 70, 70, 4, 2, 16),
    (1, 5, 40, 4, 1, 64),
    (3, 5, 40, 2, 2, 16),
    (2, 20, 90, 4, 2, 16),
    (1, 1, 37, 4, 2, 64),
    (3, 1, 37, 4, 1, 16),
    (1, 1, 130, 2, 2, 16),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("strided", [False, True], ids=["packed", "strided"])
@pytest.mark.parametrize("n_seqs, Lq, Lk, Hq, Hkv, D", CASES)
def test_matches_fp64_reference(n_seqs, Lq, Lk, Hq, Hkv, D, strided, dtype, impl):
    q, k, v = inputs(n_seqs, Lq, Lk, Hq, Hkv, D, strided=strided, dtype=dtype)
    assert all((t.stride(0) > t[0].numel()) == strided for t in (q, k))
    out = causal_attention(q, k, v, n_seqs, impl=impl)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    assert rel_err(out, reference(q, k, v, n_seqs)) <= TOL[dtype]


@pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("blocks", [(16, 64), (16, 128), (64, 64), (128, 64)])
@pytest.mark.parametrize("n_seqs, Lq, Lk", [(2, 1, 150), (2, 9, 150), (1, 150, 150), (2, 140, 200)])
def test_every_block_shape(blocks, n_seqs, Lq, Lk, monkeypatch):
    """Each (BM, BN) that :func:`_config` picks on a GPU, at any batch shape, in the interpreter."""
    monkeypatch.setattr(attention, "_config", lambda D, Lq, heads: (*blocks, 4, 2))
    q, k, v = inputs(n_seqs, Lq, Lk, 4, 2, 16, strided=True)
    out = causal_attention(q, k, v, n_seqs, impl="triton")
    assert rel_err(out, reference(q, k, v, n_seqs)) <= 1e-5


@pytest.mark.parametrize("impl", IMPLS)
def test_explicit_scale(impl):
    q, k, v = inputs(2, 9, 30, 4, 2, 16)
    out = causal_attention(q, k, v, 2, 0.7, impl=impl)
    assert rel_err(out, reference(q, k, v, 2, 0.7)) <= 1e-5


@pytest.mark.parametrize("impl", IMPLS)
def test_a_wrong_mask_would_fail(impl):
    """The tolerance separates: the diagonal one key off moves the result far past it."""
    q, k, v = inputs(2, 33, 40, 4, 2, 16)
    out = causal_attention(q, k, v, 2, impl=impl)
    assert rel_err(out, reference(q, k, v, 2)) <= 1e-5
    for wrong in (-1, 1):
        assert rel_err(out, reference(q, k, v, 2, diagonal=wrong)) > 1e-2


@pytest.mark.parametrize("impl", ["auto", "torch"])
def test_torch_path_is_the_models_expression_bit_for_bit(impl):
    """Fresh prompts of one length: one causal SDPA call over ``[N, heads, L, D]``; a prompt after
    a prefix: SDPA with the boolean ``tril(P)`` mask (mamba_edu/model/layers.py)."""
    q, k, v = inputs(3, 20, 20, 4, 2, 16, strided=True)
    q4, k4, v4 = (t.unflatten(0, (3, -1)).transpose(1, 2) for t in (q, k, v))
    fresh = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, enable_gqa=True)
    out = causal_attention(q, k, v, 3, impl=impl)
    assert torch.equal(out, fresh.transpose(1, 2).flatten(0, 1))

    q, k, v = inputs(1, 5, 40, 4, 2, 16)
    mask = torch.ones(5, 40, dtype=torch.bool).tril(35)
    q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    after_prefix = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, enable_gqa=True)
    assert torch.equal(causal_attention(q, k, v, impl=impl), after_prefix[0].transpose(0, 1))


@pytest.mark.parametrize("impl", IMPLS)
def test_the_models_unchecked_call_equals_the_checked_export(impl):
    """The model calls :func:`attention.causal_attention` (no checks: it built the tensors); the
    export :func:`mamba_edu.kernels.causal_attention` is its checks, then that call."""
    q, k, v = inputs(2, 20, 30, 4, 2, 16, strided=True)
    assert torch.equal(attention.causal_attention(q, k, v, 2, impl=impl),
                       causal_attention(q, k, v, 2, impl=impl))


@pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
@settings(max_examples=20, deadline=None)
@given(n_seqs=st.integers(1, 3), Lq=st.integers(1, 80), prefix=st.integers(0, 80),
       heads=st.sampled_from([(1, 1), (2, 1), (4, 2), (3, 3)]), D=st.sampled_from([16, 32]),
       seed=st.integers(0, 2**16))
def test_property_any_batch(n_seqs, Lq, prefix, heads, D, seed):
    q, k, v = inputs(n_seqs, Lq, Lq + prefix, *heads, D, strided=bool(seed % 2), seed=seed)
    out = causal_attention(q, k, v, n_seqs, impl="triton")
    assert rel_err(out, reference(q, k, v, n_seqs)) <= 1e-5


# ---------------------------------------------------------------------------------- validation

def _qkv(T=8, Hq=4, D=16, Tk=None, Hkv=2, **kw):
    """Zero ``q [T, Hq, D]``, ``k, v [Tk, Hkv, D]`` (``Tk = T`` by default)."""
    Tk = Tk or T
    return torch.zeros(T, Hq, D, **kw), torch.zeros(Tk, Hkv, D, **kw), torch.zeros(Tk, Hkv, D, **kw)


@pytest.mark.parametrize("call, message", [
    (lambda: causal_attention(torch.zeros(8, 64), *_qkv()[1:]),
     r"q must have shape \[\*, \*, \*\]"),
    (lambda: causal_attention(*_qkv(dtype=torch.float64)), "q must have dtype in"),
    (lambda: causal_attention(_qkv()[0], torch.zeros(8, 2, 32), _qkv()[2]),
     r"k must have shape \[\*, \*, 16\]"),
    (lambda: causal_attention(_qkv()[0], _qkv()[1].half(), _qkv()[2]), "k must have dtype in"),
    (lambda: causal_attention(*_qkv()[:2], torch.zeros(9, 2, 16)),
     r"v must have shape \[8, 2, 16\]"),
    (lambda: causal_attention(_qkv()[0], *(torch.zeros(8, 16, 2).transpose(1, 2) for _ in "kv")),
     "k must be contiguous within each row"),
    (lambda: causal_attention(*_qkv(), n_seqs=0), "n_seqs must be a positive int"),
    (lambda: causal_attention(*_qkv(), n_seqs=2.0), "n_seqs must be a positive int"),
    (lambda: causal_attention(*_qkv(), n_seqs=3), "q must have a multiple of n_seqs=3 rows"),
    (lambda: causal_attention(*_qkv(T=6, Tk=10), n_seqs=3), "k must have a multiple of n_seqs=3"),
    (lambda: causal_attention(*_qkv(T=8, Tk=6)), "k must have at least Lq=8 rows per sequence"),
    (lambda: causal_attention(*_qkv(Hkv=3)), "k must have a number of heads that divides q's 4"),
    (lambda: causal_attention(*_qkv(Hkv=0)), "k must have a number of heads that divides"),
    (lambda: causal_attention(*_qkv(), scale="0.25"), "scale must be a finite Python float"),
    (lambda: causal_attention(*_qkv(), scale=float("nan")), "scale must be a finite Python float"),
    (lambda: causal_attention(*_qkv(), impl="cudnn"), "impl must be"),
])
def test_rejects_bad_inputs(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("D", [8, 48, 512])
def test_triton_refuses_other_head_dims(D):
    with pytest.raises(ValueError, match=r"q must have a head dim D in \[16, 32, 64, 128, 256\]"):
        causal_attention(*_qkv(D=D), impl="triton")
    assert causal_attention(*_qkv(D=D), impl="torch").shape == (8, 4, D)  # SDPA takes any D


@pytest.mark.skipif(not triton_interpreted(), reason="needs TRITON_INTERPRET=1")
def test_interpreter_refuses_bf16_naming_the_argument():
    with pytest.raises(ValueError, match="q has dtype bfloat16"):
        causal_attention(*_qkv(dtype=torch.bfloat16), impl="triton")


# ---------------------------------------------------------------------------------- GPU (bf16)

def _sdpa_fp32(q, k, v, n_seqs):
    """SDPA in fp32 on the bf16 inputs, with the bottom-right boolean mask."""
    Lq, Lk = q.shape[0] // n_seqs, k.shape[0] // n_seqs
    q4, k4, v4 = (t.float().unflatten(0, (n_seqs, -1)).transpose(1, 2) for t in (q, k, v))
    mask = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(Lk - Lq)
    o = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, enable_gqa=True)
    return o.transpose(1, 2).flatten(0, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("n_seqs, Lq, Lk, Hq, Hkv, D", [
    (1, 512, 512, 4, 1, 256),
    (8, 1024, 1024, 16, 2, 256),
    (2, 300, 1100, 16, 2, 256),   # a prompt after a cached prefix
    (2, 1100, 1300, 16, 2, 256),  # the same, in 128-row blocks
    (4, 1, 1000, 16, 2, 256),     # decode tokens
    (16, 1, 1000, 16, 2, 256),    # decode tokens, 64 keys per step
    (3, 5, 77, 16, 2, 256),       # a short extend (16-row blocks)
    (2, 150, 150, 4, 2, 128),
    (2, 150, 170, 4, 2, 32),      # head dims below 64: padded tiles
    (2, 150, 150, 4, 1, 16),
])
@pytest.mark.parametrize("strided", [False, True], ids=["packed", "strided"])
def test_gpu_bf16_matches_fp32_sdpa(n_seqs, Lq, Lk, Hq, Hkv, D, strided):
    q, k, v = inputs(n_seqs, Lq, Lk, Hq, Hkv, D, strided=strided, device="cuda",
                     dtype=torch.bfloat16)
    out = causal_attention(q, k, v, n_seqs, impl="triton")
    assert out.dtype == torch.bfloat16 and out.is_contiguous() and out.isfinite().all()
    assert rel_err(out, _sdpa_fp32(q, k, v, n_seqs)) <= 1e-2


@pytest.mark.gpu
def test_gpu_replays_in_a_cuda_graph():
    """Captured in a CUDA graph, a replay on new inputs gives what an eager call gives."""
    q, k, v = inputs(2, 64, 200, 16, 2, 256, device="cuda", dtype=torch.bfloat16)
    causal_attention(q, k, v, 2)  # compile before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = causal_attention(q, k, v, 2)
    for t, new in zip((q, k, v), inputs(2, 64, 200, 16, 2, 256, seed=1, device="cuda",
                                        dtype=torch.bfloat16)):
        t.copy_(new)
    graph.replay()
    assert torch.equal(out, causal_attention(q, k, v, 2))


@pytest.mark.gpu
def test_gpu_one_kernel_and_no_memset():
    """The forward is one kernel on the GPU: no memset, no workspace (what cuDNN's SDPA brings)."""
    q, k, v = inputs(1, 512, 512, 16, 2, 256, device="cuda", dtype=torch.bfloat16)
    causal_attention(q, k, v)  # compile first
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        causal_attention(q, k, v)
        torch.cuda.synchronize()
    gpu = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert gpu == ["causal_attention_kernel"]


@pytest.mark.gpu
@pytest.mark.parametrize("n_seqs, Lq, Lk, ours", [
    (1, 512, 512, True), (8, 64, 1024, True),      # where the kernel measured faster
    (1, 1024, 1024, False), (4, 1, 1000, False),   # long prompts and decode: SDPA
])
def test_gpu_auto_takes_the_kernel_only_where_it_is_faster(n_seqs, Lq, Lk, ours):
    q, k, v = inputs(n_seqs, Lq, Lk, 16, 2, 256, device="cuda", dtype=torch.bfloat16)
    causal_attention(q, k, v, n_seqs)  # compile first
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        causal_attention(q, k, v, n_seqs)
        torch.cuda.synchronize()
    gpu = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert ("causal_attention_kernel" in gpu) == ours
