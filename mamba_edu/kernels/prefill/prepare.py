"""Stage 1 of the prefill: every chunk's Γ, k̂, W and U, all chunks in parallel.

:func:`chunk_prepare_kernel`, grid ``(NT, HV)``, one program per (chunk, value head): the gating
(when given the raw projections a, b), the chunk-local cumsum Γ of g, the L2 norm k̂ of k,
``L = strict_lower(β (k̂ k̂ᵀ) e^{Γs−Γj})``, the inverse ``T = (I+L)⁻¹`` and
``W = T(β e^Γ K̂)``, ``U = T(β V)``. Writes Γ, k̂, W, U for :mod:`.scan`.
"""

import torch
import triton
import triton.language as tl

from mamba_edu.kernels.launcher import bound_kernel
from mamba_edu.kernels.prefill.config import PREPARE_WARPS, fp16_inverse, prefill_plan, work_dtype
from mamba_edu.kernels.prefill.tiles import CHUNK, chunk_gates, chunk_inverse, chunk_rows
from mamba_edu.kernels.tiles import load_rows, store_rows


@triton.jit
def prepare_chunk(i_chunk, hv, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr,
                  gamma_ptr, k_hat_ptr, w_ptr, u_ptr, cu_ptr, chunk_idx_ptr,
                  stride_k, stride_v, stride_g, stride_beta,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                  GATED: tl.constexpr, FP16_INVERSE: tl.constexpr):
    """Program (chunk ``i_chunk``, value head ``hv``): Γ ``[T, HV]``, W ``[T, HV, K]``,
    U ``[T, HV, V]`` for its 64 rows, and the normalised keys k̂ ``[T, H, K]`` (written by the
    first value head of each group); returns the chunk's sequence.
    With ``GATED``, ``g_ptr``/``beta_ptr`` hold the raw projections a, b (:func:`chunk_gates`).
    Inputs are read with their row strides. ``BK``, ``BV`` are at least 64 (masked past K, V:
    :func:`~.config.head_block`). ``FP16_INVERSE``: the inverse's products on fp16 operands."""
    seq, bos, eos = chunk_rows(i_chunk, cu_ptr, chunk_idx_ptr)
    gamma, beta = chunk_gates(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, bos, eos, hv,
                              stride_g, stride_beta, GATED)
    rows = bos + tl.arange(0, CHUNK)
    tl.store(gamma_ptr + rows * HV + hv, gamma, mask=rows < eos)
    hk = hv // (HV // H)  # value head hv reads key head hv // group
    k = load_rows(k_ptr + hk * K, bos, eos, stride_k, 0, K, CHUNK, BK)
    T, k_hat = chunk_inverse(k, gamma, beta, USE_L2NORM, FP16_INVERSE)
    _write_w_u(T, k_hat, beta, gamma, v_ptr + hv * V, k_hat_ptr + hk * K, w_ptr + hv * K,
               u_ptr + hv * V, hv, bos, eos, stride_v, H, HV, K, V, BK, BV)
    return seq


@triton.jit
def _write_w_u(T, k_hat, beta, gamma, v_ptr, k_hat_ptr, w_ptr, u_ptr, hv, bos, eos, stride_v,
               H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
               BK: tl.constexpr, BV: tl.constexpr):
    """Store k̂ (first value head of the group only), ``W = T (β e^Γ K̂)`` and ``U = T (β V)``:
    operands in the storage dtype (W's), fp32 accumulation. Pointers at the head's first
    column."""
    # Rows below bos do not exist: the other value heads of the group store no k̂.
    k_hat_end = tl.where(hv % (HV // H) == 0, eos, bos)
    store_rows(k_hat_ptr, k_hat, bos, k_hat_end, H * K, 0, K, CHUNK, BK)
    T = T.to(w_ptr.dtype.element_ty)
    keys_in = (k_hat * (beta * tl.exp(gamma))[:, None]).to(T.dtype)
    store_rows(w_ptr, tl.dot(T, keys_in), bos, eos, HV * K, 0, K, CHUNK, BK)
    v = load_rows(v_ptr, bos, eos, stride_v, 0, V, CHUNK, BV).to(tl.float32)
    values_in = (v * beta[:, None]).to(T.dtype)
    store_rows(u_ptr, tl.dot(T, values_in), bos, eos, HV * V, 0, V, CHUNK, BV)


@bound_kernel
@triton.jit
def chunk_prepare_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr,
                         gamma_ptr, k_hat_ptr, w_ptr, u_ptr, cu_ptr, chunk_idx_ptr,
                         stride_k, stride_v, stride_g, stride_beta,
                         H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                         FP16_INVERSE: tl.constexpr, GATED: tl.constexpr):
    """Kernel 1, grid ``(NT, HV)``: :func:`prepare_chunk` for every (chunk, value head).
    ``GATED``: whether ``A_log_ptr`` (and ``dt_bias_ptr``) is passed, or None."""
    prepare_chunk(tl.program_id(0), tl.program_id(1), k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr,
                  dt_bias_ptr, gamma_ptr, k_hat_ptr, w_ptr, u_ptr, cu_ptr, chunk_idx_ptr,
                  stride_k, stride_v, stride_g, stride_beta, H, HV, K, V, BK, BV, USE_L2NORM,
                  GATED, FP16_INVERSE)


def prepare_outputs(k, v):
    """What kernel 1 writes, allocated: ``(gamma [T, HV] fp32, k_hat [T, H, K], w [T, HV, K],
    u [T, HV, V])``, all but gamma in :func:`~.config.work_dtype`."""
    T, H, K = k.shape
    HV, V = v.shape[1:]
    work = work_dtype(v.dtype)
    return (torch.empty(T, HV, device=k.device, dtype=torch.float32),
            torch.empty(T, H, K, device=k.device, dtype=work),
            torch.empty(T, HV, K, device=k.device, dtype=work),
            torch.empty(T, HV, V, device=k.device, dtype=work))


def launch_prepare(k, v, g, beta, meta, use_qk_l2norm, gating=None):
    """Kernel 1 on checked inputs: returns :func:`prepare_outputs`, filled. ``gating``:
    ``(A_log, dt_bias)`` when ``g, beta`` are the raw projections ``a, b``, else None."""
    T, H, K = k.shape
    HV, V = v.shape[1:]
    plan = prefill_plan(meta.N, meta.NT, HV, K, V)
    gamma, k_hat, w, u = prepare_outputs(k, v)
    A_log, dt_bias = gating or (None, None)
    chunk_prepare_kernel[plan.prepare_grid](
        k, v, g, beta, A_log, dt_bias, gamma, k_hat, w, u, meta.cu_seqlens, meta.chunk_indices,
        k.stride(0), v.stride(0), g.stride(0), beta.stride(0), H, HV, K, V, plan.BK, plan.BV,
        use_qk_l2norm, fp16_inverse(use_qk_l2norm, w.dtype), gating is not None,
        num_warps=PREPARE_WARPS)
    return gamma, k_hat, w, u
