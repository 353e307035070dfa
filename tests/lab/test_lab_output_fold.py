"""The lab's output fold (mamba_edu/lab/output_fold.py): O = O_local + Q_h·S for any start state,
and equal to the chunked reference's output of a one-chunk sequence."""

import torch
from hypothesis import given, settings, strategies as st

from mamba_edu.gdn import chunk_gated_delta_rule
from mamba_edu.lab.output_fold import chunk_output, fold_output
from mamba_edu.testing import rel_err


def _chunk(C, K, V, seed):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    q, k = (torch.nn.functional.normalize(randn(C, K), dim=-1) for _ in range(2))
    g = -0.2 * torch.rand(C, generator=gen, dtype=torch.float64)
    beta = torch.rand(C, generator=gen, dtype=torch.float64)
    return q, k, randn(C, V), g, beta, randn(K, V)


@settings(max_examples=20, deadline=None)
@given(C=st.integers(1, 64), K=st.sampled_from([4, 16]), V=st.sampled_from([3, 8]),
       seed=st.integers(0, 999))
def test_fold_is_the_output_for_any_start_state(C, K, V, seed):
    q, k, v, g, beta, S = _chunk(C, K, V, seed)
    O_local, Q_h = fold_output(q, k, v, g, beta, K ** -0.5)
    assert rel_err(O_local + Q_h @ S, chunk_output(q, k, v, g, beta, K ** -0.5, S)) < 1e-12
    assert rel_err(O_local, chunk_output(q, k, v, g, beta, K ** -0.5, 0 * S)) < 1e-12


def test_fold_matches_the_chunked_reference():
    C, K, V = 50, 16, 8
    q, k, v, g, beta, S = _chunk(C, K, V, seed=3)
    O_local, Q_h = fold_output(q, k, v, g, beta, K ** -0.5)
    ref = chunk_gated_delta_rule(q[:, None].float(), k[:, None].float(), v[:, None].float(),
                                 g[:, None].float(), beta[:, None].float(),
                                 initial_state=S[None, None].float(),
                                 cu_seqlens=torch.tensor([0, C]))
    assert rel_err((O_local + Q_h @ S).float(), ref.o[:, 0]) < 1e-5
