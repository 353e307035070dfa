"""The causal depthwise conv1d reference against the formula written out as loops, plus the
conv-state contract: continuing from a saved state equals running the whole sequence."""

import pytest
import torch
import torch.nn.functional as F

from mamba_edu.gdn import causal_conv1d, causal_conv1d_update, cu_offsets

D, W = 5, 4
LENGTHS = [1, 2, 3, 5, 9]  # 1 and 2 are shorter than the W−1 = 3 columns of context


def conv_inputs(lengths, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lengths), D, generator=gen).to(dtype)
    weight = torch.randn(D, W, generator=gen)
    bias = torch.randn(D, generator=gen)
    cu = torch.tensor(cu_offsets(lengths))
    states = torch.randn(len(lengths), D, W - 1, generator=gen)
    return x, weight, bias, cu, states


def direct_conv(x, weight, bias, lengths, states, activation="silu"):
    """y[t, c] = silu(bias[c] + Σ_j weight[c, j]·x̃[t + j, c]) with x̃ = [previous W−1 raw inputs; x]."""
    ys, finals, start = [], [], 0
    for n, length in enumerate(lengths):
        prev = torch.zeros(W - 1, D) if states is None else states[n].T  # [W-1, D]
        xt = torch.cat([prev, x[start:start + length].float()])         # x̃: [W-1+L, D]
        for t in range(length):
            y = torch.zeros(D) if bias is None else bias.clone()
            for j in range(W):
                y += weight[:, j] * xt[t + j]
            ys.append(F.silu(y) if activation == "silu" else y)
        finals.append(xt[-(W - 1):].T)
        start += length
    return torch.stack(ys), torch.stack(finals)


@pytest.mark.parametrize("with_states", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("activation", ["silu", None])
def test_conv_matches_direct_formula(with_states, with_bias, activation):
    x, weight, bias, cu, states = conv_inputs(LENGTHS)
    bias = bias if with_bias else None
    states = states if with_states else None
    y, finals = causal_conv1d(x, weight, bias, cu_seqlens=cu, initial_states=states,
                              activation=activation)
    y_ref, finals_ref = direct_conv(x, weight, bias, LENGTHS, states, activation)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(finals, finals_ref)


def test_conv_one_sequence_without_cu_seqlens():
    x, weight, bias, _, _ = conv_inputs([7])
    y, final = causal_conv1d(x, weight, bias)
    y_ref, final_ref = direct_conv(x, weight, bias, [7], None)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(final, final_ref)
    torch.testing.assert_close(final[0], x[-(W - 1):].T)  # the state is the raw last inputs


def test_short_sequence_state_keeps_old_columns():
    """A 1-token sequence's new state = the last 2 columns of its old state, then the token."""
    x, weight, bias, cu, states = conv_inputs(LENGTHS)
    _, finals = causal_conv1d(x, weight, bias, cu_seqlens=cu, initial_states=states)
    torch.testing.assert_close(finals[0], torch.cat([states[0][:, 1:], x[0][:, None]], dim=1))


@pytest.mark.parametrize("split", range(1, 9))
def test_conv_state_continuation_equals_whole(split):
    """Prefill [0, P) then [P, L) starting from the saved conv state = prefill [0, L)."""
    x, weight, bias, _, states = conv_inputs([9])
    h0 = states[:1]
    y_whole, s_whole = causal_conv1d(x, weight, bias, initial_states=h0)
    y1, s1 = causal_conv1d(x[:split], weight, bias, initial_states=h0)
    y2, s2 = causal_conv1d(x[split:], weight, bias, initial_states=s1)
    torch.testing.assert_close(torch.cat([y1, y2]), y_whole)
    torch.testing.assert_close(s2, s_whole)


def test_decode_update_equals_prefill_of_one_more_token():
    """Batch of sequences: prefill L tokens, then one decode step = prefill of L + 1 tokens."""
    lengths = [1, 4, 6]
    x, weight, bias, cu, states = conv_inputs([n + 1 for n in lengths])
    starts = cu[:-1]
    last = starts + torch.tensor(lengths)  # index of each sequence's extra token
    keep = torch.cat([torch.arange(s, e) for s, e in zip(starts.tolist(), last.tolist())])
    cu_short = torch.tensor(cu_offsets(lengths))
    _, s_prefill = causal_conv1d(x[keep], weight, bias, cu_seqlens=cu_short, initial_states=states)
    y_step, s_step = causal_conv1d_update(x[last], s_prefill, weight, bias)
    y_long, s_long = causal_conv1d(x, weight, bias, cu_seqlens=cu, initial_states=states)
    torch.testing.assert_close(y_step, y_long[last])
    torch.testing.assert_close(s_step, s_long)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_conv_keeps_input_dtype(dtype):
    x, weight, bias, cu, states = conv_inputs(LENGTHS, dtype=dtype)
    y, finals = causal_conv1d(x, weight, bias, cu_seqlens=cu, initial_states=states)
    y_step, s_step = causal_conv1d_update(x[:5], finals, weight, bias)
    assert y.dtype == finals.dtype == y_step.dtype == s_step.dtype == dtype
    y_ref, _ = direct_conv(x, weight, bias, LENGTHS, states.to(dtype).float())
    torch.testing.assert_close(y.float(), y_ref, atol=2e-2, rtol=2e-2)
