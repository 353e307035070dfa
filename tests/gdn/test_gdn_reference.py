"""The chunked (WY) form against the token-by-token recurrence, and the recurrence against
hand-computed values (docs/conventions.md). All fp32 comparisons use a 1e-5 relative tolerance."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from mamba_edu.gdn import (CHUNK, checkpoint_offsets, chunk_gated_delta_rule, cu_offsets, gdn_gating, l2norm,
                           recurrent_gated_delta_rule)
from mamba_edu.testing import check, rel_err

TOL = 1e-5
VARLEN = [1, 63, 64, 65, 200]  # around the chunk boundary, plus several chunks


def gdn_inputs(lengths, H=2, HV=4, K=16, V=8, *, l2norm_qk=True, initial_state=True, seed=0):
    """Random packed inputs with Qwen-like gating: ``A_log`` up to 3 drives g below −50.

    Without the in-kernel L2 norm the keys come normalised already, as a real model would pass
    them (keys with ``beta·|k|² > 2`` make the recurrence itself amplify rounding errors).
    """
    gen = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    q = torch.randn(T, H, K, generator=gen)
    k = torch.randn(T, H, K, generator=gen)
    if not l2norm_qk:
        k = F.normalize(k, dim=-1)
    v = torch.randn(T, HV, V, generator=gen)
    A_log = torch.linspace(-1.0, 3.0, HV)
    a = 1.5 * torch.randn(T, HV, generator=gen)
    b = torch.randn(T, HV, generator=gen)
    g, beta = gdn_gating(A_log, a, b, dt_bias=torch.ones(HV))
    cu = torch.tensor(cu_offsets(lengths), dtype=torch.int64)
    h0 = torch.randn(len(lengths), HV, K, V, generator=gen) if initial_state else None
    return dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu, initial_state=h0,
                use_qk_l2norm=l2norm_qk)


def assert_same_results(actual, expected, tol=TOL):
    """Compare two GDNOutputs field by field (checkpoints only where both have them)."""
    check(actual.o, expected.o, tol, name="o", quiet=True)
    check(actual.final_state, expected.final_state, tol, name="final_state", quiet=True)
    if expected.checkpoints is not None:
        check(actual.checkpoints, expected.checkpoints, tol, name="checkpoints", quiet=True)
        assert torch.equal(actual.checkpoint_offsets, expected.checkpoint_offsets)


def test_inputs_reach_strong_gates():
    g = gdn_inputs(VARLEN)["g"]
    assert g.max() <= 0 and g.min() < -50, "the tests must exercise Qwen-like strong decay"


@pytest.mark.parametrize("H,HV", [(2, 4), (2, 2)])
@pytest.mark.parametrize("initial_state", [True, False])
@pytest.mark.parametrize("l2norm_qk", [True, False])
def test_chunked_matches_recurrent_varlen(H, HV, initial_state, l2norm_qk):
    x = gdn_inputs(VARLEN, H, HV, l2norm_qk=l2norm_qk, initial_state=initial_state)
    expected = recurrent_gated_delta_rule(**x, output_checkpoints=True)
    actual = chunk_gated_delta_rule(**x, output_checkpoints=True)
    assert_same_results(actual, expected)
    assert expected.checkpoint_offsets.tolist() == checkpoint_offsets(VARLEN) == [0, 1, 2, 3, 5, 9]


@pytest.mark.parametrize("fn", [recurrent_gated_delta_rule, chunk_gated_delta_rule])
def test_strong_then_weak_gates(fn):
    """48 tokens at g = −50 push Γ to −2400 inside one chunk; the 16 weak tokens after them
    must still decay correctly (an fp32 Γ_s − Γ_j would be off by ~2e-4 there)."""
    x = gdn_inputs([64, 64])
    x["g"] = torch.cat([torch.full((48, 4), -50.0), torch.full((16, 4), -0.01)]).repeat(2, 1)
    out, ref = fn(**x), recurrent_gated_delta_rule(**x)
    check(out.final_state, ref.final_state, TOL, name="final_state", quiet=True)
    check(out.o, ref.o, TOL, name="o", quiet=True)


@pytest.mark.parametrize("length", VARLEN)
def test_chunked_matches_recurrent_single_sequence(length):
    x = gdn_inputs([length])
    x["cu_seqlens"] = None  # one sequence, no cu_seqlens
    assert_same_results(chunk_gated_delta_rule(**x, output_checkpoints=True),
                        recurrent_gated_delta_rule(**x, output_checkpoints=True))


@pytest.mark.parametrize("fn", [recurrent_gated_delta_rule, chunk_gated_delta_rule])
def test_packed_batch_equals_separate_sequences(fn):
    """Sequences in one packed batch never see each other."""
    x = gdn_inputs(VARLEN)
    packed = fn(**x)
    cu = x["cu_seqlens"].tolist()
    for n, (s, e) in enumerate(zip(cu[:-1], cu[1:])):
        alone = recurrent_gated_delta_rule(
            x["q"][s:e], x["k"][s:e], x["v"][s:e], x["g"][s:e], x["beta"][s:e],
            initial_state=x["initial_state"][n:n + 1], use_qk_l2norm=True)
        check(packed.o[s:e], alone.o, TOL, name=f"o of sequence {n}", quiet=True)
        check(packed.final_state[n:n + 1], alone.final_state, TOL, name=f"state {n}", quiet=True)


@pytest.mark.parametrize("fn", [recurrent_gated_delta_rule, chunk_gated_delta_rule])
def test_checkpoint_is_state_after_64c_tokens(fn):
    """h[c] of a sequence = the final state of the recurrence run on its first 64·c tokens."""
    x = gdn_inputs(VARLEN)
    out = fn(**x, output_checkpoints=True)
    cu = x["cu_seqlens"].tolist()
    offsets = out.checkpoint_offsets.tolist()
    n = VARLEN.index(200)
    h0 = x["initial_state"][n:n + 1]
    check(out.checkpoints[offsets[n]], h0[0], TOL, name="h[0]", quiet=True)
    for c in range(1, offsets[n + 1] - offsets[n]):  # c = 1 … 3
        prefix = slice(cu[n], cu[n] + CHUNK * c)
        state = recurrent_gated_delta_rule(
            *(x[name][prefix] for name in ("q", "k", "v", "g", "beta")),
            initial_state=h0, use_qk_l2norm=True).final_state[0]
        check(out.checkpoints[offsets[n] + c], state, TOL, name=f"h[{c}]", quiet=True)


def test_final_state_is_not_a_checkpoint():
    """A 64-token sequence has one checkpoint (its initial state); its final state is separate."""
    x = gdn_inputs([64, 128])
    out = chunk_gated_delta_rule(**x, output_checkpoints=True)
    assert out.checkpoint_offsets.tolist() == [0, 1, 3]
    check(out.checkpoints[0], x["initial_state"][0], TOL, quiet=True)
    assert rel_err(out.checkpoints[0], out.final_state[0]) > 0.1


@pytest.mark.parametrize("fn", [recurrent_gated_delta_rule, chunk_gated_delta_rule])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_output_dtypes(fn, dtype):
    x = gdn_inputs([70, 5], initial_state=False)
    x.update({name: x[name].to(dtype) for name in ("q", "k", "v")})
    out = fn(**x, output_checkpoints=True)
    assert out.o.dtype == dtype and out.o.shape == x["v"].shape
    assert out.final_state.dtype == out.checkpoints.dtype == torch.float32
    assert out.final_state.shape == (2, 4, 16, 8) and out.checkpoints.shape == (3, 4, 16, 8)


def test_one_step_by_hand():
    """Decay first, then the delta-rule write, then the read (K = V = 2, one head)."""
    S0 = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])  # [N=1, HV=1, K, V]
    k = torch.tensor([[[1.0, 0.0]]])
    v = torch.tensor([[[3.0, 4.0]]])
    g = torch.tensor([[math.log(0.5)]])
    beta = torch.tensor([[1.0]])
    out = recurrent_gated_delta_rule(k, k, v, g, beta, scale=1.0, initial_state=S0)
    # S = 0.5·I; prediction Sᵀk = (0.5, 0); ṽ = v − (0.5, 0) = (2.5, 4); S += k ṽᵀ.
    torch.testing.assert_close(out.final_state[0, 0], torch.tensor([[3.0, 4.0], [0.0, 0.5]]))
    torch.testing.assert_close(out.o[0, 0], v[0, 0])  # beta = 1: reading at k returns v exactly


def test_default_scale_is_inverse_sqrt_k():
    x = gdn_inputs([40], initial_state=False)
    default = recurrent_gated_delta_rule(**x).o
    unscaled = recurrent_gated_delta_rule(**x, scale=1.0).o
    check(unscaled * 16 ** -0.5, default, TOL, quiet=True)


def test_value_head_reads_key_head_i_over_group():
    """GQA: with H = 2 and HV = 6, value head i uses key head i // 3 (contiguous groups)."""
    x = gdn_inputs([50, 30], H=2, HV=6)
    full = chunk_gated_delta_rule(**x)
    for i in range(6):
        kh = [i // 3]
        one = recurrent_gated_delta_rule(
            x["q"][:, kh], x["k"][:, kh], x["v"][:, [i]], x["g"][:, [i]], x["beta"][:, [i]],
            initial_state=x["initial_state"][:, [i]], cu_seqlens=x["cu_seqlens"], use_qk_l2norm=True)
        check(full.o[:, [i]], one.o, TOL, name=f"value head {i}", quiet=True)


def test_gating_formula():
    A_log = torch.tensor([-1.0, 0.0, 3.0])
    dt_bias = torch.tensor([0.5, -0.5, 0.0])
    a = torch.tensor([[-3.0, 0.0, 2.0], [1.0, 25.0, -40.0]])
    b = torch.tensor([[0.0, 2.0, -2.0], [5.0, -5.0, 1.0]])
    g, beta = gdn_gating(A_log, a, b, dt_bias)
    x = (a + dt_bias).double()
    softplus = torch.where(x > 20, x, torch.log1p(torch.exp(x)))  # linear above the threshold 20
    torch.testing.assert_close(g.double(), -torch.exp(A_log.double()) * softplus)
    torch.testing.assert_close(beta.double(), 1 / (1 + torch.exp(-b.double())))
    assert g.dtype == beta.dtype == torch.float32


def test_l2norm_eps_inside_sqrt():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    torch.testing.assert_close(l2norm(x), torch.tensor([[3.0, 4.0], [0.0, 0.0]]) / math.sqrt(25 + 1e-6))
    torch.testing.assert_close(l2norm(x.half()).norm(dim=-1), torch.tensor([1.0, 0.0]))


# ---- property tests ---------------------------------------------------------------------------

heads = st.sampled_from([(1, 1), (1, 3), (2, 2), (2, 4), (3, 6)])


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 150), min_size=1, max_size=5), hv=heads,
       dims=st.sampled_from([(4, 4), (8, 16), (16, 8)]), initial_state=st.booleans(),
       l2norm_qk=st.booleans(), seed=st.integers(0, 2**16))
def test_property_chunked_matches_recurrent(lengths, hv, dims, initial_state, l2norm_qk, seed):
    x = gdn_inputs(lengths, *hv, *dims, l2norm_qk=l2norm_qk, initial_state=initial_state, seed=seed)
    assert_same_results(chunk_gated_delta_rule(**x, output_checkpoints=True),
                        recurrent_gated_delta_rule(**x, output_checkpoints=True))


@pytest.mark.parametrize("fn", [recurrent_gated_delta_rule, chunk_gated_delta_rule])
@settings(max_examples=25, deadline=None)
@given(data=st.data(), length=st.integers(2, 150), seed=st.integers(0, 2**16))
def test_property_split_and_continue_equals_whole(fn, data, length, seed):
    """Prefill tokens [0, P), then [P, L) from the saved state: what a prefix-cache hit does."""
    P = data.draw(st.integers(1, length - 1), label="P")
    x = gdn_inputs([length], seed=seed)
    x["cu_seqlens"] = None
    whole = fn(**x)
    tokens = ("q", "k", "v", "g", "beta")
    first = fn(**{**x, **{n: x[n][:P] for n in tokens}})
    second = fn(**{**x, **{n: x[n][P:] for n in tokens}, "initial_state": first.final_state})
    check(torch.cat([first.o, second.o]), whole.o, TOL, name="o", quiet=True)
    check(second.final_state, whole.final_state, TOL, name="final_state", quiet=True)
