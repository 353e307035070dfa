"""Bad inputs raise ValueError with a message that names the offending argument."""

import pytest
import torch

from mamba_edu.gdn import (causal_conv1d, causal_conv1d_update, chunk_gated_delta_rule, gdn_gating,
                           recurrent_gated_delta_rule)

T, H, HV, K, V = 6, 2, 4, 8, 4
GDN = [recurrent_gated_delta_rule, chunk_gated_delta_rule]


def valid():
    """A valid two-sequence call (lengths 2 and 4); each test breaks one thing."""
    return dict(q=torch.randn(T, H, K), k=torch.randn(T, H, K), v=torch.randn(T, HV, V),
                g=-torch.rand(T, HV), beta=torch.rand(T, HV), cu_seqlens=torch.tensor([0, 2, 6]),
                initial_state=torch.zeros(2, HV, K, V))


@pytest.mark.parametrize("fn", GDN)
def test_valid_call_runs(fn):
    assert fn(**valid()).final_state.shape == (2, HV, K, V)


BAD = {
    "q without the head dim": ({"q": torch.randn(T, K)}, "q must have 3 dims"),
    "integer q": ({"q": torch.ones(T, H, K, dtype=torch.int64)}, "q must be a floating"),
    "k with other K": ({"k": torch.randn(T, H, K + 1)}, r"k must have q's shape"),
    "k with other heads": ({"k": torch.randn(T, H + 1, K)}, r"k must have q's shape"),
    "v with other T": ({"v": torch.randn(T + 1, HV, V)}, r"v must have T=6"),
    "HV not a multiple of H": ({"v": torch.randn(T, 3, V)}, r"v's heads HV=3 must be a multiple"),
    "g over the key heads": ({"g": torch.randn(T, H)}, r"g must have shape \[T, HV\]"),
    "beta with other T": ({"beta": torch.rand(T - 1, HV)}, r"beta must have shape \[T, HV\]"),
    "float cu_seqlens": ({"cu_seqlens": torch.tensor([0.0, 2.0, 6.0])}, "cu_seqlens must be an integer"),
    "float list cu_seqlens": ({"cu_seqlens": [0, 2.0, 6]}, "cu_seqlens must hold integers"),
    "bool cu_seqlens": ({"cu_seqlens": torch.tensor([False, True])}, "cu_seqlens must be an integer"),
    "2-D cu_seqlens": ({"cu_seqlens": torch.tensor([[0, 2, 6]])}, "cu_seqlens must be 1-D"),
    "cu_seqlens of one entry": ({"cu_seqlens": torch.tensor([6])}, "cu_seqlens must have N"),
    "non-monotone cu_seqlens": ({"cu_seqlens": torch.tensor([0, 4, 2, 6])}, "cu_seqlens must be strictly"),
    "empty sequence": ({"cu_seqlens": torch.tensor([0, 2, 2, 6])}, "cu_seqlens must be strictly"),
    "cu_seqlens[-1] != T": ({"cu_seqlens": torch.tensor([0, 2, 5])}, "cu_seqlens must end at T=6"),
    "cu_seqlens not from 0": ({"cu_seqlens": torch.tensor([1, 2, 6])}, "cu_seqlens must start at 0"),
    "initial_state for 3 sequences": ({"initial_state": torch.zeros(3, HV, K, V)}, "initial_state must have shape"),
    "initial_state over key heads": ({"initial_state": torch.zeros(2, H, K, V)}, "initial_state must have shape"),
    "initial_state transposed": ({"initial_state": torch.zeros(2, HV, V, K)}, "initial_state must have shape"),
    "q on another device": ({"q": torch.randn(T, H, K, device="meta")}, "one device"),
}


@pytest.mark.parametrize("fn", GDN)
@pytest.mark.parametrize("case", list(BAD))
def test_bad_gdn_inputs_name_the_argument(fn, case):
    change, message = BAD[case]
    with pytest.raises(ValueError, match=message):
        fn(**{**valid(), **change})


@pytest.mark.parametrize("fn", GDN)
def test_zero_tokens_rejected(fn):
    x = {name: t[:0] for name, t in valid().items() if name in ("q", "k", "v", "g", "beta")}
    with pytest.raises(ValueError, match="T=0"):
        fn(**x)


GATING = {
    "a and b differ": (dict(b=torch.zeros(3, HV + 1)), "a and b must both be"),
    "1-D a and b": (dict(a=torch.zeros(HV), b=torch.zeros(HV)), "a and b must both be"),
    "A_log per key head": (dict(A_log=torch.zeros(H)), r"A_log must have shape \[HV\]"),
    "dt_bias with a token dim": (dict(dt_bias=torch.zeros(1, HV)), r"dt_bias must have shape \[HV\]"),
}


@pytest.mark.parametrize("case", list(GATING))
def test_bad_gating_inputs_name_the_argument(case):
    args = dict(A_log=torch.zeros(HV), a=torch.zeros(3, HV), b=torch.zeros(3, HV), dt_bias=torch.zeros(HV))
    change, message = GATING[case]
    with pytest.raises(ValueError, match=message):
        gdn_gating(**{**args, **change})


D, W = 6, 4
CONV = {
    "1-D x": (dict(x=torch.randn(D)), "x must be"),
    "weight for other D": (dict(weight=torch.randn(D + 1, W)), r"weight must have shape \[D, W\]"),
    "bias for other D": (dict(bias=torch.randn(D - 1)), r"bias must have shape \[D\]"),
    "initial_states of width W": (dict(initial_states=torch.zeros(2, D, W)), "initial_states must have shape"),
    "bad cu_seqlens": (dict(cu_seqlens=torch.tensor([0, 3, 4])), "cu_seqlens must end at T=5"),
    "unknown activation": (dict(activation="relu"), "activation must be"),
}


@pytest.mark.parametrize("case", list(CONV))
def test_bad_conv_inputs_name_the_argument(case):
    args = dict(x=torch.randn(5, D), weight=torch.randn(D, W), bias=torch.randn(D),
                cu_seqlens=torch.tensor([0, 2, 5]), initial_states=torch.zeros(2, D, W - 1))
    change, message = CONV[case]
    with pytest.raises(ValueError, match=message):
        causal_conv1d(**{**args, **change})


@pytest.mark.parametrize("change,message", [
    (dict(conv_state=torch.zeros(3, D, W - 1)), "conv_state must have shape"),
    (dict(conv_state=torch.zeros(2, D, W)), "conv_state must have shape"),
    (dict(x=torch.randn(2, 1, D)), "x must be"),
    (dict(weight=torch.randn(D, W, 1)), "weight must have shape"),
])
def test_bad_conv_update_inputs_name_the_argument(change, message):
    args = dict(x=torch.randn(2, D), conv_state=torch.zeros(2, D, W - 1), weight=torch.randn(D, W))
    with pytest.raises(ValueError, match=message):
        causal_conv1d_update(**{**args, **change})
