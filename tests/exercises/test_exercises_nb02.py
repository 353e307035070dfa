"""Notebook 02's checks: the right answers pass, plausible wrong ones fail (stubs: test_exercise_stubs.py).

Every answer is judged through the grader's own path (:func:`exercise_judge.judge_answer`).
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from exercise_judge import judge_answer
from torch.linalg import solve_triangular as SOLVE_TRIANGULAR
from torch.utils._python_dispatch import _disable_current_modes

from mamba_edu.exercises import nb02
from mamba_edu.exercises.core import FAIL, PASS
from mamba_edu.gdn import checkpoint_offsets
from mamba_edu.gdn.chunked import intra_chunk

NB = nb02.NOTEBOOK


# --- exercise 1: the triangular inverse -------------------------------------------------------

def forward_substitution(L, rows=None, dtype=None, transposed=False):
    """A right answer, with switches for the mistakes the check must catch."""
    C = L.shape[0]
    T = torch.eye(C, dtype=L.dtype)
    for s in range(1, C if rows is None else rows(C)):
        T[s] -= (L[:s, s] if transposed else L[s, :s]) @ T[:s]
    return T if dtype is None else T.to(dtype)


def inverse_right(L):
    return forward_substitution(L)


def backward(L):                   # from the bottom row up: the transposed system, (I + L)⁻ᵀ
    C = L.shape[0]
    T = torch.eye(C)
    for s in range(C - 2, -1, -1):
        T[s] -= L[s + 1:, s] @ T[s + 1:]
    return T


def neumann_series(L):             # Σ (−L)^j, j < C: exact algebra, but float32 loses it on correlated keys
    T = P = torch.eye(L.shape[0], dtype=L.dtype)
    for _ in range(1, L.shape[0]):
        P = -P @ L
        T = T + P
    return T


def doubling_product(L):           # (I − L)(I + L²)(I + L⁴)…: the same series, log(C) products
    eye = torch.eye(L.shape[0], dtype=L.dtype)
    T, P, m = eye, -L, 1
    while m < L.shape[0]:
        T, P, m = T @ (eye + P), P @ P, 2 * m
    return T


def float32_hard_coded(L):         # right rows, but T made float32 whatever L is
    return forward_substitution(L.float())


def in_place(L):                   # right values, written over the caller's L
    T = forward_substitution(L)
    L.copy_(T)
    return L


def library_solve(L):              # the forbidden call: torch.linalg
    eye = torch.eye(L.shape[0])
    return torch.linalg.solve_triangular(eye + L, eye, upper=False, unitriangular=True)


def in_a_thread(solve):
    """``solve`` run in a worker thread, where the op recorder of the judged call does not look."""
    def answer(L):
        with ThreadPoolExecutor(1) as workers:
            return workers.submit(solve, L).result()
    return answer


def by_library(solve):
    """T from ``solve(I + L, I)`` in float32, given back in L's dtype: right but for the call."""
    def answer(L):
        eye = torch.eye(L.shape[0])
        return solve(eye + L.float(), eye).to(L.dtype)
    return answer


saved_solve = by_library(lambda A, eye: SOLVE_TRIANGULAR(A, eye, upper=False))  # a reference taken earlier
aten_solve = by_library(lambda A, eye: torch.ops.aten.linalg_solve_triangular(A, eye, upper=False))
method_inverse = by_library(lambda A, eye: A.inverse())


def thread_swallowing(L):          # the thread's error swallowed: forward substitution if it failed
    out = {}

    def solve():
        try:
            out["T"] = torch.inverse(torch.eye(L.shape[0]) + L.float())
        except RuntimeError:
            pass
    worker = threading.Thread(target=solve)
    worker.start()
    worker.join()
    return out["T"].to(L.dtype) if "T" in out else forward_substitution(L)


def modes_off(L):                  # torch's dispatch modes (the op recorder) switched off
    with _disable_current_modes():
        return saved_solve(L)


WRONG_1 = {
    "I - L (first-order series)": lambda L: torch.eye(L.shape[0]) - L,
    "I - L + L² (second order)": lambda L: torch.eye(L.shape[0]) - L + L @ L,
    "backward substitution": backward,
    "the last row forgotten (off by one)": lambda L: forward_substitution(L, rows=lambda C: C - 1),
    "L's columns instead of its rows": lambda L: forward_substitution(L, transposed=True),
    "float64 result": lambda L: forward_substitution(L, dtype=torch.float64),
    "torch.linalg.solve_triangular (forbidden)": library_solve,
    "torch.linalg.inv (forbidden)": lambda L: torch.linalg.inv(torch.eye(L.shape[0]) + L),
    "the full Neumann series (off on correlated keys)": neumann_series,
    "the doubling product of the series (off on correlated keys)": doubling_product,
    "float32 hard-coded (a bf16 L gives a float32 T)": float32_hard_coded,
    "L overwritten with T (input mutation)": in_place,
    "torch.linalg.solve_triangular in a worker thread": in_a_thread(saved_solve),
    "torch.ops.aten.linalg_solve_triangular in a worker thread": in_a_thread(aten_solve),
    "Tensor.inverse in a worker thread": in_a_thread(method_inverse),
    "torch.inverse in a thread, its error swallowed": thread_swallowing,
    "torch.linalg with torch's modes switched off": modes_off,
}


def test_inverse_accepts_the_right_answer():
    assert judge_answer(NB, 1, inverse_right).status == PASS


@pytest.mark.parametrize("mistake", sorted(WRONG_1))
def test_inverse_rejects(mistake):
    verdict = judge_answer(NB, 1, WRONG_1[mistake])
    assert verdict.status == FAIL, verdict


def test_inverse_says_why():
    assert "C=7" in judge_answer(NB, 1, WRONG_1["I - L (first-order series)"]).message
    assert "linalg_solve_triangular" in judge_answer(NB, 1, library_solve).message
    assert "correlated keys" in judge_answer(NB, 1, neumann_series).message
    assert "bfloat16" in judge_answer(NB, 1, float32_hard_coded).message
    assert "in place" in judge_answer(NB, 1, in_place).message
    assert "torch.linalg (linalg_solve_triangular)" in judge_answer(NB, 1, in_a_thread(saved_solve)).message


@pytest.mark.parametrize("answer", [inverse_right, in_a_thread(saved_solve)], ids=["right", "refused"])
def test_inverse_puts_torch_linalg_back(answer):
    """The ops are absent for the judged call only, whatever its verdict."""
    judge_answer(NB, 1, answer)
    L = torch.tril(torch.rand(4, 4), -1)
    eye = torch.eye(4)
    for solve in (lambda: SOLVE_TRIANGULAR(eye + L, eye, upper=False), lambda: (eye + L).inverse(),
                  lambda: torch.linalg.inv(eye + L)):
        torch.testing.assert_close((eye + L) @ solve(), eye)


# --- exercise 2: the checkpoint row ---------------------------------------------------------------

def checkpoint_row(lengths, n, tokens, chunks=lambda L: -(-L // 64), final_too=False, shift=0, as_type=int):
    """A right answer, with switches for the mistakes the check must catch."""
    if tokens % 64 or tokens > lengths[n] or (tokens == lengths[n] and not final_too):
        return None
    return as_type(sum(chunks(L) for L in lengths[:n]) + tokens // 64 + shift)


def checkpoint_row_right(lengths, n, tokens):
    return checkpoint_row(lengths, n, tokens)


def _row(**switch):
    return lambda lengths, n, tokens: checkpoint_row(lengths, n, tokens, **switch)


WRONG_2 = {
    "L // 64 + 1 rows per sequence": _row(chunks=lambda L: L // 64 + 1),
    "L // 64 rows per sequence": _row(chunks=lambda L: L // 64),
    "the chunk a prefix ends in (off by one)": _row(shift=1),
    "the final state as a row": _row(final_too=True),
    "rows counted over the packed batch (T // 64)": lambda lengths, n, tokens: (
        None if tokens % 64 or tokens >= lengths[n] else (sum(lengths[:n]) + tokens) // 64),
    "a float row": _row(as_type=float),
    "checkpoint_offsets (forbidden)": lambda lengths, n, tokens: (
        None if tokens % 64 or tokens >= lengths[n] else checkpoint_offsets(lengths)[n] + tokens // 64),
    "checkpoint_offsets under another name (forbidden)": lambda lengths, n, tokens, offsets=checkpoint_offsets: (
        None if tokens % 64 or tokens >= lengths[n] else offsets(lengths)[n] + tokens // 64),
    "a numpy integer row": _row(as_type=np.int64),
    "any token count rounded down to its chunk's row": lambda lengths, n, tokens: (
        None if tokens >= lengths[n] else checkpoint_row(lengths, n, tokens - tokens % 64)),
}


def test_checkpoint_row_accepts_the_right_answer():
    assert judge_answer(NB, 2, checkpoint_row_right).status == PASS


@pytest.mark.parametrize("mistake", sorted(WRONG_2))
def test_checkpoint_row_rejects(mistake):
    verdict = judge_answer(NB, 2, WRONG_2[mistake])
    assert verdict.status == FAIL, verdict


def test_checkpoint_row_says_why():
    assert "expected None" in judge_answer(NB, 2, WRONG_2["the final state as a row"]).message
    assert "checkpoint_offsets" in judge_answer(NB, 2, WRONG_2["checkpoint_offsets (forbidden)"]).message
    assert "expected an int" in judge_answer(NB, 2, WRONG_2["a float row"]).message


# --- exercise 3: one chunk ----------------------------------------------------------------------------

def wy_chunk(q, k, v, g, beta, S0, scale, mask_first=True, decay_to_end=True, inclusive=True,
             inter=True, carry=True, dtype=torch.float32, scaled=True, work=torch.float32, in_place=False):
    """One chunk in the WY form, with switches for the mistakes the check must catch."""
    C = g.shape[0]
    if work != torch.float32:                              # the whole chunk in a narrower dtype
        q, k, v, g, beta, S0 = (t.to(work) for t in (q, k, v, g, beta, S0))
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
    O = (scale if scaled else 1.0) * ((q * gamma.exp().float()[:, None]) @ S0 * inter
                                      + ((q @ k.T) * masked_exp(causal)) @ v_new)
    # Each token's write decays from its own position to the chunk's end: exp(Γ_C − Γ_s).
    to_end = (gamma[-1] - gamma) if decay_to_end else gamma
    if in_place:                                           # S0 decayed where it lies: the caller's tensor
        S_next = S0.mul_(gamma[-1].exp().float()).add_((k * to_end.exp().float()[:, None]).T @ v_new)
    else:
        S_next = gamma[-1].exp().float() * S0 * carry + (k * to_end.exp().float()[:, None]).T @ v_new
    return O.to(dtype), S_next.to(dtype)


def chunk_right(q, k, v, g, beta, S0, scale):
    return wy_chunk(q, k, v, g, beta, S0, scale)


def chunk_with_package_factors(q, k, v, g, beta, S0, scale):
    """The forbidden call: U and W from the package's intra_chunk."""
    gamma, U, W = intra_chunk(k, v, g, beta)
    C = g.shape[0]
    v_new = U - W @ S0
    keep = torch.ones(C, C, dtype=torch.bool).tril()
    M = (gamma[:, None] - gamma[None, :]).masked_fill(~keep, float("-inf")).exp().float()
    O = scale * ((q * gamma.exp().float()[:, None]) @ S0 + ((q @ k.T) * M) @ v_new)
    S_next = gamma[-1].exp().float() * S0 + (k * (gamma[-1] - gamma).exp().float()[:, None]).T @ v_new
    return O, S_next


def test_chunk_helper_is_right():
    """The wrong answers below differ from a right one by one switch each."""
    assert judge_answer(NB, 3, chunk_right).status == PASS


def _chunk(**switch):
    return lambda q, k, v, g, beta, S0, scale: wy_chunk(q, k, v, g, beta, S0, scale, **switch)


WRONG_3 = {
    "exponential before the mask (NaN with strong gates)": _chunk(mask_first=False),
    "writes decayed from the chunk's start": _chunk(decay_to_end=False),
    "M without its diagonal": _chunk(inclusive=False),
    "O without the entering state's part": _chunk(inter=False),
    "S_next without the decayed S0": _chunk(carry=False),
    "float64 results": _chunk(dtype=torch.float64),
    "no scale on O": _chunk(scaled=False),
    "computed in float16, returned as float32": _chunk(work=torch.float16),
    "S0 decayed in place (input mutation)": _chunk(in_place=True),
    "the package's intra_chunk (forbidden)": chunk_with_package_factors,
}


@pytest.mark.parametrize("mistake", sorted(WRONG_3))
def test_chunk_rejects(mistake):
    verdict = judge_answer(NB, 3, WRONG_3[mistake])
    assert verdict.status == FAIL, verdict
