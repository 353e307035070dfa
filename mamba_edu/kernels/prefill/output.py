"""Stage 3 of the prefill: every chunk's output, all chunks in parallel again.

:func:`chunk_output_kernel`, grid ``(⌈V/BV⌉, NT, HV)``, one program per (V-tile, chunk, value
head): ``O = scale·[(Q̂ e^Γ) h[c] + (Q̂ K̂ᵀ ⊙ e^{Γr−Γs} ⊙ [s≤r]) Ṽ]`` from the scan's ``h`` and
``Ṽ``. Given the output gate z it also applies the layer's output norm ``rms_norm(O)·w·silu(z)``
per head (one V-tile per head): one launch less than a separate norm kernel, used where the
output's V-tile is the whole head anyway (:func:`launch_output`).
"""

import torch
import triton
import triton.language as tl

from mamba_edu.kernels.fused_ops import gated_rms_norm
from mamba_edu.kernels.launcher import bound_kernel
from mamba_edu.kernels.prefill.config import OUTPUT_WARPS, prefill_plan
from mamba_edu.kernels.prefill.tiles import (CHUNK, chunk_rows, gated_norm_rows, output_tile,
                                             scaled_queries)
from mamba_edu.kernels.tiles import load_rows, store_rows


@triton.jit
def output_chunk(i_v, i_chunk, hv, q_ptr, k_hat_ptr, v_new_ptr, h_ptr, gamma_ptr, o_ptr, z_ptr,
                 norm_w_ptr, cu_ptr, chunk_idx_ptr, scale, stride_q, stride_z, eps,
                 H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                 BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                 GATE: tl.constexpr):
    """Program (V-tile ``i_v``, chunk ``i_chunk``, value head ``hv``): its 64 rows of
    ``o [T, HV, V]`` from ``h`` and ``Ṽ``. With ``GATE`` (then ``BV`` covers the whole head) the
    rows are normed before they are stored (:func:`~.tiles.gated_norm_rows`, gate
    ``z [T, HV·V]`` with row stride ``stride_z``, weight ``norm_w [V]``, ``eps``)."""
    v0 = i_v * BV
    seq, bos, eos = chunk_rows(i_chunk, cu_ptr, chunk_idx_ptr)
    hk = hv // (HV // H)
    valid = bos + tl.arange(0, CHUNK) < eos

    q = scaled_queries(q_ptr, hk, bos, eos, stride_q, scale, K, BK, USE_L2NORM)
    k = load_rows(k_hat_ptr + hk * K, bos, eos, H * K, 0, K, CHUNK, BK)
    v_new = load_rows(v_new_ptr + hv * V, bos, eos, HV * V, v0, V, CHUNK, BV)
    gamma = tl.load(gamma_ptr + (bos + tl.arange(0, CHUNK)) * HV + hv, mask=valid, other=0.0)
    # Row i_chunk of h is this chunk's start state (chunks are numbered like the checkpoints).
    rk = tl.arange(0, BK)
    cv = v0 + tl.arange(0, BV)
    h_offs = (i_chunk.to(tl.int64) * HV + hv) * (K * V) + rk[:, None] * V + cv[None, :]
    h = tl.load(h_ptr + h_offs, mask=(rk < K)[:, None] & (cv < V)[None, :], other=0.0)
    o = output_tile(q, k, v_new, h, gamma, valid)
    if GATE:
        o = gated_norm_rows(o, z_ptr + hv * V, norm_w_ptr, bos, eos, stride_z, eps, V, BV)
    store_rows(o_ptr + hv * V, o, bos, eos, HV * V, v0, V, CHUNK, BV)


@bound_kernel
@triton.jit
def chunk_output_kernel(q_ptr, k_hat_ptr, v_new_ptr, h_ptr, gamma_ptr, o_ptr, z_ptr, norm_w_ptr,
                        cu_ptr, chunk_idx_ptr, scale, stride_q, stride_z, eps,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                        GATE: tl.constexpr):
    """Kernel 3, grid ``(⌈V/BV⌉, NT, HV)``: :func:`output_chunk` for every (V-tile, chunk, value
    head). The V-tiles of a chunk are neighbours in the grid, so its q and k̂ are read from L2.
    ``GATE``: whether the gate ``z_ptr`` (and ``norm_w_ptr``) is passed, or None."""
    output_chunk(tl.program_id(0), tl.program_id(1), tl.program_id(2), q_ptr, k_hat_ptr,
                 v_new_ptr, h_ptr, gamma_ptr, o_ptr, z_ptr, norm_w_ptr, cu_ptr, chunk_idx_ptr,
                 scale, stride_q, stride_z, eps, H, HV, K, V, BK, BV, USE_L2NORM, GATE)


def apply_output_norm(o, output_norm, impl="triton"):
    """``o`` normed by :func:`~mamba_edu.kernels.fused_ops.gated_rms_norm` as a step of its own
    (where the output kernel does not norm it), or ``o`` itself when ``output_norm`` is None."""
    return o if output_norm is None else gated_rms_norm(o, *output_norm, impl=impl)


def launch_output(q, k_hat, v_new, h, gamma, meta, scale, use_qk_l2norm, output_norm=None):
    """Kernel 3, fully parallel: returns ``o [T, HV, V]`` in q's dtype. With ``output_norm =
    (z, weight, eps)`` (checked, :func:`mamba_edu.kernels.gdn_prefill`) ``o`` is normed in the
    kernel: the fp32 output, where a separate :func:`~mamba_edu.kernels.fused_ops.gated_rms_norm`
    reads it rounded to q's dtype, so the two agree to that rounding, not bit for bit. Where
    :func:`~.config.output_block_v` splits heads, the norm runs as a kernel of its own instead."""
    T, H, K = q.shape
    HV, V = v_new.shape[1:]
    plan = prefill_plan(meta.N, meta.NT, HV, K, V)
    if output_norm is not None and plan.output_bv < plan.BV:
        # The norm sums over the whole head, so it needs one V-tile per head; where the rule
        # splits heads (few chunks) that halves the programs, and on the H200 a separate norm
        # kernel was faster.
        o = launch_output(q, k_hat, v_new, h, gamma, meta, scale, use_qk_l2norm)
        return apply_output_norm(o, output_norm)
    o = torch.empty(T, HV, V, device=q.device, dtype=q.dtype)
    z, weight, eps = output_norm or (None, None, 0.0)
    chunk_output_kernel[plan.output_grid](
        q, k_hat, v_new, h, gamma, o, z, weight, meta.cu_seqlens, meta.chunk_indices, scale,
        q.stride(0), 0 if z is None else z.stride(0), eps, H, HV, K, V, plan.BK, plan.output_bv,
        use_qk_l2norm, z is not None, num_warps=OUTPUT_WARPS)
    return o
