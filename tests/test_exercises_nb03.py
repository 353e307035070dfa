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
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=(cols < D)[None, :], other=0.0)
    y = x / tl.sqrt(tl.sum(x * x, 1) + 1e-6)[:, None]
    tl.store(y_ptr + rows[:, None] * D + cols[None, :], y, mask=(cols < D)[None, :])  # no row mask


def _torch_l2norm(x_ptr, y_ptr, n_rows, stride_x, D, BD, ROWS):
    """A torch answer with the right signature: not a kernel, so it must not pass."""
    y_ptr[:n_rows] = x_ptr * torch.rsqrt((x_ptr * x_ptr).sum(-1, keepdim=True) + 1e-6)


def test_l2norm_kernel_rejects_wrong_answers():
    ex = lookup(NOTEBOOK, 1)
    assert judge(ex, _stub_l2norm_kernel).status == NOT_DONE
    assert judge(ex, _stub).status == NOT_DONE
    for wrong in (_l2norm_eps_outside, _l2norm_ignores_stride, _l2norm_unmasked_rows):
        assert judge(ex, wrong).status == FAIL, wrong.__name__
    verdict = judge(ex, _torch_l2norm)
    assert verdict.status == FAIL and "not a Triton kernel" in verdict.message


# --- exercise 2 -------------------------------------------------------------------------------

def _counts(lengths, H, HV, K, V, chunks=lambda n: triton.cdiv(n, 64), scan_bv=None, out_bv=None):
    NT = sum(chunks(n) for n in lengths)
    N = len(lengths)
    whole = max(16, triton.next_power_of_2(V))
    bv = min(64, whole)
    while scan_bv is None and bv > 32 and N * HV * triton.cdiv(V, bv) < 132:
        bv //= 2
    bv = scan_bv or bv
    bv_out = out_bv or (64 if whole > 64 and NT * HV < 264 else whole)
    return dict(prepare=NT * HV, scan=triton.cdiv(V, bv) * N * HV,
                output=triton.cdiv(V, bv_out) * NT * HV, scan_steps=max(chunks(n) for n in lengths))


def test_program_counts_rejects_wrong_answers():
    ex = lookup(NOTEBOOK, 2)
    assert judge(ex, _stub).status == NOT_DONE
    off_by_one = lambda *a: _counts(*a, chunks=lambda n: n // 64)           # floor, not ceil
    fixed_scan_tile = lambda *a: _counts(*a, scan_bv=64)                    # ignores the 132-SM rule
    batch_chunks = lambda lengths, *a: {**_counts(lengths, *a),             # ⌈T/64⌉ over the batch
                                        "prepare": triton.cdiv(sum(lengths), 64) * a[1]}
    for wrong in (off_by_one, fixed_scan_tile, batch_chunks):
        assert judge(ex, wrong).status == FAIL


def test_program_counts_reference_matches_the_launched_grids():
    # The helper above (a copy of the notebook's solution) agrees with the check today; if the
    # kernels' grids change, this test says the notebook's solution must follow.
    from mamba_edu.exercises.nb03 import _expected_counts
    for case in (([8192], 16, 32, 128, 128), ([1024] * 8, 16, 32, 128, 128), ([1, 63, 64, 65, 150], 2, 4, 16, 32)):
        assert _counts(*case) == _expected_counts(*case)


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
