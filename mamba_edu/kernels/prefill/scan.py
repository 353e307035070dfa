"""Stage 2 of the prefill: the serial pass over each sequence's chunks.

:func:`chunk_scan_kernel`, grid ``(⌈V/BV⌉, N, HV)``, one program per (V-tile, sequence, value
head), looping over the sequence's chunks. Only what the next chunk needs is on this serial path:
it writes the chunk's start state ``h[c] = S``, then ``Ṽ = U − W S`` (written too) and
``S ← e^{Γ_C} S + K̂ᵀ (e^{Γ_C−Γ} ⊙ Ṽ)``. It reads S₀ from the pool slot, writes the final state
back in place, and writes the ``fused`` tracking copy when given its slots. Its V-tile may be
16 or 32 wide when few (sequence, head) chains exist (:func:`~.config.scan_config`).
"""

import torch
import triton
import triton.language as tl

from mamba_edu.kernels.launcher import bound_kernel
from mamba_edu.kernels.prefill.config import prefill_plan
from mamba_edu.kernels.prefill.tiles import (CHUNK, advance_state, scan_end, scan_start,
                                             sequence_chunks, store_if_tracked)
from mamba_edu.kernels.tiles import load_rows, store_rows


@triton.jit
def chunk_tiles(k_hat_ptr, w_ptr, u_ptr, gamma_ptr, t0, eos, hk, hv, v0,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BK: tl.constexpr, BV: tl.constexpr):
    """What one chunk step of the scan reads for the chunk starting at token ``t0``:
    ``(k̂ [64, BK], W [64, BK], U [64, BV] fp32, Γ [64], Γ of its last row, valid [64])``,
    zeros past ``eos`` (key head ``hk``, value head ``hv``, V-tile from column ``v0``)."""
    r = tl.arange(0, CHUNK)
    valid = t0 + r < eos
    k = load_rows(k_hat_ptr + hk * K, t0, eos, H * K, 0, K, CHUNK, BK)
    w = load_rows(w_ptr + hv * K, t0, eos, HV * K, 0, K, CHUNK, BK)
    u = load_rows(u_ptr + hv * V, t0, eos, HV * V, v0, V, CHUNK, BV).to(tl.float32)
    gamma = tl.load(gamma_ptr + (t0 + r) * HV + hv, mask=valid, other=0.0)
    gamma_last = tl.load(gamma_ptr + (tl.minimum(t0 + CHUNK, eos) - 1) * HV + hv)
    return k, w, u, gamma, gamma_last, valid


@triton.jit
def scan_sequence(i_v, seq, hv, k_hat_ptr, w_ptr, u_ptr, gamma_ptr, v_new_ptr, h_ptr, pool_ptr,
                  cu_ptr, chunk_off_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, TRACK: tl.constexpr):
    """Program (V-tile ``i_v``, sequence ``seq``, value head ``hv``): the sequential state pass
    over the sequence's chunks, from and back to its pool slot (:func:`~.tiles.scan_start`,
    :func:`~.tiles.scan_end`). It writes ``h [NT, HV, K, V]`` (the start state of every chunk)
    and ``Ṽ [T, HV, V]`` for :mod:`.output`."""
    bos, eos, first_chunk, n_chunks = sequence_chunks(seq, cu_ptr, chunk_off_ptr)
    hk = hv // (HV // H)
    v0 = i_v * BV
    S, slab, slab_mask, state_ptr, state_mask, track_ptr, track_chunk = scan_start(
        pool_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr, seq, hv, v0, HV, K, V, BK, BV,
        TRACK)

    work = w_ptr.dtype.element_ty
    for c in range(0, n_chunks):
        tl.store(h_ptr + ((first_chunk + c) * HV + hv) * (K * V) + slab,
                 S.to(h_ptr.dtype.element_ty), mask=slab_mask)
        store_if_tracked(S, c, track_ptr, track_chunk, slab_mask, TRACK)
        t0 = bos + CHUNK * c
        k, w, u, gamma, gamma_last, valid = chunk_tiles(k_hat_ptr, w_ptr, u_ptr, gamma_ptr,
                                                        t0, eos, hk, hv, v0, H, HV, K, V, BK, BV)
        v_new = u - tl.dot(w, S.to(work))
        store_rows(v_new_ptr + hv * V, v_new, t0, eos, HV * V, v0, V, CHUNK, BV)
        S = advance_state(S, k, v_new, gamma, gamma_last, valid)

    scan_end(S, n_chunks, state_ptr, state_mask, track_ptr, track_chunk, slab_mask, TRACK)


@bound_kernel
@triton.jit
def chunk_scan_kernel(k_hat_ptr, w_ptr, u_ptr, gamma_ptr, v_new_ptr, h_ptr, pool_ptr,
                      cu_ptr, chunk_off_ptr, state_idx_ptr, track_slot_ptr, track_chunk_ptr,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BK: tl.constexpr, BV: tl.constexpr, TRACK: tl.constexpr):
    """Kernel 2, grid ``(⌈V/BV⌉, N, HV)``: :func:`scan_sequence` for every (V-tile, sequence,
    value head). ``TRACK``: whether the track slots and chunks are passed, or None."""
    scan_sequence(tl.program_id(0), tl.program_id(1), tl.program_id(2), k_hat_ptr, w_ptr, u_ptr,
                  gamma_ptr, v_new_ptr, h_ptr, pool_ptr, cu_ptr, chunk_off_ptr, state_idx_ptr,
                  track_slot_ptr, track_chunk_ptr, H, HV, K, V, BK, BV, TRACK)


def scan_outputs(u, NT, K, h=None):
    """What kernel 2 writes, allocated: ``(v_new`` like ``u [T, HV, V]``, ``h [NT, HV, K, V]``
    in u's dtype, or the given fp32 checkpoints ``h)``."""
    HV, V = u.shape[1:]
    return torch.empty_like(u), (torch.empty(NT, HV, K, V, device=u.device, dtype=u.dtype)
                                 if h is None else h)


def launch_scan(k_hat, w, u, gamma, state_pool, state_indices, meta, h=None,
                track_slots=None, track_chunks=None):
    """Kernel 2, the sequential pass; updates the pool and writes the tracked states when given
    ``track_slots, track_chunks``. Returns ``(v_new [T, HV, V], h [NT, HV, K, V])`` for
    :func:`~.output.launch_output`: ``h`` is the fp32 checkpoints to fill when given, else
    allocated in the storage dtype (u's)."""
    T, H, K = k_hat.shape
    HV, V = u.shape[1:]
    plan = prefill_plan(meta.N, meta.NT, HV, K, V)
    v_new, h = scan_outputs(u, meta.NT, K, h)
    chunk_scan_kernel[plan.scan_grid](
        k_hat, w, u, gamma, v_new, h, state_pool, meta.cu_seqlens, meta.chunk_offsets,
        state_indices, track_slots, track_chunks, H, HV, K, V, plan.BK, plan.scan_bv,
        track_slots is not None,
        num_warps=plan.scan_warps, num_stages=plan.scan_stages)
    return v_new, h
