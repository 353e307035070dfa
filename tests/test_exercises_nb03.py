"""Notebook 03's checks: a stub is "not done", and plausible wrong answers fail.

The correct answers live in notebooks/solutions/03_triton_kernels.ipynb (CI runs it with nbval).
"""

import torch
import triton
import triton.language as tl

from mamba_edu.exercises.core import FAIL, NOT_DONE, judge, lookup
from mamba_edu.exercises.nb03 import NOTEBOOK


def _stub(*args, **kwargs):
    raise NotImplementedError("hint: write it")


@triton.jit
def _stub_l2norm_kernel(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr,
                        ROWS: tl.constexpr):
    raise NotImplementedError("hint: write the kernel")


@triton.jit
def _stub_recurrent_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr,
                           scale, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                           V: tl.constexpr):
    raise NotImplementedError("hint: write the kernel")


# --- exercise 1 -------------------------------------------------------------------------------

@triton.jit
def _l2norm_eps_outside(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr,
                        ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    mask = (rows < n_rows)[:, None] & (cols < D)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    y = x / (tl.sqrt(tl.sum(x * x, 1)) + 1e-6)[:, None]  # eps outside the root
    tl.store(y_ptr + rows[:, None] * D + cols[None, :], y, mask=mask)


@triton.jit
def _l2norm_ignores_stride(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr,
                           ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    mask = (rows < n_rows)[:, None] & (cols < D)[None, :]
    x = tl.load(x_ptr + rows[:, None] * D + cols[None, :], mask=mask, other=0.0)  # assumes contiguous
    y = x / tl.sqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    tl.store(y_ptr + rows[:, None] * D + cols[None, :], y, mask=mask)


@triton.jit
def _l2norm_unmasked_rows(x_ptr, y_ptr, n_rows, stride_x, D: tl.constexpr, BD: tl.constexpr,
                          ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BD)
    mask = (rows < n_rows)[:, None] & (cols < D)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    y = x / tl.sqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    # The store forgets the rows (it lands in the check's guard rows, never outside y).
    tl.store(y_ptr + rows[:, None] * D + cols[None, :], y, mask=(cols < D)[None, :])


def _torch_l2norm(x_ptr, y_ptr, n_rows, stride_x, D, BD, ROWS):
    """A torch answer with the right signature: not a kernel, so it must not pass."""
    y_ptr[:n_rows] = x_ptr * torch.rsqrt((x_ptr * x_ptr).sum(-1, keepdim=True) + 1e-6)


def test_l2norm_kernel_rejects_wrong_answers():
    ex = lookup(NOTEBOOK, 1)
    assert judge(ex, _stub_l2norm_kernel).status == NOT_DONE
    for wrong in (_l2norm_eps_outside, _l2norm_ignores_stride, _l2norm_unmasked_rows):
        assert judge(ex, wrong).status == FAIL, wrong.__name__
    verdict = judge(ex, _torch_l2norm)
    assert verdict.status == FAIL and "not a Triton kernel" in verdict.message


# --- exercise 2 -------------------------------------------------------------------------------

def test_program_counts_rejects_wrong_answers():
    # Wrong answers made from the real grids with one plausible mistake each.
    from mamba_edu.exercises.nb03 import _expected_counts
    ex = lookup(NOTEBOOK, 2)
    assert judge(ex, _stub).status == NOT_DONE

    def off_by_one(lengths, H, HV, K, V):  # ⌊L/64⌋ chunks instead of ⌈L/64⌉
        return {**_expected_counts(lengths, H, HV, K, V),
                "prepare": sum(n // 64 for n in lengths) * HV, "scan_steps": max(n // 64 for n in lengths)}

    def fixed_scan_tile(lengths, H, HV, K, V):  # ignores how the launcher narrows the scan's V-tile
        return {**_expected_counts(lengths, H, HV, K, V), "scan": triton.cdiv(V, 64) * len(lengths) * HV}

    def batch_chunks(lengths, H, HV, K, V):  # ⌈T/64⌉ chunks, as if chunks could straddle sequences
        return {**_expected_counts(lengths, H, HV, K, V), "prepare": triton.cdiv(sum(lengths), 64) * HV}

    def never_output(lengths, H, HV, K, V):  # forgets the output kernel
        return {k: n for k, n in _expected_counts(lengths, H, HV, K, V).items() if k != "output"}

    def old_fused_rule(lengths, H, HV, K, V):  # no output kernel below 64 chains (an old default)
        counts = _expected_counts(lengths, H, HV, K, V)
        if len(lengths) * HV < 64:
            del counts["output"]
        return counts

    for wrong in (off_by_one, fixed_scan_tile, batch_chunks, never_output, old_fused_rule):
        assert judge(ex, wrong).status == FAIL, wrong.__name__


# --- exercise 3 -------------------------------------------------------------------------------

@triton.jit
def _recurrent(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, h0_ptr, ht_ptr, cu_ptr, scale,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               INTERLEAVED: tl.constexpr, READ_BEFORE_DECAY: tl.constexpr):
    seq = tl.program_id(0)
    hv = tl.program_id(1)
    if INTERLEAVED:
        hk = hv % H
    else:
        hk = hv // (HV // H)
    bos = tl.load(cu_ptr + seq)
    eos = tl.load(cu_ptr + seq + 1)
    rk = tl.arange(0, K)
    rv = tl.arange(0, V)
    state = ((seq * HV + hv) * K + rk[:, None]) * V + rv[None, :]
    S = tl.load(h0_ptr + state)
    for t in range(bos, eos):
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
        S = S + k[:, None] * v_new[None, :]
        tl.store(o_ptr + (t * HV + hv) * V + rv, scale * tl.sum(S * q[:, None], 0))
    tl.store(ht_ptr + state, S)


class _Variant:
    """A fixed variant of ``_recurrent`` launched with the check's grid and arguments."""

    def __init__(self, interleaved, read_before_decay):
        self.flags = (interleaved, read_before_decay)

    def __getitem__(self, grid):
        return lambda *args: _recurrent[grid](*args, *self.flags)


def test_recurrent_kernel_rejects_wrong_answers(monkeypatch):
    ex = lookup(NOTEBOOK, 3)
    assert judge(ex, _stub_recurrent_kernel).status == NOT_DONE
    verdict = judge(ex, _stub)
    assert verdict.status == FAIL and "not a Triton kernel" in verdict.message
    # The variants are not JIT functions themselves; let the check accept the wrapper.
    import mamba_edu.exercises.nb03 as nb03
    monkeypatch.setattr(nb03, "_require_kernel", lambda fn, name: None)
    assert judge(ex, _Variant(False, False)).status != FAIL  # the wrapper itself is sound ...
    assert judge(ex, _Variant(True, False)).status == FAIL   # ... interleaved GQA heads fail
    assert judge(ex, _Variant(False, True)).status == FAIL   # ... reading S before the decay fails
