"""Notebook 02's checks reject plausible wrong answers and report a stub as not done."""

import pytest
import torch

from mamba_edu.exercises import nb02
from mamba_edu.exercises.core import FAIL, NOT_DONE, judge, lookup
from mamba_edu.gdn import checkpoint_offsets

NB = nb02.NOTEBOOK


def stub(*args):
    raise NotImplementedError("hint: …")


@pytest.mark.parametrize("number", [1, 2, 3])
def test_stub_is_not_done(number):
    assert judge(lookup(NB, number), stub).status == NOT_DONE


# --- exercise 1: the triangular inverse -------------------------------------------------------

def test_inverse_rejects_first_order_guess():
    """``I − L`` is only the first term of the series (I + L)⁻¹ = I − L + L² − …"""
    verdict = judge(lookup(NB, 1), lambda L: torch.eye(L.shape[0]) - L)
    assert verdict.status == FAIL and "C=7" in verdict.message


def test_inverse_rejects_backward_substitution():
    """Solving from the bottom row up (the transposed system) gives (I + L)⁻ᵀ."""
    def backward(L):
        C = L.shape[0]
        T = torch.eye(C)
        for s in range(C - 2, -1, -1):
            T[s] -= L[s + 1:, s] @ T[s + 1:]
        return T
    assert judge(lookup(NB, 1), backward).status == FAIL


def test_inverse_rejects_a_library_solve():
    def library(L):
        eye = torch.eye(L.shape[0])
        return torch.linalg.solve_triangular(eye + L, eye, upper=False, unitriangular=True)
    verdict = judge(lookup(NB, 1), library)
    assert verdict.status == FAIL and "linalg_solve_triangular" in verdict.message


# --- exercise 2: the checkpoint row ---------------------------------------------------------------

def test_checkpoint_row_rejects_off_by_one_chunk():
    """Counting the chunk a prefix *ends in* instead of the number of whole chunks before it."""
    def off_by_one(lengths, n, tokens):
        if tokens % 64 or tokens >= lengths[n]:
            return None
        return checkpoint_offsets(lengths)[n] + tokens // 64 + 1
    verdict = judge(lookup(NB, 2), off_by_one)
    assert verdict.status == FAIL and "expected" in verdict.message


def test_checkpoint_row_rejects_final_state_as_a_row():
    """The state after all of a 64-token prompt is its final state, not a checkpoint row."""
    def final_too(lengths, n, tokens):
        if tokens % 64 or tokens > lengths[n]:
            return None
        return checkpoint_offsets(lengths)[n] + tokens // 64
    verdict = judge(lookup(NB, 2), final_too)
    assert verdict.status == FAIL and "expected None" in verdict.message


# --- exercise 3: one chunk ----------------------------------------------------------------------------

def wy_chunk(q, k, v, g, beta, S0, scale, mask_first=True, decay_to_end=True, inclusive=True):
    """One chunk in the WY form, with switches for the mistakes the check must catch."""
    C = g.shape[0]
    gamma = g.double().cumsum(0)
    diff = gamma[:, None] - gamma[None, :]

    def masked_exp(keep):
        if mask_first:
            return diff.masked_fill(~keep, float("-inf")).exp().float()
        return diff.exp().float() * keep                   # inf · 0 = NaN above the diagonal

    strict = torch.ones(C, C, dtype=torch.bool).tril(-1)
    L = beta[:, None] * (k @ k.T) * masked_exp(strict)
    eye = torch.eye(C)
    T = torch.linalg.solve_triangular(eye + L, eye, upper=False, unitriangular=True)
    U, W = T @ (beta[:, None] * v), T @ ((beta * gamma.exp().float())[:, None] * k)
    v_new = U - W @ S0
    causal = torch.ones(C, C, dtype=torch.bool).tril(0 if inclusive else -1)
    O = scale * ((q * gamma.exp().float()[:, None]) @ S0 + ((q @ k.T) * masked_exp(causal)) @ v_new)
    # Each token's write decays from its own position to the chunk's end: exp(Γ_C − Γ_s).
    to_end = (gamma[-1] - gamma) if decay_to_end else gamma
    S_next = gamma[-1].exp().float() * S0 + (k * to_end.exp().float()[:, None]).T @ v_new
    return O, S_next


def test_chunk_helper_is_right():
    """The wrong answers below differ from a right one by one switch each."""
    assert judge(lookup(NB, 3), wy_chunk).status == "pass"


@pytest.mark.parametrize("mistake", [
    dict(mask_first=False),      # exponential before the mask: NaN with strong gates
    dict(decay_to_end=False),    # decay applied from the chunk's start instead of to its end
    dict(inclusive=False),       # a token does not read its own write
])
def test_chunk_rejects(mistake):
    verdict = judge(lookup(NB, 3), lambda *a: wy_chunk(*a, **mistake))
    assert verdict.status == FAIL, mistake
