"""The prefill with W and U built inside the scan: the preparation kernel writes T, not W and U.

The H100 breakdown (``docs/references.md``, "Where the time goes") found our three kernels
memory-bound, with the time following the DRAM bytes. The largest intermediates are
``W [T, HV, K]`` and ``U [T, HV, V]``: kernel 1 writes them and kernel 2 reads them back (bf16,
two bytes per element each way). Both come from the 64 × 64 inverse of the chunk:
``W = T(β e^Γ ⊙ K̂)`` and ``U = T(β ⊙ V)``. This variant stores ``T [NT, HV, 64, 64]`` and β
instead, and the scan forms W and U per chunk from T, k̂ and v, in registers:

1. :func:`prepare_t_kernel`, grid ``(NT, HV)``: Γ, k̂, β and T (no v read at all);
2. :func:`scan_t_kernel`, grid ``(⌈V/BV⌉, N, HV)``: per chunk, ``W = T(β e^Γ ⊙ K̂)`` and
   ``U = T(β ⊙ V)`` for its V-tile, then the package's step (Ṽ, h, the state);
3. the package's output kernel, unchanged.

The byte model (:func:`mamba_edu.lab.bench_sm90_resources.scan_builds_wu_bytes`, beside the
package's) predicts about a fifth fewer bytes at the breakdown's shapes. What it costs: two more products per chunk on the scan's serial path
(they do not depend on the state, so they can overlap the previous chunk's step, but Triton
decides that), and every V-tile program of a head forms the same W again. Which wins is a GPU
question: ``python -m mamba_edu.lab.bench_lab_arms`` times it beside ours, and
:mod:`.bench_sm90_resources` compiles it for sm_90a on a CPU (registers, spills). Never timed
on a GPU yet. Tested equal to the three kernels and to the reference in the interpreter
(``tests/lab/test_lab_scan_builds_wu.py``).
"""

import torch
import triton
import triton.language as tl

from mamba_edu.kernels.prefill import launch_output
from mamba_edu.kernels.prefill.config import PREPARE_WARPS, fp16_inverse, prefill_plan, work_dtype
from mamba_edu.kernels.prefill.tiles import (CHUNK, advance_state, chunk_gates, chunk_inverse,
                                             chunk_rows, scan_end, scan_start, sequence_chunks,
                                             store_if_tracked)
from mamba_edu.kernels.tiles import load_rows, store_rows


@triton.heuristics({"GATED": lambda args: args["A_log_ptr"] is not None})
@triton.jit
def prepare_t_kernel(k_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, gamma_ptr, beta_out_ptr,
                     k_hat_ptr, t_ptr, cu_ptr, chunk_idx_ptr, stride_k, stride_g, stride_beta,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
                     USE_L2NORM: tl.constexpr, FP16_INVERSE: tl.constexpr, GATED: tl.constexpr):
    """Program (chunk, value head): Γ and β ``[T, HV]`` fp32, k̂ ``[T, H, K]`` (first value head
    of each group) and the chunk's ``T = (I + L)⁻¹`` into ``t [NT, HV, 64, 64]``."""
    i_chunk, hv = tl.program_id(0), tl.program_id(1)
    seq, bos, eos = chunk_rows(i_chunk, cu_ptr, chunk_idx_ptr)
    gamma, beta = chunk_gates(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, bos, eos, hv,
                              stride_g, stride_beta, GATED)
    r = tl.arange(0, CHUNK)
    tl.store(gamma_ptr + (bos + r) * HV + hv, gamma, mask=bos + r < eos)
    tl.store(beta_out_ptr + (bos + r) * HV + hv, beta, mask=bos + r < eos)
    hk = hv // (HV // H)
    k = load_rows(k_ptr + hk * K, bos, eos, stride_k, 0, K, CHUNK, BK)
    T, k_hat = chunk_inverse(k, gamma, beta, USE_L2NORM, FP16_INVERSE)
    k_hat_end = tl.where(hv % (HV // H) == 0, eos, bos)  # the group's other heads store no k̂
    store_rows(k_hat_ptr + hk * K, k_hat, bos, k_hat_end, H * K, 0, K, CHUNK, BK)
    tile = (i_chunk.to(tl.int64) * HV + hv) * CHUNK * CHUNK
    tl.store(t_ptr + tile + r[:, None] * CHUNK + r[None, :], T.to(t_ptr.dtype.element_ty))


@triton.heuristics({"TRACK": lambda args: args["track_slot_ptr"] is not None})
@triton.jit
def scan_t_kernel(k_hat_ptr, v_ptr, t_ptr, gamma_ptr, beta_ptr, v_new_ptr, h_ptr, pool_ptr,
                  cu_ptr, chunk_off_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr, stride_v,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, TRACK: tl.constexpr):
    """Program (V-tile, sequence, value head): the package's scan
    (:func:`~mamba_edu.kernels.prefill.scan_sequence`), with each chunk's W and U formed here from
    T, k̂, β, Γ and the V-tile of v instead of read. Writes h, Ṽ, the final and tracked states."""
    i_v, seq, hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos, first_chunk, n_chunks = sequence_chunks(seq, cu_ptr, chunk_off_ptr)
    hk = hv // (HV // H)
    v0 = i_v * BV
    S, slab, slab_mask, state_ptr, state_mask, track_ptr, track_chunk = scan_start(
        pool_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr, seq, hv, v0, HV, K, V, BK, BV,
        TRACK)

    work = t_ptr.dtype.element_ty
    r = tl.arange(0, CHUNK)
    for c in range(0, n_chunks):
        chunk = first_chunk + c
        tl.store(h_ptr + (chunk * HV + hv) * (K * V) + slab, S.to(h_ptr.dtype.element_ty),
                 mask=slab_mask)
        store_if_tracked(S, c, track_ptr, track_chunk, slab_mask, TRACK)
        t0 = bos + CHUNK * c
        valid = t0 + r < eos
        gamma = tl.load(gamma_ptr + (t0 + r) * HV + hv, mask=valid, other=0.0)
        gamma_last = tl.load(gamma_ptr + (tl.minimum(t0 + CHUNK, eos) - 1) * HV + hv)
        beta = tl.load(beta_ptr + (t0 + r) * HV + hv, mask=valid, other=0.0)
        T = tl.load(t_ptr + (chunk * HV + hv) * CHUNK * CHUNK + r[:, None] * CHUNK + r[None, :])
        k = load_rows(k_hat_ptr + hk * K, t0, eos, H * K, 0, K, CHUNK, BK)
        w = tl.dot(T, (k.to(tl.float32) * (beta * tl.exp(gamma))[:, None]).to(work))
        v = load_rows(v_ptr + hv * V, t0, eos, stride_v, v0, V, CHUNK, BV).to(tl.float32)
        u = tl.dot(T, (v * beta[:, None]).to(work))
        v_new = u - tl.dot(w.to(work), S.to(work))
        store_rows(v_new_ptr + hv * V, v_new, t0, eos, HV * V, v0, V, CHUNK, BV)
        S = advance_state(S, k, v_new, gamma, gamma_last, valid)

    scan_end(S, n_chunks, state_ptr, state_mask, track_ptr, track_chunk, slab_mask, TRACK)


def prefill_scan_builds_wu(q, k, v, g, beta, state_pool, state_indices, meta, scale, use_qk_l2norm,
                           output_checkpoints=False, track_slots=None, track_chunks=None,
                           gating=None, output_norm=None):
    """:func:`~mamba_edu.kernels.prefill.prefill_triton` with W and U formed in the scan: same
    arguments (checked inputs, as :func:`mamba_edu.kernels.gdn_prefill` checks them), same
    results ``(o [T, HV, V], checkpoints [NT, HV, K, V] fp32 or None)``."""
    T, H, K = k.shape
    HV, V = v.shape[1:]
    work = work_dtype(v.dtype)
    gamma, beta_out = (torch.empty(T, HV, device=k.device) for _ in range(2))
    k_hat = torch.empty(T, H, K, device=k.device, dtype=work)
    inverse = torch.empty(meta.NT, HV, 64, 64, device=k.device, dtype=work)
    A_log, dt_bias = gating or (None, None)
    plan = prefill_plan(meta.N, meta.NT, HV, K, V)
    prepare_t_kernel[plan.prepare_grid](
        k, g, beta, A_log, dt_bias, gamma, beta_out, k_hat, inverse, meta.cu_seqlens,
        meta.chunk_indices, k.stride(0), g.stride(0), beta.stride(0), H, HV, K, plan.BK,
        use_qk_l2norm, fp16_inverse(use_qk_l2norm, work), num_warps=PREPARE_WARPS)
    ckpt = (torch.empty(meta.NT, HV, K, V, device=k.device, dtype=torch.float32)
            if output_checkpoints else None)
    h = ckpt if ckpt is not None else torch.empty(meta.NT, HV, K, V, device=k.device, dtype=work)
    v_new = torch.empty(T, HV, V, device=k.device, dtype=work)
    scan_t_kernel[plan.scan_grid](
        k_hat, v, inverse, gamma, beta_out, v_new, h, state_pool, meta.cu_seqlens,
        meta.chunk_offsets, state_indices, track_slots, track_chunks, v.stride(0),
        H, HV, K, V, plan.BK, plan.scan_bv, num_warps=plan.scan_warps,
        num_stages=plan.scan_stages)
    return launch_output(q, k_hat, v_new, h, gamma, meta, scale, use_qk_l2norm, output_norm), ckpt
