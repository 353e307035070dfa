"""The whole prefill in one program per (V-tile, sequence, value head): no intermediates in HBM.

The package's prefill (:mod:`mamba_edu.kernels.prefill`) runs three kernels and passes Γ, k̂, W,
U, h and Ṽ between them through memory. The fastest references do not: FlashInfer's SM90 prefill
walks a sequence's chunks inside one persistent program per (sequence, head), and keeps the
state on chip. :func:`chunk_loop_kernel` is that dataflow in plain Triton, built from the same
program pieces as the three kernels. For each chunk ``c`` of its sequence, in order:

1. Γ from the gates, the L2-normalised keys, ``L``, ``T = (I + L)⁻¹``, ``W = T(β e^Γ K̂)`` and
   ``U = T(β V)`` (what kernel 1 writes), here in registers;
2. ``Ṽ = U − W S`` and the chunk's output ``O = (Q̂ e^Γ) S + (Q̂K̂ᵀ ⊙ decay) Ṽ`` (kernel 3's
   product, with the start state ``S`` already in registers), normed with the gate if given;
3. ``S ← e^{Γ_C} S + K̂ᵀ(e^{Γ_C − Γ} ⊙ Ṽ)`` (kernel 2's step), the tracked and checkpointed
   copies of ``S`` where asked.

What it reads from HBM is q, k, v, the gates and the state; what it writes is o and the states.
What it gives up: steps 1 and 2 now sit on the serial path of every chunk (the three kernels run
them for all chunks at once), so a sequence of ``n`` chunks takes ``n`` full steps. Warp
specialisation (a producer warp loading and preparing chunk ``c + 1`` while the others step
chunk ``c``) is how FlashInfer hides that; plain Triton cannot express it, so this kernel shows
the dataflow, not that overlap. With ``BV`` narrower than ``V`` the V-tiles of a head repeat
step 1 (more programs, redundant work).

Measured slower than the three kernels on the H200 (``data/benchmarks/lab_chunk_loop.json``,
``python -m mamba_edu.lab.bench_lab_arms``), so the package runs those. Tested equal to them and
to the reference in the interpreter (``tests/lab/test_lab_chunk_loop.py``).
"""

import torch
import triton
import triton.language as tl

from mamba_edu.kernels.prefill.config import fp16_inverse, head_block, work_dtype
from mamba_edu.kernels.prefill.tiles import (CHUNK, advance_state, chunk_gates, chunk_inverse,
                                             gated_norm_rows, output_tile, scaled_queries,
                                             scan_end, scan_start, sequence_chunks,
                                             store_if_tracked)
from mamba_edu.kernels.tiles import cdiv, load_rows, store_rows


@triton.heuristics({"GATED": lambda args: args["A_log_ptr"] is not None,
                    "GATE": lambda args: args["z_ptr"] is not None,
                    "TRACK": lambda args: args["track_slot_ptr"] is not None,
                    "CKPT": lambda args: args["ckpt_ptr"] is not None})
@triton.jit
def chunk_loop_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, o_ptr,
                      z_ptr, norm_w_ptr, pool_ptr, ckpt_ptr, cu_ptr, chunk_off_ptr,
                      state_idx_ptr, track_slot_ptr, track_chunk_ptr, scale, stride_q, stride_k,
                      stride_v, stride_g, stride_beta, stride_z, eps,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, USE_L2NORM: tl.constexpr,
                      FP16_INVERSE: tl.constexpr, GATED: tl.constexpr, GATE: tl.constexpr,
                      TRACK: tl.constexpr, CKPT: tl.constexpr):
    """Grid ``(⌈V/BV⌉, N, HV)``: the prefill of one sequence's value head (V-tile ``BV``),
    chunk by chunk, reading the initial state from and writing the final one to the pool slot;
    with ``TRACK`` the tracked state into its track slot, with ``CKPT`` every chunk's start
    state into ``ckpt [NT, HV, K, V]`` fp32, with ``GATE`` the output normed (``BV = V``)."""
    i_v, seq, hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, eos, first_chunk, n_chunks = sequence_chunks(seq, cu_ptr, chunk_off_ptr)
    hk = hv // (HV // H)
    v0 = i_v * BV
    S, slab, slab_mask, state_ptr, state_mask, track_ptr, track_chunk = scan_start(
        pool_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr, seq, hv, v0, HV, K, V, BK, BV,
        TRACK)

    work = o_ptr.dtype.element_ty  # q's dtype = v's: the storage dtype of W, U, Ṽ
    r = tl.arange(0, CHUNK)
    for c in range(0, n_chunks):
        if CKPT:
            tl.store(ckpt_ptr + ((first_chunk + c) * HV + hv) * (K * V) + slab, S, mask=slab_mask)
        store_if_tracked(S, c, track_ptr, track_chunk, slab_mask, TRACK)
        t0 = bos + CHUNK * c
        valid = t0 + r < eos
        gamma, beta = chunk_gates(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, t0, eos, hv,
                                  stride_g, stride_beta, GATED)
        # Padded rows add g = 0, so Γ's last entry is the last real row's.
        gamma_last = tl.sum(tl.where(r == CHUNK - 1, gamma, 0.0), 0)
        # Step 1 (kernel 1's work), in registers.
        k = load_rows(k_ptr + hk * K, t0, eos, stride_k, 0, K, CHUNK, BK)
        T, k_hat = chunk_inverse(k, gamma, beta, USE_L2NORM, FP16_INVERSE)
        T = T.to(work)
        w = tl.dot(T, (k_hat * (beta * tl.exp(gamma))[:, None]).to(work))
        v = load_rows(v_ptr + hv * V, t0, eos, stride_v, v0, V, CHUNK, BV).to(tl.float32)
        u = tl.dot(T, (v * beta[:, None]).to(work))
        # Step 2: Ṽ and the chunk's output from the start state S.
        v_new = u - tl.dot(w.to(work), S.to(work))
        q = scaled_queries(q_ptr, hk, t0, eos, stride_q, scale, K, BK, USE_L2NORM)
        o = output_tile(q, k_hat.to(work), v_new.to(work), S.to(work), gamma, valid)
        if GATE:
            o = gated_norm_rows(o, z_ptr + hv * V, norm_w_ptr, t0, eos, stride_z, eps, V, BV)
        store_rows(o_ptr + hv * V, o, t0, eos, HV * V, v0, V, CHUNK, BV)
        # Step 3: the state after the chunk.
        S = advance_state(S, k_hat.to(work), v_new, gamma, gamma_last, valid)

    scan_end(S, n_chunks, state_ptr, state_mask, track_ptr, track_chunk, slab_mask, TRACK)


def prefill_chunk_loop(q, k, v, g, beta, state_pool, state_indices, meta, scale, use_qk_l2norm,
                       output_checkpoints=False, track_slots=None, track_chunks=None, gating=None,
                       output_norm=None, block_v=None, num_warps=4):
    """:func:`~mamba_edu.kernels.prefill.prefill_triton` as one kernel: same arguments (checked
    inputs, as :func:`mamba_edu.kernels.gdn_prefill` checks them), same results
    ``(o [T, HV, V], checkpoints [NT, HV, K, V] fp32 or None)``. ``block_v``: the V-tile (the
    whole head by default; the output norm needs the whole head); ``num_warps``: warps per program."""
    T, H, K = q.shape
    HV, V = v.shape[1:]
    BV = block_v or head_block(V)
    if output_norm is not None and BV < V:
        raise ValueError(f"the output norm needs the whole head in one tile: block_v={BV} < V={V}")
    o = torch.empty(T, HV, V, device=q.device, dtype=q.dtype)
    ckpt = (torch.empty(meta.NT, HV, K, V, device=q.device, dtype=torch.float32)
            if output_checkpoints else None)
    A_log, dt_bias = gating or (None, None)
    z, weight, eps = output_norm or (None, None, 0.0)
    chunk_loop_kernel[(cdiv(V, BV), meta.N, HV)](
        q, k, v, g, beta, A_log, dt_bias, o, z, weight, state_pool, ckpt, meta.cu_seqlens,
        meta.chunk_offsets, state_indices, track_slots, track_chunks, scale, q.stride(0),
        k.stride(0), v.stride(0), g.stride(0), beta.stride(0), 0 if z is None else z.stride(0),
        eps, H, HV, K, V, head_block(K), BV, use_qk_l2norm,
        fp16_inverse(use_qk_l2norm, work_dtype(v.dtype)), num_warps=num_warps)
    return o, ckpt
