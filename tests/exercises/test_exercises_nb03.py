"""Notebook 03's checks: the right answers pass, plausible wrong ones fail, a stub is "not done".

Every answer is judged through the grader's own path (:func:`exercise_judge.judge_answer`: the
check requires a real ``@triton.jit`` kernel, written in the notebook, and launches it). The kernels run in Triton's interpreter on a CPU.
"""

import pytest
import torch
import triton
import triton.language as tl
from exercise_judge import judge_answer

from mamba_edu.exercises.core import FAIL, NOT_DONE, PASS
from mamba_edu.exercises.nb03 import NOTEBOOK as NB
from mamba_edu.kernels import prefill, tiles


def _stub(*args, **kwargs):
    raise NotImplementedError("hint: write it")


def _rejected(number, wrong, phrase=None):
    verdict = judge_answer(NB, number, wrong)
    assert verdict.status == FAIL, verdict
    if phrase:
        assert phrase in verdict.message, verdict.message


# --- exercise 1 -------------------------------------------------------------------------------

@triton.jit
def _stub_l2norm_kernel(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr,
                        ROWS: tl.constexpr):
    raise NotImplementedError("hint: write the kernel")


@triton.jit
def _l2norm(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr,
            EPS_INSIDE: tl.constexpr, EPS: tl.constexpr, USE_STRIDE: tl.constexpr, MASK_ROWS: tl.constexpr,
            OUT_STRIDE_X: tl.constexpr):
    """The right kernel, with switches for the mistakes the check must catch."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    mask = (rows < n_rows)[:, None] & (cols < D)[None, :]
    if USE_STRIDE:
        x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    else:
        x = tl.load(x_ptr + rows[:, None] * D + cols[None, :], mask=mask, other=0.0)
    if EPS_INSIDE:
        y = x / tl.sqrt(tl.sum(x * x, 1) + EPS)[:, None]
    else:
        y = x / (tl.sqrt(tl.sum(x * x, 1)) + EPS)[:, None]
    store_mask = mask if MASK_ROWS else (cols < D)[None, :]
    if OUT_STRIDE_X:
        tl.store(y_ptr + rows[:, None] * stride_x + cols[None, :], y, mask=store_mask)
    else:
        tl.store(y_ptr + rows[:, None] * D + cols[None, :], y, mask=store_mask)


# Each variant kernel is written out (the grader needs its source in the "notebook", this file).
@triton.jit
def l2norm_right(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr):
    _l2norm(x_ptr, y_ptr, n_rows, stride_x, D, BD, ROWS, True, 1e-6, True, True, False)


@triton.jit
def l2norm_eps_outside(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr):
    _l2norm(x_ptr, y_ptr, n_rows, stride_x, D, BD, ROWS, False, 1e-6, True, True, False)


@triton.jit
def l2norm_no_eps(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr):
    _l2norm(x_ptr, y_ptr, n_rows, stride_x, D, BD, ROWS, True, 0.0, True, True, False)


@triton.jit
def l2norm_ignores_stride(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr):
    _l2norm(x_ptr, y_ptr, n_rows, stride_x, D, BD, ROWS, True, 1e-6, False, True, False)


@triton.jit
def l2norm_unmasked_rows(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr):
    _l2norm(x_ptr, y_ptr, n_rows, stride_x, D, BD, ROWS, True, 1e-6, True, False, False)


@triton.jit
def l2norm_output_with_x_stride(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr,
                                ROWS: tl.constexpr):
    _l2norm(x_ptr, y_ptr, n_rows, stride_x, D, BD, ROWS, True, 1e-6, True, True, True)


@triton.jit
def l2norm_package_helper(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    mask = (rows < n_rows)[:, None] & (cols < D)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    tl.store(y_ptr + rows[:, None] * D + cols[None, :], tiles.l2norm_rows(x, True), mask=mask)


@triton.jit
def l2norm_unmasked_columns(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr,
                            ROWS: tl.constexpr):
    """The store masks the rows only: columns D … BD-1 spill into the next row (and past the last)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    mask = (rows < n_rows)[:, None] & (cols < D)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    y = x / tl.sqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    tl.store(y_ptr + rows[:, None] * D + cols[None, :], y, mask=(rows < n_rows)[:, None])


@triton.jit
def l2norm_unmasked_row_load(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr,
                             ROWS: tl.constexpr):
    """The load masks the columns only (the last block reads rows past x); the store masks both."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=(cols < D)[None, :], other=0.0)
    y = x / tl.sqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    tl.store(y_ptr + rows[:, None] * D + cols[None, :], y, mask=(rows < n_rows)[:, None] & (cols < D)[None, :])


@triton.jit
def l2norm_in_float16(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr, ROWS: tl.constexpr):
    """The row loaded as float16 (half the traffic), normalised there."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    mask = (rows < n_rows)[:, None] & (cols < D)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float16)
    y = x / tl.sqrt(tl.sum(x * x, 1) + 1e-6).to(tl.float16)[:, None]
    tl.store(y_ptr + rows[:, None] * D + cols[None, :], y.to(tl.float32), mask=mask)


def l2norm_in_torch(x_ptr, y_ptr, n_rows, stride_x, D, BD, ROWS):
    """A torch answer with the right signature: not a kernel."""
    y_ptr[:n_rows] = x_ptr * torch.rsqrt((x_ptr * x_ptr).sum(-1, keepdim=True) + 1e-6)


def test_l2norm_kernel():
    assert judge_answer(NB, 1, _stub_l2norm_kernel).status == NOT_DONE
    assert judge_answer(NB, 1, l2norm_right).status == PASS


@pytest.mark.parametrize("wrong,phrase", [
    (l2norm_eps_outside, None), (l2norm_no_eps, None), (l2norm_ignores_stride, None),
    (l2norm_unmasked_rows, "wrote past row n_rows-1"), (l2norm_output_with_x_stride, None),
    (l2norm_package_helper, "calls mamba_edu.kernels"), (l2norm_in_torch, "not a Triton kernel"),
    (l2norm_unmasked_columns, "wrote past row n_rows-1"), (l2norm_in_float16, None),
    (l2norm_unmasked_row_load, "loaded elements outside rows")],
    ids=lambda w: getattr(w, "__name__", None) or getattr(getattr(w, "fn", None), "__name__", "phrase"))
def test_l2norm_kernel_rejects(wrong, phrase):
    _rejected(1, wrong, phrase)


# --- exercise 2 -------------------------------------------------------------------------------

def program_counts(lengths, H, HV, K, V, chunks=lambda n: -(-n // 64), output_tiles=lambda NT, N, HV: NT * HV,
                   threshold=2 * 132, strict=True, scan_tile=True, output=True):
    """The right counts, with switches for the mistakes the check must catch."""
    NT = sum(chunks(n) for n in lengths)
    chains = len(lengths) * HV
    whole = max(64, triton.next_power_of_2(V))
    bv = next((b for b in (64, 32) if chains * triton.cdiv(V, b) >= 128), 16) if scan_tile else 64
    bv = min(bv, whole)
    tiles_ = output_tiles(NT, len(lengths), HV)
    narrow = tiles_ < threshold if strict else tiles_ <= threshold
    bv_out = 64 if whole > 64 and narrow else whole
    counts = dict(prepare=NT * HV, scan=triton.cdiv(V, bv) * chains, scan_steps=max(chunks(n) for n in lengths))
    if output:
        counts["output"] = triton.cdiv(V, bv_out) * NT * HV
    return counts


def counts_right(lengths, H, HV, K, V):
    return program_counts(lengths, H, HV, K, V)


def _counts(**switch):
    return lambda lengths, H, HV, K, V: program_counts(lengths, H, HV, K, V, **switch)


def counts_from_the_oracle(lengths, H, HV, K, V):     # the check's private oracle (forbidden)
    from mamba_edu.exercises.nb03 import _expected_counts
    return _expected_counts(lengths, H, HV, K, V)


WRONG_2 = {
    "⌊L/64⌋ chunks (off by one)": _counts(chunks=lambda n: n // 64),
    "chunks straddling sequences (⌈T/64⌉)": lambda lengths, H, HV, K, V: {
        **program_counts(lengths, H, HV, K, V), "prepare": triton.cdiv(sum(lengths), 64) * HV},
    "a fixed scan V-tile of 64": _counts(scan_tile=False),
    "no output kernel": _counts(output=False),
    "output tile threshold at 132 tiles": _counts(threshold=132),
    "output tile threshold at 4·132 tiles": _counts(threshold=4 * 132),
    "output tile threshold with <=": _counts(strict=False),
    "output tile threshold on chains, not tiles": _counts(output_tiles=lambda NT, N, HV: N * HV),
    "the check's oracle (forbidden)": counts_from_the_oracle,
    "the notebook's measurement, called (forbidden)": lambda lengths, H, HV, K, V: measured_by_the_notebook(
        lengths, H, HV, K, V),
}


def measured_by_the_notebook(lengths, H, HV, K, V):  # the measuring cell's function, not a prediction
    from mamba_edu.exercises.nb03 import launched_programs
    return launched_programs(lengths, H, HV, K, V)


def test_program_counts_accepts_the_right_answer():
    assert judge_answer(NB, 2, _stub).status == NOT_DONE
    assert judge_answer(NB, 2, counts_right).status == PASS


@pytest.mark.parametrize("mistake", sorted(WRONG_2))
def test_program_counts_rejects(mistake):
    _rejected(2, WRONG_2[mistake])


# --- exercise 3 -------------------------------------------------------------------------------

@triton.jit
def _stub_recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr,
                           scale, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                           V: tl.constexpr):
    raise NotImplementedError("hint: write the kernel")


@triton.jit
def _recurrent(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               INTERLEAVED: tl.constexpr, READ_BEFORE_DECAY: tl.constexpr, READ_BEFORE_WRITE: tl.constexpr,
               SCALED: tl.constexpr, FROM_ZERO: tl.constexpr, GROUP: tl.constexpr, EXTRA: tl.constexpr):
    """The right kernel, with switches for the mistakes the check must catch (``GROUP`` > 0: that
    head group hard-coded; ``EXTRA``: tokens read past the sequence's end)."""
    seq = tl.program_id(0)
    hv = tl.program_id(1)
    if INTERLEAVED:
        hk = hv % H
    elif GROUP > 0:
        hk = hv // GROUP
    else:
        hk = hv // (HV // H)
    bos = tl.load(cu_ptr + seq)
    eos = tl.load(cu_ptr + seq + 1)
    rk = tl.arange(0, K)
    rv = tl.arange(0, V)
    state = ((seq * HV + hv) * K + rk[:, None]) * V + rv[None, :]
    S = tl.load(h0_ptr + state)
    if FROM_ZERO:
        S = S * 0.0
    for t in range(bos, eos + EXTRA):
        q = tl.load(q_ptr + (t * H + hk) * K + rk)
        k = tl.load(k_ptr + (t * H + hk) * K + rk)
        v = tl.load(v_ptr + (t * HV + hv) * V + rv)
        decay = tl.exp(tl.load(g_ptr + t * HV + hv))
        if READ_BEFORE_DECAY:
            v_new = tl.load(beta_ptr + t * HV + hv) * (v - tl.sum(S * k[:, None], 0))
            S = S * decay
        else:
            S = S * decay
            v_new = tl.load(beta_ptr + t * HV + hv) * (v - tl.sum(S * k[:, None], 0))
        o = tl.sum(S * q[:, None], 0)
        S = S + k[:, None] * v_new[None, :]
        if not READ_BEFORE_WRITE:
            o = tl.sum(S * q[:, None], 0)
        if SCALED:
            o = scale * o
        tl.store(o_ptr + (t * HV + hv) * V + rv, o)
    tl.store(ht_ptr + state, S)


@triton.jit
def recurrent_right(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale,
                    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _recurrent(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale, H, HV, K, V,
               False, False, False, True, False, 0, 0)


@triton.jit
def recurrent_interleaved(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale,
                          H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _recurrent(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale, H, HV, K, V,
               True, False, False, True, False, 0, 0)


@triton.jit
def recurrent_read_before_decay(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale,
                                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _recurrent(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale, H, HV, K, V,
               False, True, False, True, False, 0, 0)


@triton.jit
def recurrent_read_before_write(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale,
                                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _recurrent(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale, H, HV, K, V,
               False, False, True, True, False, 0, 0)


@triton.jit
def recurrent_unscaled(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale,
                       H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _recurrent(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale, H, HV, K, V,
               False, False, False, False, False, 0, 0)


@triton.jit
def recurrent_from_zero(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _recurrent(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale, H, HV, K, V,
               False, False, False, True, True, 0, 0)


@triton.jit
def recurrent_group_of_two(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale,
                           H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _recurrent(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale, H, HV, K, V,
               False, False, False, True, False, 2, 0)


@triton.jit
def recurrent_one_token_too_many(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale,
                                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _recurrent(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale, H, HV, K, V,
               False, False, False, True, False, 0, 1)


def recurrent_in_torch(q, k, v, g, beta, o, h0, ht, cu, scale, H, HV, K, V):
    """A torch answer with the right signature: not a kernel."""
    raise AssertionError("never launched")


def test_recurrent_kernel():
    assert judge_answer(NB, 3, _stub_recurrent_kernel).status == NOT_DONE
    assert judge_answer(NB, 3, recurrent_right).status == PASS


@pytest.mark.parametrize("wrong,phrase", [
    (recurrent_interleaved, None), (recurrent_read_before_decay, None), (recurrent_read_before_write, None),
    (recurrent_unscaled, None), (recurrent_from_zero, None), (recurrent_in_torch, "not a Triton kernel"),
    (prefill.chunk_scan_kernel, None),  # refused: a Heuristics wrapper, the package's own kernel
    (recurrent_group_of_two, "HV=8"), (recurrent_one_token_too_many, None)],
    ids=["interleaved", "read_before_decay", "read_before_write", "unscaled", "from_zero", "torch",
         "package_kernel", "group_of_two", "one_token_too_many"])
def test_recurrent_kernel_rejects(wrong, phrase):
    _rejected(3, wrong, phrase)


# --- exercise 4 -------------------------------------------------------------------------------

@triton.jit
def _stub_chunk_step_kernel(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr,
                            C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    raise NotImplementedError("hint: write the kernel")


@triton.jit
def _chunk_step(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr,
                C: tl.constexpr, K: tl.constexpr, V: tl.constexpr, TO_END: tl.constexpr, LAST_OF_TILE: tl.constexpr,
                CARRY: tl.constexpr, CORRECT: tl.constexpr, MASK_STORE: tl.constexpr, MASK_LOADS: tl.constexpr,
                FP16: tl.constexpr, UPDATE: tl.constexpr):
    """The right kernel, with switches for the mistakes the check must catch."""
    i = tl.program_id(0)
    n = tl.load(n_ptr + i)
    r, rk, rv = tl.arange(0, C), tl.arange(0, K), tl.arange(0, V)
    if MASK_LOADS:
        valid = r < n
    else:
        valid = r < C
    k = tl.load(k_ptr + (i * C + r[:, None]) * K + rk[None, :], mask=valid[:, None], other=0.0)
    w = tl.load(w_ptr + (i * C + r[:, None]) * K + rk[None, :], mask=valid[:, None], other=0.0)
    u = tl.load(u_ptr + (i * C + r[:, None]) * V + rv[None, :], mask=valid[:, None], other=0.0)
    gamma = tl.load(gamma_ptr + i * C + r, mask=valid, other=0.0)
    S = tl.load(h_ptr + (i * K + rk[:, None]) * V + rv[None, :])
    if LAST_OF_TILE:
        gamma_last = tl.load(gamma_ptr + i * C + C - 1)
    else:
        gamma_last = tl.load(gamma_ptr + i * C + n - 1)
    if FP16:
        ws = tl.dot(w.to(tl.float16), S.to(tl.float16)).to(tl.float32)
    else:
        ws = tl.dot(w, S)
    if CORRECT:
        v_new = u - ws
    else:
        v_new = u
    if TO_END:
        to_end = tl.exp(gamma_last - gamma)
    else:
        to_end = tl.exp(gamma)
    S_next = tl.dot(tl.trans(k), v_new * to_end[:, None])
    if CARRY:
        S_next += tl.exp(gamma_last) * S
    if not UPDATE:
        S_next = S
    if MASK_STORE:
        tl.store(v_new_ptr + (i * C + r[:, None]) * V + rv[None, :], v_new, mask=valid[:, None])
    else:
        tl.store(v_new_ptr + (i * C + r[:, None]) * V + rv[None, :], v_new)
    tl.store(h_next_ptr + (i * K + rk[:, None]) * V + rv[None, :], S_next)


@triton.jit
def chunk_step_right(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr,
                     C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _chunk_step(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr, C, K, V,
                True, False, True, True, True, True, False, True)


@triton.jit
def chunk_step_decay_from_start(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr,
                                C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _chunk_step(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr, C, K, V,
                False, False, True, True, True, True, False, True)


@triton.jit
def chunk_step_last_row_of_tile(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr,
                                C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _chunk_step(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr, C, K, V,
                True, True, True, True, True, True, False, True)


@triton.jit
def chunk_step_no_carry(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr,
                        C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _chunk_step(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr, C, K, V,
                True, False, False, True, True, True, False, True)


@triton.jit
def chunk_step_no_correction(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr,
                             C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _chunk_step(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr, C, K, V,
                True, False, True, False, True, True, False, True)


@triton.jit
def chunk_step_unmasked_store(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr,
                              C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _chunk_step(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr, C, K, V,
                True, False, True, True, False, True, False, True)


@triton.jit
def chunk_step_unmasked_loads(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr,
                              C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _chunk_step(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr, C, K, V,
                True, False, True, True, True, False, False, True)


@triton.jit
def chunk_step_fp16_operands(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr,
                             C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _chunk_step(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr, C, K, V,
                True, False, True, True, True, True, True, True)


@triton.jit
def chunk_step_copies_the_state(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr,
                                C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    _chunk_step(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr, C, K, V,
                True, False, True, True, True, True, False, False)


@triton.jit
def chunk_step_package_helper(k_ptr, w_ptr, u_ptr, gamma_ptr, n_ptr, h_ptr, v_new_ptr, h_next_ptr,
                              C: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """The forbidden call: the package's advance_state does the state update."""
    i = tl.program_id(0)
    n = tl.load(n_ptr + i)
    r, rk, rv = tl.arange(0, C), tl.arange(0, K), tl.arange(0, V)
    valid = r < n
    k = tl.load(k_ptr + (i * C + r[:, None]) * K + rk[None, :], mask=valid[:, None], other=0.0)
    w = tl.load(w_ptr + (i * C + r[:, None]) * K + rk[None, :], mask=valid[:, None], other=0.0)
    u = tl.load(u_ptr + (i * C + r[:, None]) * V + rv[None, :], mask=valid[:, None], other=0.0)
    gamma = tl.load(gamma_ptr + i * C + r, mask=valid, other=0.0)
    S = tl.load(h_ptr + (i * K + rk[:, None]) * V + rv[None, :])
    v_new = u - tl.dot(w, S)
    tl.store(v_new_ptr + (i * C + r[:, None]) * V + rv[None, :], v_new, mask=valid[:, None])
    S_next = prefill.advance_state(S, k, v_new, gamma, tl.load(gamma_ptr + i * C + n - 1), valid)
    tl.store(h_next_ptr + (i * K + rk[:, None]) * V + rv[None, :], S_next)


def chunk_step_in_torch(k, w, u, gamma, n, h, v_new, h_next, C, K, V):
    """A torch answer with the right signature: not a kernel."""
    raise AssertionError("never launched")


def test_chunk_step_kernel():
    assert judge_answer(NB, 4, _stub_chunk_step_kernel).status == NOT_DONE
    verdict = judge_answer(NB, 4, chunk_step_right)
    assert verdict.status == PASS, verdict


@pytest.mark.parametrize("wrong,phrase", [
    (chunk_step_decay_from_start, None), (chunk_step_last_row_of_tile, None), (chunk_step_no_carry, None),
    (chunk_step_no_correction, None), (chunk_step_unmasked_store, "past n[i]"), (chunk_step_unmasked_loads, None),
    (chunk_step_fp16_operands, None), (chunk_step_copies_the_state, None),
    (chunk_step_package_helper, "calls mamba_edu.kernels"), (chunk_step_in_torch, "not a Triton kernel")],
    ids=["decay_from_start", "last_row_of_tile", "no_carry", "no_correction", "unmasked_store",
         "unmasked_loads", "fp16_operands", "copies_the_state", "package_helper", "torch"])
def test_chunk_step_kernel_rejects(wrong, phrase):
    _rejected(4, wrong, phrase)
